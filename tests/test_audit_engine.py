"""tuner.audit_engine's step lines: each replay of a generative audit is judged as the capacity search
judges it (pure: measurements made up as tests/trial/test_generate.py makes them)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from trial.test_generate import SLA, step

from tuner.audit_engine import _say_step
from tuner.settings import StudySettings, TrafficSettings


def test_a_capacity_step_the_engine_falls_behind_in_is_said_to_fail_as_the_search_judges_it(capsys):
    # the traffic's average: 4 requests of 10 output tokens a second at speed 1 (test_generate's MEAN_TPS)
    traffic = pd.DataFrame({"timestamp": np.arange(400) / 4, "prompt_tokens": 5, "output_tokens": 10})
    settings = StudySettings(name="s", model_repository=".", model="m", sla=SLA,
                             traffic=TrafficSettings(path="t.csv", speed=2.0))
    say = _say_step(settings, traffic)
    say(step(3.0))  # streamed 100 of the 120 tokens/s the traffic offers there: its latency alone still met
    line = capsys.readouterr().err
    assert line.startswith("  replay at speed 3.00: ") and "fell behind" in line and ": ok" not in line, line
    say(step(2.0))  # the recorded load, kept up with: ok
    assert capsys.readouterr().err.rstrip().endswith(": ok")


def test_the_replay_at_the_recorded_load_is_said_as_its_record_is_judged(capsys):
    """The load's line uses `load_check`, as the audit's record is judged: an engine behind the recorded
    load fails it there too, a window too short to tell is judged by its latency, and a replay the load
    generator sent late is said to have no verdict."""
    import dataclasses

    traffic = pd.DataFrame({"timestamp": np.arange(400) / 4, "prompt_tokens": 5, "output_tokens": 10})
    settings = StudySettings(name="s", model_repository=".", model="m", sla=SLA,
                             traffic=TrafficSettings(path="t.csv", speed=3.0))
    say = _say_step(settings, traffic)
    behind = step(3.0)
    say(behind)  # at the load: 100 of the 120 output tokens/s streamed
    line = capsys.readouterr().err
    assert line.startswith("  replay at speed 3.00: ") and "fell behind" in line and ": ok" not in line, line
    # the same requests living 4 s each: a 5-s window is under two lives, too short to tell an engine that
    # falls behind, and the load is judged by its latency alone (a capacity step's line would fail it)
    say(dataclasses.replace(behind, e2es_ms=np.full(len(behind.e2es_ms), 4000.0)))
    assert capsys.readouterr().err.rstrip().endswith(": ok")
    say(dataclasses.replace(behind, valid=False, invalid_reason="send lag p99 9.0 ms > budget 5 ms"))
    line = capsys.readouterr().err
    assert "no verdict, send lag p99 9.0 ms > budget 5 ms" in line and "fell behind" not in line, line
