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
