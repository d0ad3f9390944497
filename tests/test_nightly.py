"""The nightly job's own logic: settings, lock, history, drift, decision rule, run directory, and
one night in order over an injected engine (the real server and replay: test_nightly_server.py)."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.errors import (
    EXIT_ACT,
    EXIT_OK,
    EXIT_SLA_UNMET,
    ConfigError,
    OutputError,
    SettingsError,
    TrafficError,
    TunerError,
)
from tuner.nightly import drift, history, intake, lock, rundir, summary
from tuner.nightly import rule as d
from tuner.nightly.engine import to_arm
from tuner.nightly.job import SearchResult, run_night
from tuner.nightly.settings import load_nightly
from tuner.traffic import synth_bursty, synth_poisson, write_traffic

CONFIG = """# serving config of sim: owned by the serving team
name: "sim"
backend: "python"
max_batch_size: 4
dynamic_batching { max_queue_delay_microseconds: 0 }
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


def run_dirs(output: Path) -> list[Path]:
    """The published run directories under `<output>/runs`."""
    runs = output / rundir.RUNS
    return [p for p in runs.iterdir() if p.is_dir()] if runs.is_dir() else []


# --- decision rule ---------------------------------------------------------------------------------


def R(arm, rpd, ok=True, valid=True, note=""):
    return d.ArmResult(arm=arm, meets_sla=ok, per_dollar=rpd, latency_ms=10.0, valid=valid, note=note)


def test_under_capacity_scoring_a_change_needs_the_brackets_apart_by_the_margin():
    """Capacities known to a bracket a tolerance (30 %) wide: a candidate one step above production in
    every pair (+30 %, as two searches on one grid of speeds read whatever the true gap) is not confirmed;
    two steps apart is. The gains reported stay score against score."""
    def arm(name, rpd):
        return dataclasses.replace(R(name, rpd), per_dollar_upper=rpd * 1.3)

    one_step = [(arm("production", 100.0), arm("candidate", 130.0))] * 3
    for rule in d.RULES:
        got = d.decide(one_step, margin=0.05, rule=rule)
        assert got.decision == "keep" and "against the top of production's capacity bracket" in got.reason, got
        assert got.gains == pytest.approx((0.3, 0.3, 0.3)) and "+0.0%" in got.reason
        got = d.decide([(arm("production", 100.0), arm("candidate", 169.0))] * 3, margin=0.05, rule=rule)
        assert got.decision == "change" and "+30.0%" in got.reason and got.gains == pytest.approx((0.69,) * 3)
    # without brackets (utilization scoring) the rule reads the scores, as before
    assert d.decide([(R("production", 100.0), R("candidate", 130.0))] * 3).decision == "change"



def test_a_change_judged_against_productions_bracket_top_shows_that_top_beside_its_figure():
    # the reason's +30.0 % is 169 over 130, production's bracket top: the table a reviewer reads holds 130
    def arm(name, rpd):
        return dataclasses.replace(R(name, rpd), per_dollar_upper=rpd * 1.3)

    pairs = [(arm("production", 100.0), arm("candidate", 169.0))] * 3
    got = d.decide(pairs, margin=0.05, rule="all_replays")
    assert "its worst replay over production's best, production's at the top of its capacity bracket: +30.0%" \
        in got.reason, got.reason
    table = summary.confirmation_table(pairs)
    assert table.startswith("| pair | production req/$ | production req/$ (bracket top) | candidate req/$ | gain |")
    assert "| 1 | 100 | 130 | 169 | +69.0% |" in table, table
    assert "(bracket top)" not in summary.confirmation_table([(R("production", 100.0), R("candidate", 130.0))])


def test_a_confirmation_replay_under_capacity_scoring_carries_its_brackets_top():
    from tuner.trial import MEASURED, Bracket, TrialRecord

    record = TrialRecord(params={"max_batch_size": 8}, outcome=MEASURED, sla_met=True, violation=-1.0,
                         capacity=Bracket(rps=100.0, speed=1.0, upper_rps=130.0, upper_speed=1.3),
                         scores={"capacity": 50.0, "utilization": 40.0})
    assert to_arm(record, "candidate", "capacity", percentile=99).per_dollar_upper == pytest.approx(65.0)
    assert to_arm(record, "candidate", "utilization", percentile=99).per_dollar_upper is None
    open_ended = dataclasses.replace(record, capacity=Bracket(rps=100.0, speed=1.0))  # no speed failed
    assert to_arm(open_ended, "candidate", "capacity", percentile=99).per_dollar_upper is None


def test_a_confirmation_replay_under_an_sla_on_the_slowest_request_carries_the_max():
    from tuner.trial import MEASURED, Figures, TrialRecord

    record = TrialRecord(params={"max_batch_size": 8}, outcome=MEASURED, sla_met=True, violation=-1.0,
                         at_load=Figures(latency_ms={"p99": 40.0, "max": 55.0}),
                         scores={"capacity": 50.0, "utilization": 40.0})
    assert to_arm(record, "candidate", "capacity", percentile=99).latency_ms == 40.0
    assert to_arm(record, "candidate", "capacity", percentile=100).latency_ms == 55.0


def test_every_pair_needs_the_margin_in_every_pair():
    pairs = [(R("production", 100), R("candidate", 110)) for _ in range(3)]
    got = d.decide(pairs, margin=0.05, rule="every_pair")
    assert (got.decision, got.exit_code) == ("change", EXIT_ACT)
    assert got.gains == pytest.approx((0.10, 0.10, 0.10))
    # a big average gain with one pair below the margin is not enough
    pairs[1] = (R("production", 100), R("candidate", 104))
    got = d.decide(pairs + [(R("production", 100), R("candidate", 300))], margin=0.05, rule="every_pair")
    assert got.decision == "keep" and "pair 2" in got.reason and got.exit_code == EXIT_OK


def test_all_replays_compares_the_worst_candidate_with_the_best_production():
    # every pair wins by 10%+, but production's best replay is within 5% of the candidate's worst
    pairs = [(R("production", 100), R("candidate", 120)), (R("production", 112), R("candidate", 125)),
             (R("production", 90), R("candidate", 115))]
    assert d.decide(pairs, rule="every_pair").decision == "change"
    got = d.decide(pairs)
    assert got.decision == "keep" and "+2.7%" in got.reason
    pairs[1] = (R("production", 105), R("candidate", 125))
    got = d.decide(pairs)
    assert got.decision == "change" and "+9.5%" in got.reason


def test_candidate_breaking_the_sla_once_is_kept_out():
    pairs = [(R("production", 100), R("candidate", 200)) for _ in range(3)]
    pairs[2] = (R("production", 100), R("candidate", 200, ok=False, note="p99 80 ms > 50 ms"))
    got = d.decide(pairs)
    assert got.decision == "keep" and "pair 3" in got.reason and "p99 80 ms" in got.reason
    assert got.exit_code == EXIT_OK


def test_neither_meeting_the_sla_is_unmeetable():
    pairs = [(R("production", 100, ok=False), R("candidate", 200, ok=False)) for _ in range(3)]
    got = d.decide(pairs)
    assert got.exit_code == EXIT_SLA_UNMET and got.reason.startswith("SLA unmeetable")


def test_production_failing_but_candidate_meeting_is_a_change():
    pairs = [(R("production", None, ok=False), R("candidate", 50)) for _ in range(3)]
    got = d.decide(pairs)
    assert got.decision == "change" and all(math.isinf(g) for g in got.gains)


def test_an_unmeasured_pair_is_left_out_and_too_few_measured_pairs_keep():
    pairs = [(R("production", 100), R("candidate", 200)) for _ in range(4)]
    pairs[1] = (R("production", 100), R("candidate", 200, valid=False, note="send lag"))
    decided = d.decide(pairs, min_pairs=3)  # three pairs measured: the rule decides on them
    assert decided.decision == "change" and len(decided.gains) == 3
    assert d.pair_gains(pairs)[1] is None and d.pair_gains(pairs)[0] == pytest.approx(1.0)
    kept = d.decide(pairs[:3], min_pairs=3)
    assert kept.decision == "keep" and "2 of 3 pairs measured" in kept.reason and "pair(s) 2 could not" in kept.reason
    assert d.decide(pairs[:2]).decision == "keep"
    table = summary.confirmation_table(pairs)
    assert "| 2 | - | - | unmeasured |" in table


# --- drift -----------------------------------------------------------------------------------------


def test_same_traffic_does_not_drift_and_doubled_bursty_traffic_does():
    night = synth_poisson(20, 120, seed=1)
    same = drift.drift_table(night, synth_poisson(20, 120, seed=2))
    assert drift.drifted(same) == []
    busy = drift.drift_table(night, synth_bursty(40, 120, seed=0))
    moved = drift.drifted(busy)
    assert "rate_rps" in moved and "interarrival_cv" in moved and "peak_rps_1s" in moved
    rate = busy.set_index("metric").loc["rate_rps"]
    assert rate["change"] == pytest.approx(1.0, abs=0.25)  # bursts make the realised rate vary
    first = drift.drift_table(None, night)
    assert not first["drift"].any() and first["previous"].isna().all()
    assert "rate_rps" in drift.format_drift(busy) and "**drift**" in drift.to_markdown(busy)


def test_size_distribution_drift_is_a_ks_distance():
    a = synth_poisson(20, 60, seed=1).assign(seq_len=100)
    b = synth_poisson(20, 60, seed=1).assign(seq_len=400)
    table = drift.drift_table(a, b).set_index("metric")
    assert table.loc["seq_len_ks", "current"] == 1.0 and table.loc["seq_len_ks", "drift"]
    assert drift.ks_distance([1, 2, 3], [1, 2, 3]) == 0.0


# --- history, lock, run directory ------------------------------------------------------------------


def test_history_appends_and_skips_a_torn_line(tmp_path):
    history.append_night(
        tmp_path,
        {
            "night": "n1",
            "decision": "keep",
            "exit_code": 0,
            "production": {"max_batch_size": 4},
            "gain": None,
        },
    )
    with open(history.history_path(tmp_path), "a") as f:
        f.write('{"night": "torn", "deci')  # a run killed inside the write
    history.append_night(
        tmp_path,
        {
            "night": "n2",
            "decision": "change",
            "exit_code": 10,
            "gain": 0.12,
            "candidate": {"max_batch_size": 8},
            "drifted": ["rate_rps"],
        },
    )
    nights = history.read_history(tmp_path)
    assert [n["night"] for n in nights] == ["n1", "n2"]
    table = history.format_history(nights)
    assert "+12.0%" in table and "batch 8" in table and "rate_rps" in table
    assert history.format_history([]) == "no nights recorded yet"


def test_corrupt_history_lines_are_skipped_and_said_with_their_line_numbers(tmp_path, capsys):
    history.append_night(tmp_path, {"night": "n1", "decision": "keep"})
    with open(history.history_path(tmp_path), "a") as f:
        f.write("not json\n[1, 2]\n")  # an edit, and a line that is JSON but not a night
    history.append_night(tmp_path, {"night": "n2", "decision": "keep"})
    assert [n["night"] for n in history.read_history(tmp_path)] == ["n1", "n2"]
    err = capsys.readouterr().err
    assert err == (f"tuner: warning: {history.history_path(tmp_path)}: skipped 2 line(s) that are not a night's "
                   "JSON record (line 2, 3: torn by a killed run, or edited); read 2 night(s)\n")
    # the history table says it too, and a clean history says nothing
    nightly = _write_setup(tmp_path / "setup")
    out = tmp_path / "setup" / "out"
    out.mkdir()
    history.history_path(out).write_text(history.history_path(tmp_path).read_text())
    assert main(["nightly", "--history", str(nightly)]) == 0
    assert "skipped 2 line(s)" in capsys.readouterr().err
    history.history_path(out).write_text('{"night": "n1"}\n')
    assert history.read_history(out) == [{"night": "n1"}] and capsys.readouterr().err == ""


def test_the_nightly_search_does_not_print_optunas_info_line(tmp_path):
    import optuna

    from tuner.nightly.engine import RealEngine
    from tuner.settings import read_study
    from tuner.trial import MEASURED, TrialRecord

    _write_setup(tmp_path)
    write_traffic(synth_poisson(20, 60, seed=0), tmp_path / "traffic" / "night.csv")
    study = read_study(tmp_path / "study.yaml")

    def evaluate(params, hints):
        return TrialRecord(params=dict(params), outcome=MEASURED, sla_met=True, violation=-1.0,
                           scores={"capacity": 10.0, "utilization": None})

    class Lines(logging.Handler):  # what Optuna's own stderr handler would print
        def __init__(self):
            super().__init__()
            self.lines = []

        def emit(self, record):
            self.lines.append(record.getMessage())

    seen = Lines()
    logging.getLogger("optuna").addHandler(seen)
    verbosity = optuna.logging.get_verbosity()
    try:
        found = RealEngine(study, evaluate).search([PROD], 1, tmp_path / "work", production=PROD)
    finally:
        logging.getLogger("optuna").removeHandler(seen)
    assert found.trials == 2
    assert not [line for line in seen.lines if "A new study created" in line], seen.lines
    assert optuna.logging.get_verbosity() == verbosity  # restored after


def test_the_nightly_search_starts_no_trial_after_its_time_limit(tmp_path, monkeypatch):
    """search.timeout_s as Optuna's timeout: the trial running when it passes finishes, no other starts.
    Each trial takes 10 s of a fake clock, which the search loop reads."""
    import types

    from tuner.nightly import engine as engine_mod
    from tuner.nightly.engine import RealEngine
    from tuner.search import _loop
    from tuner.settings import read_study
    from tuner.trial import MEASURED, TrialRecord

    _write_setup(tmp_path)
    study = read_study(tmp_path / "study.yaml")
    clock = {"now": 0.0}

    def no_sleep(seconds):
        pytest.fail("a single search waits for no other worker")

    fake_time = types.SimpleNamespace(monotonic=lambda: clock["now"], sleep=no_sleep)
    for module in (_loop, engine_mod):
        monkeypatch.setattr(module, "time", fake_time)
    starts: list[float] = []

    def evaluate(params, hints):
        starts.append(clock["now"])
        clock["now"] += 10.0
        return TrialRecord(params=dict(params), outcome=MEASURED, sla_met=True, violation=-1.0,
                           scores={"capacity": 10.0, "utilization": None})

    found = RealEngine(study, evaluate).search([PROD], 5, tmp_path / "limited", production=PROD, timeout_s=25)
    assert starts == [0.0, 10.0, 20.0]  # the third ran past 25 s and finished; the fourth never started
    assert found.trials == 3 and found.timed_out
    clock["now"], starts[:] = 0.0, []
    found = RealEngine(study, evaluate).search([PROD], 5, tmp_path / "unlimited", production=PROD)
    assert len(starts) == 6 and found.trials == 6 and not found.timed_out
    clock["now"], starts[:] = 0.0, []
    found = RealEngine(study, evaluate).search([PROD], 1, tmp_path / "in_time", production=PROD, timeout_s=25)
    assert starts == [0.0, 10.0] and not found.timed_out  # every planned trial ran: the limit stopped nothing


def test_a_night_its_time_limit_stopped_says_so(tmp_path, capsys):
    nightly = _write_setup(tmp_path)
    nightly.write_text(nightly.read_text().replace("search: {trials: 3}", "search: {trials: 3, timeout_s: 5}"))

    class Stopped(TableEngine):
        def search(self, enqueue, trials, workdir, *, production, timeout_s=None):
            found = super().search(enqueue, trials, workdir, production=production, timeout_s=timeout_s)
            return dataclasses.replace(found, trials=1, timed_out=True)

    engine = Stopped({4: 100.0, 16: 130.0}, BEST)
    night = _night(tmp_path, engine)
    assert engine.timeout_s == 5
    assert night.entry["search_timeout_s"] == 5 and night.entry["search_timed_out"] is True
    assert json.loads((night.run_dir / "decision.json").read_text())["search_timed_out"] is True
    assert ("- search: stopped by its time limit (search.timeout_s 5 s) after 1 of 4 trials; no trial started "
            "after it") in (night.run_dir / "summary.md").read_text()
    assert main(["nightly", str(nightly), "--check"]) == 0
    assert "3 trials after last night's best and production's, none started after 5 s" in capsys.readouterr().out


def test_second_run_is_refused_while_the_first_holds_the_lock(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import sys, time
        from tuner.nightly.lock import run_lock
        with run_lock({str(tmp_path)!r}):
            print("held", flush=True)
            time.sleep(60)
        """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(lock.LockedError, match=f"pid {holder.pid}"):
            with lock.run_lock(tmp_path):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with lock.run_lock(tmp_path):  # the kernel released the dead holder's lock
        pass


def test_publish_is_a_rename_and_latest_follows(tmp_path):
    stamp = rundir.night_stamp(datetime(2026, 11, 30, 2, 0, tzinfo=UTC))
    assert stamp == "2026-11-30T020000Z"
    for expected in (stamp, stamp + "-2"):
        staging = rundir.staging_dir(tmp_path, stamp)
        (staging / "summary.md").write_text(expected)
        final = rundir.publish(staging, tmp_path, stamp)
        assert final.name == expected and not staging.exists()
        assert (tmp_path / "latest" / "summary.md").read_text() == expected
    rundir.staging_dir(tmp_path, "x")
    assert len(rundir.clear_stale_staging(tmp_path)) == 1


# --- intake and settings ---------------------------------------------------------------------------


def test_newest_hours_of_a_directory(tmp_path):
    old = synth_poisson(5, 3600, seed=1)
    new = synth_poisson(5, 3600, seed=2)
    new["timestamp"] += 7200
    write_traffic(old, tmp_path / "a.csv")
    write_traffic(new, tmp_path / "b.parquet")
    (tmp_path / "notes.txt").write_text("not traffic")
    table, files = intake.newest_traffic(tmp_path, hours=1.0)
    assert [f.name for f in files] == ["a.csv", "b.parquet"]
    assert table["timestamp"].min() >= new["timestamp"].max() - 3600
    assert len(table) == pytest.approx(len(new), rel=0.01)
    with pytest.raises(TrafficError, match="no traffic files"):
        intake.newest_traffic(tmp_path, 1.0, pattern="*.xyz")


def test_a_directory_of_triton_traces_keeps_the_study_model(tmp_path):
    trace = Path(__file__).parent / "data" / "triton_trace_timestamps.json"
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "trace.json").write_text(trace.read_text())
    table, files = intake.newest_traffic(tmp_path / "traces", hours=24, model="echo_a")
    assert len(files) == 1 and "model" not in table.columns and 0 < len(table) < 18
    with pytest.raises(TrafficError, match="no requests for model 'sim'"):
        intake.newest_traffic(tmp_path / "traces", hours=24, model="sim")


def test_a_trace_of_several_models_keeps_the_study_models_shape_columns(tmp_path):
    # imported whole, the trace kept only the columns every model's requests had: none
    def request(trace_id, model, ns, name, shape):
        return [{"id": trace_id, "model_name": model, "model_version": 1},
                {"id": trace_id, "timestamps": [{"name": "HTTP_RECV_START", "ns": ns}]},
                {"id": trace_id, "activity": "TENSOR_QUEUE_INPUT", "tensor": {"name": name, "shape": shape}}]
    entries = (request(1, "bert", 1_000_000_000, "INPUT_IDS", "4,64") + request(2, "resnet", 2_000_000_000, "IMAGE", "2,3")
               + request(3, "bert", 3_000_000_000, "INPUT_IDS", "1,128"))
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "a.json").write_text(json.dumps(entries))
    (tmp_path / "traces" / "b.json").write_text(json.dumps(request(9, "resnet", 4_000_000_000, "IMAGE", "1,3")))
    table, files = intake.newest_traffic(tmp_path / "traces", hours=24, model="bert")
    assert len(files) == 2 and table["INPUT_IDS:0"].tolist() == [64, 128] and table["batch_size"].tolist() == [4, 1]


def _patched(text: str, diff: str) -> str:
    """`text` with the unified `diff` applied, as `patch` would: each hunk's old lines must be there."""
    lines, out, at = text.splitlines(), [], 0
    for hunk in re.split(r"^@@ ", diff, flags=re.M)[1:]:
        start = int(re.match(r"-(\d+)", hunk).group(1)) - 1
        out.extend(lines[at:start])
        at = start
        for line in hunk.splitlines()[1:]:
            if line.startswith((" ", "-")):
                assert lines[at] == line[1:], (lines[at], line)  # the hunk does not apply
                at += 1
            if line.startswith((" ", "+")):
                out.append(line[1:])
    return "\n".join(out + lines[at:]) + "\n"


def _write_setup(tmp_path: Path, yaml_extra: str = "") -> Path:
    repo = tmp_path / "repo" / "sim"
    repo.mkdir(parents=True)
    (repo / "config.pbtxt").write_text(CONFIG)
    (tmp_path / "traffic").mkdir()
    (tmp_path / "study.yaml").write_text(
        textwrap.dedent("""
        name: sim-study
        model_repository: repo
        model: sim
        traffic: {path: traffic}
        sla: {latency_ms: 50}
        """)
    )
    (tmp_path / "nightly.yaml").write_text(
        textwrap.dedent("""
        study: study.yaml
        traffic: {path: traffic, hours: 1}
        output: out
        search: {trials: 3}
        """)
        + yaml_extra
    )
    return tmp_path / "nightly.yaml"


def test_settings_resolve_paths_and_name_bad_keys(tmp_path):
    s = load_nightly(_write_setup(tmp_path))
    assert s.output == str(tmp_path / "out") and s.confirm.pairs == 3 and s.confirm.margin == 0.05
    (tmp_path / "bad.yaml").write_text("study: s.yaml\ntraffic: {path: t}\nconfirm: {pairs: 2}\n")
    with pytest.raises(SettingsError, match="confirm.pairs: must be >= 3"):
        load_nightly(tmp_path / "bad.yaml")
    (tmp_path / "bad.yaml").write_text("study: s.yaml\ntraffic: {path: t, hourz: 3}\n")
    with pytest.raises(SettingsError, match=r"traffic.hourz: unknown key"):
        load_nightly(tmp_path / "bad.yaml")


# --- one night in order, over an engine with known answers -----------------------------------------


class TableEngine:
    """Requests per dollar from a table keyed by max_batch_size; what ran is kept for the asserts."""

    def __init__(self, rpd: dict[int, float], best: dict | None, kill_in_replay: bool = False,
                 confirm_rpd: dict[int, float] | None = None):
        self.rpd, self.best, self.kill = rpd, best, kill_in_replay
        self.confirm_rpd = confirm_rpd or rpd
        self.enqueued: list[dict] = []
        self.replays: list[str] = []
        self.timeout_s = None

    def search(self, enqueue, trials, workdir, *, production, timeout_s=None):
        self.enqueued, self.timeout_s = enqueue, timeout_s
        return SearchResult(
            self.best,
            self.rpd.get(self.best["max_batch_size"]) if self.best else None,
            trials + len(enqueue),
            1 if self.best else 0,
            self.rpd.get(production["max_batch_size"]),
        )

    def replay(self, params, arm):
        if self.kill:
            os.kill(os.getpid(), signal.SIGKILL)
        self.replays.append(arm)
        return d.ArmResult(arm=arm, meets_sla=True, per_dollar=self.confirm_rpd[params["max_batch_size"]], latency_ms=5.0)


def _factory(engine):
    @contextmanager
    def factory(study, production, traffic_path, *, staging, **kw):
        assert traffic_path.is_file() and kw.get("engine") is None  # an encoder: no engine arguments
        yield engine

    return factory


def _night(tmp_path, engine, rate=20.0, day=0, bursty=False, seed=None):
    traffic = (synth_bursty if bursty else synth_poisson)(rate, 300, seed=day if seed is None else seed)
    write_traffic(traffic, tmp_path / "traffic" / "night.csv")
    when = datetime(2026, 11, 30, 2, 0, tzinfo=UTC) + timedelta(days=day)
    return run_night(load_nightly(tmp_path / "nightly.yaml"), _factory(engine), now=when)


BEST = {"max_batch_size": 16, "max_queue_delay_microseconds": 2000}
PROD = {"max_batch_size": 4, "max_queue_delay_microseconds": 0}


def test_three_nights_over_a_known_engine(tmp_path):
    _write_setup(tmp_path)
    out = tmp_path / "out"
    e1 = TableEngine({4: 100.0, 16: 130.0}, BEST)
    n1 = _night(tmp_path, e1)
    assert n1.exit_code == 10 and e1.replays == ["production", "candidate"] * 3
    assert e1.enqueued == [PROD]
    proposed = (n1.run_dir / "proposed" / "config.pbtxt").read_text()
    assert "max_batch_size: 16" in proposed and "max_queue_delay_microseconds: 2000" in proposed
    assert "# serving config of sim: owned by the serving team" in proposed  # production's comments go on
    diff = (n1.run_dir / "proposed" / "config.diff").read_text()
    assert "+max_batch_size: 16" in diff
    # the diff applies to production's file as written (comments, `input [ {`), giving the proposal's body
    body = proposed.split("\n\n", 1)[1]  # after the header of comments the night writes
    assert _patched(CONFIG, diff) == body
    assert "**Decision: change**" in (n1.run_dir / "summary.md").read_text()
    assert os.path.realpath(out / "latest") == str(n1.run_dir)
    # night 2: nobody applied the proposal; the same change is not proposed again, no replays spent
    e2 = TableEngine({4: 100.0, 16: 130.0}, BEST)
    n2 = _night(tmp_path, e2, day=1)
    assert n2.exit_code == 0 and "not proposed again" in n2.decision.reason and e2.replays == []
    assert e2.enqueued == [BEST, PROD]  # warm start: last best, then production
    # night 3: production now runs the proposal (merged); busier traffic, a better candidate
    (tmp_path / "repo" / "sim" / "config.pbtxt").write_text(
        CONFIG.replace("max_batch_size: 4", "max_batch_size: 16").replace(
            "delay_microseconds: 0", "delay_microseconds: 2000"
        )
    )
    e3 = TableEngine({16: 100.0, 32: 110.0}, {"max_batch_size": 32, "max_queue_delay_microseconds": 4000},
                     confirm_rpd={16: 100.0, 32: 103.0})
    n3 = _night(tmp_path, e3, rate=40.0, day=2, bursty=True)
    # the search showed +10%, the confirmation only +3%: not enough
    assert n3.exit_code == 0 and "below the 5% margin" in n3.decision.reason and len(e3.replays) == 6
    assert "rate_rps" in n3.entry["drifted"]
    # night 4: the search itself shows less than the margin: no confirmation is spent
    e4 = TableEngine({16: 100.0, 32: 102.0}, {"max_batch_size": 32, "max_queue_delay_microseconds": 0})
    n4 = _night(tmp_path, e4, day=3)
    assert n4.exit_code == 0 and "no confirmation needed" in n4.decision.reason and e4.replays == []
    # night 5: a confirmation rejects a candidate; night 6, on the same traffic, the search's best is
    # that candidate again: not confirmed again; night 7, on drifted traffic, it is
    cand = {"max_batch_size": 32, "max_queue_delay_microseconds": 4000}
    e5 = TableEngine({16: 100.0, 32: 110.0}, cand, confirm_rpd={16: 100.0, 32: 101.0})
    n5 = _night(tmp_path, e5, day=4, seed=9)
    assert n5.exit_code == 0 and "below the 5% margin" in n5.decision.reason and len(e5.replays) == 6
    e6 = TableEngine({16: 100.0, 32: 110.0}, cand)
    n6 = _night(tmp_path, e6, day=5, seed=9)
    assert n6.exit_code == 0 and "not confirmed again" in n6.decision.reason and e6.replays == []
    e7 = TableEngine({16: 100.0, 32: 110.0}, cand)
    n7 = _night(tmp_path, e7, rate=80.0, day=6)
    assert n7.exit_code == 10 and len(e7.replays) == 6 and "rate_rps" in n7.entry["drifted"]
    nights = history.read_history(out)
    assert [n["exit_code"] for n in nights] == [10, 0, 0, 0, 0, 0, 10]
    assert len(run_dirs(out)) == 7


def test_unmeetable_and_same_as_production(tmp_path):
    _write_setup(tmp_path)
    assert _night(tmp_path, TableEngine({}, None)).exit_code == 3
    same = _night(tmp_path, TableEngine({4: 1.0}, dict(PROD)), day=1)
    assert same.exit_code == 0 and "still the best" in same.decision.reason


@pytest.mark.parametrize("config, message", [
    ("", "max_batch_size is 0: this model does not batch"),  # an empty file
    (CONFIG.replace('name: "sim"', 'name: "other"'), "names model 'other', not the study's 'sim'"),
])
def test_a_production_config_the_run_cannot_use_is_refused_by_the_check_and_the_run_alike(tmp_path, config, message):
    """Both refused before any server, in one line: not a traceback from the search, and not a night
    recorded as "SLA unmeetable" where every trial failed to load another model's config."""
    from tuner.nightly.job import check_night

    _write_setup(tmp_path, "production: prod.pbtxt\n")
    (tmp_path / "prod.pbtxt").write_text(config)
    write_traffic(synth_poisson(20.0, 300, seed=0), tmp_path / "traffic" / "night.csv")
    settings = load_nightly(tmp_path / "nightly.yaml")
    for attempt in (lambda: check_night(settings), lambda: run_night(settings, _factory(TableEngine({}, None)))):
        with pytest.raises(ConfigError, match=message) as exc:
            attempt()
        assert "\n" not in str(exc.value)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def _starts_nothing():
    """An engine factory a night must not reach: it fails the test if a server would start."""
    @contextmanager
    def factory(*args, **kw):
        raise AssertionError("a server was started for a night its check should have refused")
        yield

    return factory


@pytest.mark.parametrize("study_line, extra, message", [
    ("cost: {gpu: a999}\n", "", "cost.gpu: unknown GPU 'a999'"),
    ("", "study_overrides: {cost.gpu: l44}\n", "cost.gpu: unknown GPU 'l44'"),
    # a request above production's max_batch_size (4): what tune's check refuses, the night's too
    ("", "", "max_batch_size is 4, but the traffic has requests of 8 rows"),
])
def test_a_study_tune_would_refuse_is_refused_by_the_check_and_before_any_server(tmp_path, capsys, study_line,
                                                                                 extra, message):
    """`--check` checks the study as `tune --check` does (its price, the traffic as every replay takes it),
    so that it never says ok to a night the run then refuses after starting a server; and the run refuses
    it first, leaving no output directory, staging directory or lock."""
    nightly = _write_setup(tmp_path, extra)
    with open(tmp_path / "study.yaml", "a") as fh:
        fh.write(study_line)
    traffic = synth_poisson(20.0, 300, seed=0)
    if not study_line and not extra:
        traffic.loc[5, "batch_size"] = 8
    write_traffic(traffic, tmp_path / "traffic" / "night.csv")
    lines = []
    for args in (["--check"], []):
        assert main(["nightly", str(nightly), *args]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and message in err[0], err
        lines.append(err[0])
    assert lines[0] == lines[1]
    with pytest.raises(TunerError, match=message):
        run_night(load_nightly(nightly), _starts_nothing())
    assert not (tmp_path / "out").exists()


def test_a_night_refused_inside_leaves_no_staging_and_frees_the_lock(tmp_path):
    """Bad input found once the night holds the lock (Triton refusing a config): its staging directory is
    removed and the lock released; one whose server wrote a log keeps it (the error names the log)."""
    _write_setup(tmp_path)
    out = tmp_path / "out"

    class Refusing(TableEngine):
        def __init__(self, log_dir=None):
            super().__init__({}, None)
            self.log_dir = log_dir

        def search(self, enqueue, trials, workdir, *, production, timeout_s=None):
            if self.log_dir is not None:
                (workdir.parent / self.log_dir).mkdir()
                (workdir.parent / self.log_dir / "tritonserver.log").write_text("E refused\n")
            raise ConfigError("model 'sim': Triton refused the configuration: bad")

    with pytest.raises(ConfigError, match="Triton refused"):
        _night(tmp_path, Refusing())
    assert not list(out.glob(".staging-*")) and not run_dirs(out) and not history.read_history(out)
    with lock.run_lock(out):  # released: the next night may run
        pass
    with pytest.raises(ConfigError, match="Triton refused"):
        _night(tmp_path, Refusing(log_dir=rundir.SERVER_LOGS), day=1)
    kept = list(out.glob(".staging-*"))
    assert len(kept) == 1 and (kept[0] / rundir.SERVER_LOGS / "tritonserver.log").is_file()
    _night(tmp_path, TableEngine({4: 100.0, 16: 130.0}, BEST), day=2)  # the next night clears it
    assert not list(out.glob(".staging-*")) and len(history.read_history(out)) == 1


def test_a_run_killed_halfway_leaves_the_previous_night_intact(tmp_path):
    _write_setup(tmp_path)
    out = tmp_path / "out"
    _night(tmp_path, TableEngine({4: 100.0, 16: 130.0}, BEST))
    before = history.history_path(out).read_text()
    latest = os.path.realpath(out / "latest")
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_nightly import TableEngine, _night, BEST
        from pathlib import Path
        _night(Path({str(tmp_path)!r}), TableEngine({{4: 100.0, 32: 200.0}}, dict(BEST, max_batch_size=32), kill_in_replay=True), day=1)
        """)
    killed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert history.history_path(out).read_text() == before
    assert os.path.realpath(out / "latest") == latest and len(run_dirs(out)) == 1
    assert list(out.glob(".staging-*"))  # what the killed run left, cleared by the next run
    _night(tmp_path, TableEngine({4: 100.0, 16: 130.0}, BEST), day=2)
    assert not list(out.glob(".staging-*")) and len(history.read_history(out)) == 2


# --- the output directory: a night's own, or refused ----------------------------------------------

ALICE = '{"event": "deploy", "by": "alice"}\n'


def _tree(folder: Path) -> dict[str, bytes | str]:
    """Every entry under `folder`: a file's bytes, a link's target, a directory as "dir"."""
    return {str(p.relative_to(folder)): (os.readlink(p) if p.is_symlink() else "dir" if p.is_dir() else p.read_bytes())
            for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("name, make", [
    ("latest", lambda p: p.write_text("my notes\n")),
    ("latest", lambda p: p.symlink_to("../notes.txt")),  # a link, but not into runs/
    ("history.jsonl", lambda p: p.write_text(ALICE)),
    ("nightly.lock", lambda p: p.write_text("not a pid\n")),
    ("runs", lambda p: p.write_text("a file\n")),
    ("runs", lambda p: (p / "experiment-1").mkdir(parents=True)),  # someone's own runs: no night's decision
])
def test_a_file_of_a_nights_name_that_no_night_wrote_is_refused_by_the_check_and_the_run_alike(tmp_path, capsys, name, make):
    nightly = _write_setup(tmp_path)
    write_traffic(synth_poisson(20.0, 300, seed=0), tmp_path / "traffic" / "night.csv")
    out = tmp_path / "out"
    out.mkdir()
    make(out / name)
    before = _tree(out)
    assert main(["nightly", str(nightly), "--check"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0] == (f"tuner: error: output {out}: holds {name}, which tuner did not write "
                                        "there: name a new or empty directory (nothing was changed)")
    engine = TableEngine({4: 100.0, 16: 130.0}, BEST)
    with pytest.raises(OutputError) as exc:
        run_night(load_nightly(nightly), _factory(engine))
    assert f"tuner: error: {exc.value}" == err[0]  # the run says what --check said
    assert engine.enqueued == [] and _tree(out) == before  # nothing started, nothing of the user's touched


def test_the_users_latest_and_history_are_left_as_they_were(tmp_path, capsys):
    """The reviewer's case: both at once, named in one line; her notes and her history stay hers."""
    nightly = _write_setup(tmp_path)
    write_traffic(synth_poisson(20.0, 300, seed=0), tmp_path / "traffic" / "night.csv")
    out = tmp_path / "out"
    out.mkdir()
    (out / "latest").write_text("my notes\n")
    (out / "history.jsonl").write_text(ALICE)
    with pytest.raises(OutputError, match="holds history.jsonl, latest, which tuner did not write"):
        run_night(load_nightly(nightly), _factory(TableEngine({4: 100.0, 16: 130.0}, BEST)))
    assert _tree(out) == {"history.jsonl": ALICE.encode(), "latest": b"my notes\n"}
    assert main(["nightly", str(nightly), "--check"]) == 2 and "holds history.jsonl, latest" in capsys.readouterr().err


def test_a_directory_nights_made_is_accepted_night_after_night(tmp_path, capsys):
    from tuner.nightly.job import OUTPUT_NAMES

    nightly = _write_setup(tmp_path)
    out = tmp_path / "out"
    _night(tmp_path, TableEngine({4: 100.0, 16: 130.0}, BEST))
    assert sorted(p.name for p in out.iterdir()) == ["history.jsonl", "latest", "nightly.lock", "runs"]
    assert all(OUTPUT_NAMES[p.name](p) for p in out.iterdir())
    assert main(["nightly", str(nightly), "--check"]) == 0
    capsys.readouterr()
    # a torn last line and a hand edit leave the history a night's; the next night runs on
    with open(history.history_path(out), "a") as fh:
        fh.write('not json\n{"night": "torn", "deci')
    _night(tmp_path, TableEngine({4: 100.0, 16: 130.0}, BEST), day=1)
    assert len(run_dirs(out)) == 2 and len(history.read_history(out)) == 2
    # what a night leaves before it has written anything: an empty lock, history and runs/
    fresh = tmp_path / "fresh"
    (fresh / "runs").mkdir(parents=True)
    for name in ("nightly.lock", "history.jsonl"):
        (fresh / name).write_text("")
    assert all(OUTPUT_NAMES[p.name](p) for p in fresh.iterdir())


@pytest.mark.parametrize("make, message", [
    (lambda out: out.write_text("x\n"), "exists and is not a directory"),
    (lambda out: (out / "nightly.lock").mkdir(parents=True), "holds nightly.lock, which tuner did not write"),
])
def test_an_output_the_night_cannot_write_is_one_line_in_the_run_as_in_the_check(tmp_path, capsys, make, message):
    """Not a FileExistsError or IsADirectoryError traceback from the run while --check says it in one line."""
    nightly = _write_setup(tmp_path)
    write_traffic(synth_poisson(20.0, 300, seed=0), tmp_path / "traffic" / "night.csv")
    make(tmp_path / "out")
    lines = []
    for args in (["--check"], []):  # the run is refused before any server starts
        assert main(["nightly", str(nightly), *args]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and message in err[0], err
        lines.append(err[0])
    assert lines[0] == lines[1] and lines[0].startswith(f"tuner: error: output {tmp_path / 'out'}: {message}")


def test_a_lock_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "out" / lock.LOCK_NAME).mkdir(parents=True)
    with pytest.raises(OutputError, match=r"nightly.lock: cannot make the nightly lock \(Is a directory\)$"):
        with lock.run_lock(tmp_path / "out"):
            pass
    (tmp_path / "file").write_text("x\n")
    with pytest.raises(OutputError, match=r"file/nightly.lock: cannot make the nightly lock \(File exists\)$"):
        with lock.run_lock(tmp_path / "file"):
            pass
    assert (tmp_path / "file").read_text() == "x\n"


# --- command line ----------------------------------------------------------------------------------


def test_cli_history_table_and_bad_input(tmp_path, capsys):
    nightly = _write_setup(tmp_path)
    _night(tmp_path, TableEngine({4: 100.0, 16: 130.0}, BEST))
    assert main(["nightly", "--history", str(nightly)]) == 0
    out = capsys.readouterr().out
    assert "change" in out and "batch 16" in out and "night" in out
    # the price every score of the night divides by is kept with it (the study's: the CPU default here)
    from tuner.cost import price_for
    from tuner.settings import read_study

    price = price_for(read_study(tmp_path / "study.yaml").cost).price_per_hour
    (night,) = history.read_history(tmp_path / "out")
    assert night["price_per_hour"] == price and f" {price:g} $/h " in out, out
    older = {k: v for k, v in night.items() if k != "price_per_hour"}  # a night from before prices were kept
    assert history.history_table([older])["price"].tolist() == ["-"]
    assert main(["nightly", "--history", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    # a directory of other things is not a nightly output: an empty history would read as healthy
    assert main(["nightly", "--history", str(tmp_path / "traffic")]) == 2
    err = capsys.readouterr().err
    assert "traffic: not a nightly output directory (no history.jsonl; it holds " in err and err.count("\n") == 1
    (tmp_path / "empty").mkdir()  # a new output, before its first night
    assert main(["nightly", "--history", str(tmp_path / "empty")]) == 0
    assert "no nights recorded yet" in capsys.readouterr().out
    (tmp_path / "broken.yaml").write_text("study: [\n")
    assert main(["nightly", str(tmp_path / "broken.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tuner: error: ") and "broken.yaml" in err and "Traceback" not in err
    bad = json.dumps({"study": "study.yaml", "traffic": {"path": "nowhere"}, "output": "out"})
    (tmp_path / "bad.yaml").write_text(bad)
    assert main(["nightly", str(tmp_path / "bad.yaml")]) == 2
    assert "nowhere" in capsys.readouterr().err


def test_a_textfile_is_refused_over_an_input_a_users_file_or_in_the_model_before_the_night(tmp_path, capsys,
                                                                                           monkeypatch):
    """--textfile follows audit's rules, checked before the night starts (and in --check, --history): never
    over the traffic or into the model's directory; a file tuner did not write only with --force; the
    textfile tuner wrote is replaced night after night without it."""
    import tuner.nightly.engine

    nightly = _write_setup(tmp_path)
    _night(tmp_path, TableEngine({4: 100.0, 16: 130.0}, BEST))
    capsys.readouterr()
    monkeypatch.setattr(tuner.nightly.engine, "real_engine", _starts_nothing())
    mine = tmp_path / "user.json"
    mine.write_text('{"mine": 1}\n')
    traffic = tmp_path / "traffic" / "night.csv"
    for target, why in [(traffic, "the same file as tonight's traffic"),
                        (mine, "exists and tuner did not write it: give --force"),
                        (tmp_path / "repo" / "sim" / "n.prom", "in the model's directory")]:
        before = target.read_bytes() if target.exists() else None
        for args in ([], ["--check"], ["--history"]):
            code = main(["nightly", str(nightly), *args, "--textfile", str(target)])
            out, err = capsys.readouterr()
            assert code == 2 and out == "" and err.count("\n") == 1, out + err
            assert err.startswith(f"tuner: error: --textfile {target}: ") and why in err, err
            assert (target.read_bytes() if target.exists() else None) == before
    assert len(run_dirs(tmp_path / "out")) == 1  # no second night started
    assert main(["nightly", "--history", str(nightly), "--textfile", str(mine), "--force"]) == 0
    assert mine.read_text().startswith("# HELP tuner_nightly_")
    assert main(["nightly", "--history", str(nightly), "--textfile", str(mine)]) == 0


def test_a_textfile_the_next_night_would_read_as_traffic_is_refused(tmp_path, capsys):
    # tonight's traffic is another directory than the study's: a new metrics.csv there was accepted, and
    # the next night failed on it ("not a readable CSV table")
    nightly = _write_setup(tmp_path)
    (tmp_path / "recorded").mkdir()
    study = tmp_path / "study.yaml"
    study.write_text(study.read_text().replace("traffic: {path: traffic}", "traffic: {path: recorded}"))
    target = tmp_path / "traffic" / "metrics.csv"
    for args in (["--check"], ["--history"]):
        assert main(["nightly", str(nightly), *args, "--textfile", str(target)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"tuner: error: --textfile {target}: among tonight's traffic files") and \
            err.count("\n") == 1, err
    assert not target.exists()
    assert main(["nightly", str(nightly), "--history", "--textfile", str(tmp_path / "traffic" / "m.prom")]) == 0


def test_check_with_history_is_refused_in_one_line(tmp_path, capsys):
    """--history checks nothing: a --check beside it is refused, not ignored with exit 0."""
    nightly = _write_setup(tmp_path)
    for args in (["--history", "--check", str(nightly)], ["--check", "--history", str(nightly)]):
        assert main(["nightly", *args]) == 2
        captured = capsys.readouterr()
        err = captured.err.splitlines()
        assert len(err) == 1 and err[0].startswith("tuner: error: --check: ") and "--history" in err[0], err
        assert captured.out == ""
    assert not (tmp_path / "out").exists()


def test_study_overrides_and_the_shipped_example(tmp_path):
    from tuner.nightly.settings import read_study_for

    nightly = _write_setup(tmp_path, "study_overrides: {server.launcher: docker, search.trials: 5}\n")
    study = read_study_for(load_nightly(nightly))
    assert study.server.launcher == "docker" and study.search.trials == 5
    bad = _write_setup(tmp_path / "b", "study_overrides: {sla.latncy_ms: 5}\n")
    with pytest.raises(SettingsError, match="study_overrides: .*sla.latncy_ms"):
        read_study_for(load_nightly(bad))
    root = Path(__file__).parent.parent
    example = load_nightly(root / "examples" / "nightly.yaml")
    assert example.study_overrides["server.launcher"] == "docker" and example.confirm.pairs >= 3
    import yaml
    job = yaml.safe_load((root / "deploy" / "cronjob.yaml").read_text())
    assert job["kind"] == "CronJob" and job["spec"]["concurrencyPolicy"] == "Forbid"
    assert "nightly" in (root / "deploy" / "crontab").read_text()


def test_study_overrides_keep_yamls_values_and_name_a_misspelt_key(tmp_path):
    """Each override is read as the study file's own value would be: null resets a nullable key (and is
    refused, as null, by one that is not), a quoted "007" stays text, a mapping is a section; a misspelt
    key gets the study file's `did you mean`."""
    from tuner.nightly.settings import read_study_for

    overrides = 'study_overrides: {search.timeout_s: null, name: "007", traffic.speed: 2, sla: {latency_ms: 80}}\n'
    nightly = _write_setup(tmp_path, overrides)
    (tmp_path / "study.yaml").write_text((tmp_path / "study.yaml").read_text() + "search: {timeout_s: 60}\n")
    study = read_study_for(load_nightly(nightly))
    assert study.search.timeout_s is None and study.name == "007" and study.traffic.speed == 2.0
    assert study.sla.latency_ms == 80
    for k, (extra, message) in enumerate([
        ("{cost.gpu: null}", r"study_overrides: .*study.yaml: cost.gpu: expected a string, got None$"),
        ("{cost.gpuu: l4}", r"study_overrides: .*study.yaml: cost.gpuu: unknown key \(did you mean gpu\? "
                            r"expected one of: gpu, cloud, "),
        ("{cost.gpu.x: l4}", r"study.yaml: cost.gpu.x: unknown key$"),  # a value has no keys
    ]):
        with pytest.raises(SettingsError, match=message):
            read_study_for(load_nightly(_write_setup(tmp_path / str(k), f"study_overrides: {extra}\n")))


@pytest.mark.parametrize("code,expected", [(0, 0), (10, 0), (3, 3), (2, 2), (1, 1)])
def test_the_scheduler_wrapper_maps_exit_codes_and_runs_the_change_hook(tmp_path, code, expected):
    nightly = _write_setup(tmp_path)
    (tmp_path / "out" / "runs" / "r1").mkdir(parents=True)
    (tmp_path / "out" / "latest").symlink_to(Path("runs") / "r1")
    fake = tmp_path / "tuner"
    fake.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/args\nexit {code}\n")
    hook = tmp_path / "hook"
    hook.write_text(f"#!/bin/sh\necho \"$1\" > {tmp_path}/hooked\n")
    fake.chmod(0o755)
    hook.chmod(0o755)
    wrapper = Path(__file__).parent.parent / "deploy" / "nightly.sh"
    env = dict(os.environ, TUNER=str(fake), PYTHON=sys.executable, TUNER_ON_CHANGE=str(hook))
    done = subprocess.run(["bash", str(wrapper), str(nightly)], env=env, capture_output=True, text=True)
    assert done.returncode == expected, done.stderr
    assert (tmp_path / "args").read_text().split() == ["nightly", str(nightly)]
    hooked = tmp_path / "hooked"
    assert hooked.exists() == (code == 10)
    if code == 10:
        assert hooked.read_text().strip() == str(tmp_path / "out" / "runs" / "r1")


def test_the_scheduler_wrapper_passes_sigterm_on_to_tuner(tmp_path):
    # in a container the wrapper is PID 1 and gets the scheduler's SIGTERM; tuner must get it too
    nightly = _write_setup(tmp_path)
    fake = tmp_path / "tuner"
    fake.write_text(f"#!/bin/sh\ntrap 'echo term > {tmp_path}/term; exit 143' TERM\n"
                    f"echo up > {tmp_path}/up\nwhile :; do sleep 0.1; done\n")
    fake.chmod(0o755)
    wrapper = Path(__file__).parent.parent / "deploy" / "nightly.sh"
    env = dict(os.environ, TUNER=str(fake), PYTHON=sys.executable)
    job = subprocess.Popen(["bash", str(wrapper), str(nightly)], env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while not (tmp_path / "up").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=10)
    finally:
        if job.poll() is None:
            job.kill()
    assert (tmp_path / "term").exists()
    assert job.returncode == 143


# --- a generative model (vLLM batches): production's model.json, tokens per dollar ------------------

LLM_TEMPLATE = Path(__file__).parent.parent / "model_repository_templates" / "llm_vllm"
SEQS = {"max_num_seqs": 34}


def _write_llm_setup(tmp_path: Path, *, sla: str = "{ttft_ms: 1000, tpot_ms: 100}", production: bool = True) -> Path:
    """A copy of the llm_vllm template as the study's model; production's model.json caps it at 2 sequences."""
    import shutil

    shutil.copytree(LLM_TEMPLATE, tmp_path / "repo" / "llm_vllm", ignore=shutil.ignore_patterns("__pycache__"))
    args = json.loads((LLM_TEMPLATE / "1" / "model.json").read_text())
    (tmp_path / "production").mkdir()
    (tmp_path / "production" / "model.json").write_text(json.dumps({**args, "max_num_seqs": 2}, indent=2))
    (tmp_path / "traffic").mkdir()
    tokens = synth_poisson(4, 60, seed=0).assign(prompt_tokens=100, output_tokens=20)
    write_traffic(tokens, tmp_path / "traffic" / "night.csv")
    (tmp_path / "study.yaml").write_text(textwrap.dedent(f"""
        name: llm-study
        model_repository: repo
        model: llm_vllm
        traffic: {{path: traffic}}
        sla: {sla}
        cost: {{gpu: cpu}}
        search: {{max_num_seqs: {{low: 8, high: 64, log: true}}}}
        """))
    (tmp_path / "nightly.yaml").write_text(textwrap.dedent(f"""
        study: study.yaml
        {"production: production/model.json" if production else ""}
        traffic: {{path: traffic, hours: 1}}
        output: out
        search: {{trials: 2}}
        """))
    return tmp_path / "nightly.yaml"


class TokenEngine:
    """Output tokens per dollar by max_num_seqs; the arms' TTFT and TPOT as a streamed replay gives them."""

    def __init__(self, tpd: dict[int, float]):
        self.tpd = tpd
        self.replays: list[dict] = []

    def search(self, enqueue, trials, workdir, *, production, timeout_s=None):
        return SearchResult(dict(SEQS), self.tpd[34], trials + len(enqueue), 2, self.tpd[production["max_num_seqs"]])

    def replay(self, params, arm):
        self.replays.append(params)
        return d.ArmResult(arm=arm, meets_sla=True, per_dollar=self.tpd[params["max_num_seqs"]], unit="tokens",
                           latency_ms=900.0, ttft_ms=120.0, tpot_ms=15.0)


def test_production_of_a_vllm_model_is_its_model_json_resolved(tmp_path, capsys):
    from tuner.nightly.deployed import read_deployed
    from tuner.nightly.settings import read_study_for

    nightly = _write_llm_setup(tmp_path)
    settings = load_nightly(nightly)
    study = read_study_for(settings)
    assert study.search.max_batch_size is None  # the dynamic batcher is not searched: vLLM batches
    deployed = read_deployed(study, settings.production)
    assert deployed.unit == "tokens" and deployed.params == {"max_num_seqs": 2}
    assert deployed.path == tmp_path / "production" / "model.json"
    proposal = deployed.proposal(dict(SEQS), study.search)
    proposed = json.loads(proposal.text)
    assert proposal.name == "model.json" and proposed == {**deployed.engine, "max_num_seqs": 34}
    assert proposal.changed == ("max_num_seqs: 2 -> 34",)
    assert '-  "max_num_seqs": 2' in proposal.diff and '+  "max_num_seqs": 34' in proposal.diff
    # without `production:`, the study model's own model.json with vLLM's CPU default (128 sequences)
    default = _write_llm_setup(tmp_path / "default", production=False)
    assert read_deployed(read_study_for(load_nightly(default)), None).params == {"max_num_seqs": 128}
    assert main(["nightly", str(nightly), "--check"]) == 0
    out = capsys.readouterr().out
    assert "output tokens per dollar" in out and "model.json: seqs 2" in out


def test_a_generative_night_with_bad_input_is_one_line(tmp_path, capsys):
    def refused(nightly) -> str:
        assert main(["nightly", str(nightly), "--check"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "Traceback" not in err[0], err
        return err[0]

    assert "sla.ttft_ms" in refused(_write_llm_setup(tmp_path / "a", sla="{latency_ms: 50}"))
    no_tokens = _write_llm_setup(tmp_path / "b")
    write_traffic(synth_poisson(4, 60, seed=0), tmp_path / "b" / "traffic" / "night.csv")
    assert "prompt_tokens" in refused(no_tokens)
    batcher = _write_llm_setup(tmp_path / "c")
    (tmp_path / "c" / "study.yaml").write_text((tmp_path / "c" / "study.yaml").read_text().replace(
        "search: {", "search: {max_batch_size: {low: 1, high: 8}, "))
    assert "dynamic batcher does nothing" in refused(batcher)


def test_a_generative_night_proposes_a_model_json_scored_in_tokens(tmp_path, capsys):
    nightly = _write_llm_setup(tmp_path)
    engine = TokenEngine({2: 1.0e6, 34: 1.5e6})
    night = run_night(load_nightly(nightly), _factory_with_engine_args(engine, {"max_num_seqs": 2}),
                      now=datetime(2026, 12, 1, 2, 0, tzinfo=UTC))
    assert night.exit_code == EXIT_ACT and len(engine.replays) == 6
    assert "output tokens per dollar" in night.decision.reason
    proposed = night.run_dir / "proposed"
    assert sorted(p.name for p in proposed.iterdir()) == ["model.diff", "model.json"]
    production = json.loads((tmp_path / "production" / "model.json").read_text())
    assert json.loads((proposed / "model.json").read_text()) == {**production, "max_num_seqs": 34}
    entry = history.read_history(tmp_path / "out")[-1]
    assert entry["unit"] == "tokens" and entry["best_tokens_per_dollar"] == 1.5e6
    assert entry["production_tokens_per_dollar"] == 1.0e6 and "best_requests_per_dollar" not in entry
    assert entry["proposed"] == "proposed/model.json" and entry["changed"] == ["max_num_seqs: 2 -> 34"]
    summary_md = (night.run_dir / "summary.md").read_text()
    assert "scoring: capacity (output tokens per dollar)" in summary_md and "req/$" not in summary_md
    assert "| production tokens/$ | candidate tokens/$ |" in summary_md and "candidate TTFT p99 ms" in summary_md
    assert "p99 TTFT <= 1000 ms, p99 TPOT <= 100 ms" in summary_md
    assert "### Proposed model.json change" in summary_md
    # the history table and the textfile name the unit; nothing is written as requests per dollar
    prom = tmp_path / "nightly.prom"
    assert main(["nightly", "--history", str(nightly), "--textfile", str(prom)]) == 0
    assert "1.5e+06 tokens/$" in capsys.readouterr().out
    from prometheus_client.parser import text_string_to_metric_families

    samples = {(s.name, s.labels.get("config")): s.value
               for f in text_string_to_metric_families(prom.read_text()) for s in f.samples}
    assert samples[("tuner_nightly_output_tokens_per_dollar", "best")] == 1.5e6
    assert samples[("tuner_nightly_output_tokens_per_dollar", "production")] == 1.0e6
    assert not any(name == "tuner_nightly_requests_per_dollar" for name, _ in samples)


def _factory_with_engine_args(engine, seqs: dict):
    @contextmanager
    def factory(study, production, traffic_path, *, staging, **kw):
        args = kw["engine"]  # production's model.json, as the real engine writes it into the served copy
        assert {k: args[k] for k in seqs} == seqs and production.backend == "python"
        yield engine

    return factory


def test_the_rule_names_its_unit_and_refuses_to_mix_units():
    pairs = [(d.ArmResult(arm="production", meets_sla=True, per_dollar=100.0, unit="tokens"),
              d.ArmResult(arm="candidate", meets_sla=True, per_dollar=120.0, unit="tokens"))] * 3
    got = d.decide(pairs)
    assert got.decision == "change" and "production's output tokens per dollar" in got.reason
    assert "production's requests per dollar" in d.decide([(R("production", 100), R("candidate", 120))] * 3).reason
    mixed = [(R("production", 100), pairs[0][1])] * 3
    with pytest.raises(ValueError, match="different units"):
        d.decide(mixed)


def test_token_traffic_drifts_in_its_token_figures():
    night = synth_poisson(20, 120, seed=1).assign(prompt_tokens=400, output_tokens=100)
    longer = synth_poisson(20, 120, seed=2).assign(prompt_tokens=400, output_tokens=300)
    table = drift.drift_table(night, longer).set_index("metric")
    assert table.loc["output_tokens_p99", "current"] == 300 and table.loc["output_tokens_p99", "drift"]
    assert table.loc["output_tokens_per_s", "drift"] and not table.loc["prompt_tokens_p50", "drift"]
    assert table.loc["output_tokens_per_s", "current"] == pytest.approx(300 * 20, rel=0.2)
    plain = drift.drift_table(None, synth_poisson(20, 60, seed=1)).set_index("metric")
    assert not any(m.endswith("_per_s") or m.endswith("_p99") for m in plain.index)
