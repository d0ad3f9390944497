"""`tuner tune` end to end: a real local Triton serving the emulated-GPU template, real Locust
replays of the shipped bursty profile, a real Optuna journal storage. Small spaces, short steps.

- the recommended config loads in a real Triton, beats the template's incumbent by the margin the
  summary reports, and a fresh `tuner replay` at the reported capacity (less 10%) meets the SLA;
- Ctrl-C in the middle of a two-worker study, then the same command: the study completes, with no
  finished trial lost and none duplicated;
- an SLA nothing meets: exit 3, the summary says so and names the closest configuration; resuming
  that study with another SLA is refused naming the change.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest
from optuna.trial import TrialState
from support import QUICK_TRIALS, repository, write_tune_study

from tuner import modelconfig, space
from tuner.cli import main
from tuner.search import open_storage
from tuner.server.local import LocalLauncher
from tuner.settings import IntRange, SearchSettings
from tuner.traffic import busiest_window, mean_rps, read_traffic, step_window
from tuner.trial.step import retry_workers

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "traffic_profiles" / "bursty_60s.csv"



# --- the pieces of a trial that need no server ----------------------------------------------------


def test_the_templates_incumbent_reads_back_from_its_config():
    base = modelconfig.load(ROOT / "model_repository_templates" / "encoder_sim" / "config.pbtxt")
    search = SearchSettings(preferred_batch_size="powers_of_two", instance_count=IntRange(1, 2))
    assert space.from_config(base, search) == {"max_batch_size": 64, "max_queue_delay_microseconds": 0,
                                               "instance_count": 1}
    modelconfig.validate(space.apply(base, {"max_batch_size": 12, "max_queue_delay_microseconds": 500}, search))


def test_each_step_measures_the_busiest_stretch_that_lasts_the_step_after_its_warm_up():
    traffic = read_traffic(PROFILE)
    part, warmup = step_window(traffic, speed=0.5, warmup_s=1.0, measured_s=3.0)
    assert 0 < warmup <= 1.0
    # what falls after the warm-up (in wall seconds at speed 0.5) is exactly the busiest 1.5 s
    due = (part["timestamp"] - part["timestamp"].iloc[0]).to_numpy() / 0.5
    measured = due >= warmup - 1e-9
    assert measured.sum() == busiest_window(traffic, 1.5)[1]
    assert float(part["timestamp"].iloc[-1] - part["timestamp"].iloc[0]) <= 2.0
    whole, warmup = step_window(traffic, speed=100.0, warmup_s=1.0, measured_s=3.0)  # shorter than a step
    assert len(whole) == len(traffic) and warmup == 1.0
    assert mean_rps(traffic) == pytest.approx(149.0, rel=0.01)


def test_the_measured_stretch_only_gets_busier_with_the_speed():
    # what makes the capacity search's bisection sound: more requests in the same wall time
    traffic = read_traffic(ROOT / "traffic_profiles" / "azure_llm_2023_code.csv")
    counts = []
    for speed in (2.0, 3.0, 4.0, 6.0, 8.0, 11.0, 16.0, 23.0):
        part, warmup = step_window(traffic, speed, warmup_s=1.0, measured_s=3.0)
        due = (part["timestamp"] - part["timestamp"].iloc[0]).to_numpy() / speed
        counts.append(int(((due >= warmup - 1e-9) & (due < warmup + 3.0)).sum()))
    assert counts == sorted(counts) and counts[-1] > counts[0], counts


def test_re_runs_of_an_invalid_replay_add_load_generators_but_leave_the_server_a_core():
    # one more than the attempt before used, up to the cores less one
    assert retry_workers(1, cpus=8) == 2 and retry_workers(2, cpus=8) == 3 and retry_workers(0, cpus=8) == 2
    assert retry_workers(1, cpus=2) == 1  # 2 cores: another try with one process
    assert retry_workers(3, cpus=4) == 3
    # never fewer than before: a count asked for above the cores, or one the replay chose, stands
    assert retry_workers(6, cpus=2) == 6 and retry_workers(5, cpus=4) == 5


# --- end to end ------------------------------------------------------------------------------------


def load(output: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=open_storage(f"sqlite:///{output / 'study.db'}"))


@pytest.mark.slow
def test_tune_recommends_a_config_that_loads_beats_the_incumbent_and_holds_its_capacity(
        tmp_path, triton_install, capsys, no_vllm_engine_beside):
    # the incumbent: the template with max_batch_size 1, a clear loser to 16 under bursts
    # a replay sent more than 10 ms late says nothing of the server: made again (a 100 ms budget, the
    # SLA itself, let a CI machine starved by the engine tests fail every step of batch 16: p99 153 ms)
    study_file = write_tune_study(tmp_path, "e2e", repository(tmp_path, max_batch_size=1),
                                  **{"replay.lag_budget_ms": 10})
    code = main(["tune", str(study_file), "--quiet"])
    out = capsys.readouterr().out
    assert code == 0, out
    output = tmp_path / "e2e"
    summary = json.loads((output / "summary.json").read_text())
    best, incumbent = summary["best"], summary["incumbent"]
    # the closing lines end with the replay that measures the recommendation's deciding step again
    assert (f"check it: tuner replay {study_file} --config {output / 'recommended' / 'config.pbtxt'} "
            f"--speed {best['capacity_speed']:.4g} --step") in out
    assert best["params"] == {"max_batch_size": 16, "max_queue_delay_microseconds": 0}, summary["top"]
    assert incumbent["params"] == {"max_batch_size": 1, "max_queue_delay_microseconds": 0}
    assert summary["trials"]["complete"] + summary["trials"]["pruned"] == 2
    # three repeats of each: the recommendation's all measured; an overloaded incumbent's repeat whose load
    # generator stayed late past its tries is counted unmeasured, not dropped (CI: 2 measured + 1)
    assert len(best["repeats"]["values"]) == 3 and best["repeats"]["unmeasured_runs"] == 0, best["repeats"]
    assert len(incumbent["repeats"]["values"]) + incumbent["repeats"]["unmeasured_runs"] == 3, incumbent["repeats"]
    # the summary and the closing table report the margin over the incumbent
    if incumbent["feasible"]:
        assert summary["improvement"] == pytest.approx(
            best["requests_per_dollar"] / incumbent["requests_per_dollar"] - 1)
        assert summary["improvement"] > 0, summary
        assert f"{summary['improvement']:+.1%}" in out
    else:
        assert summary["improvement"] is None and "incumbent did not meet the SLA" in summary["message"]
    assert best["capacity_rps"] > 0 and best["scores"]["capacity"] > 0 and best["scores"]["utilization"] > 0
    assert best["latency_ms"]["p99"] <= 100
    # Triton's own statistics beside the score: batches of 16 fill, each execution computes for ms
    assert best["queue_ms"] >= 0 and best["compute_ms"] > 1.0 and best["fill_rate"] > 0
    # every request's latency at capacity of the re-measured configurations, for the report's CDFs:
    # each repeat's p99 met the SLA, and the median of the repeats' p99 is the summary's
    records = pd.read_parquet(output / "records" / f"trial_{best['trial']}.parquet")
    assert sorted(records["repeat"].unique()) == [0, 1, 2]
    p99s = records.groupby("repeat")["latency_ms"].quantile(0.99)
    assert (p99s <= 100).all()
    assert float(p99s.median()) == pytest.approx(best["latency_ms"]["p99"], rel=1e-6)
    if incumbent["capacity_rps"]:
        assert (output / "records" / "incumbent.parquet").is_file()
    # the report is written at the end of the run, and the terminal says where; its CDFs use the records
    report = output / "report.html"
    html = report.read_text()
    assert report.is_file() and "Recommended:" in html and f"report:  {report}" in out
    assert f"trial {best['trial']} (percentiles)" not in html and f"trial {best['trial']}" in html

    # the recommended config.pbtxt loads in a real Triton as the model's own config
    repo = tmp_path / "fresh"
    shutil.copytree(ROOT / "model_repository_templates" / "encoder_sim", repo / "encoder_sim")
    shutil.copy(output / "recommended" / "config.pbtxt", repo / "encoder_sim" / "config.pbtxt")
    assert "# Incumbent settings as a training-derived" in (output / "recommended" / "config.pbtxt").read_text()
    with LocalLauncher(repo, models=["encoder_sim"], install=triton_install) as server:
        running = server.model_config("encoder_sim")
    assert running.max_batch_size == 16
    assert running.dynamic_batching.max_queue_delay_microseconds == best["params"]["max_queue_delay_microseconds"]

    # fresh replays of recommended/config.pbtxt (`--config`) at the reported capacity (less 10%) meet the SLA: the stretch the capacity was
    # found on (`--step`: the busiest second, 2.6x the rate of the traffic's first 4 s), judged as the
    # recommendation's capacity was, by the median of three (one p99 of a few hundred requests lies 8 % from
    # its median, 23 % at the p90, on 2 cores: benchmarks/load_latency_repeats.py; in CI one single replay
    # read 129 ms).
    # Their load generator is held to a 10 ms send-lag budget (the study's 100 ms lets a search go on on a
    # loaded machine): in CI one stalled 70 ms and its burst of late requests alone put p99 at 140 ms. Like a
    # trial's attempts, a replay the machine sent late is made again, up to three times; it is never judged.
    speed = 0.9 * best["capacity_speed"]
    check = write_tune_study(tmp_path, "check", tmp_path / "models", **{"replay.lag_budget_ms": 10})
    report = tmp_path / "replay.json"
    fresh = []
    for _ in range(3):
        for _ in range(3):
            assert main(["replay", str(check), "--config", str(output / "recommended" / "config.pbtxt"),
                         "--speed", f"{speed:.4f}", "--step",
                         "--json", str(report)]) == 0
            m = json.loads(report.read_text())["measurement"]
            if m["valid"]:
                break
        assert m["valid"], m["invalid_reason"]
        assert m["error_rate"] <= 0.001, m
        fresh.append(m["latency_ms"]["p99"])
    assert float(np.median(fresh)) <= 100, fresh


def run_tune(study_file: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tuner", "tune", str(study_file), "--quiet", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own group: Ctrl-C reaches it and its workers only


def run_two_worker_study(tmp_path: Path, name: str) -> tuple[Path, Path, subprocess.Popen]:
    """`tuner tune --workers 2 --trials 3` on two grid points (8, 16) and the incumbent, started in
    the background; returns the study file, its output directory and the process."""
    study_file = write_tune_study(
        tmp_path, name, **{"search.max_batch_size": {"low": 8, "high": 16, "log": True},
                           "search.remeasure_repeats": 1, **QUICK_TRIALS})
    return study_file, tmp_path / name, run_tune(study_file, "--workers", "2", "--trials", "3")


def wait_for_trials(output: Path, name: str, what: str, ready, timeout_s: float = 300) -> None:
    """Poll the study's storage until `ready(trial states)` holds; fail the test after `timeout_s` (generous:
    four test workers on 2 cores slow a trial several times)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(1.0)
        if not (output / "study.db").exists():
            continue
        try:
            states = [t.state for t in load(output, name).get_trials()]
        except KeyError:  # the file is there before the study's row is
            continue
        if ready(states):
            return
    pytest.fail(f"not in {timeout_s:g} s: {what}")


@pytest.mark.slow
@pytest.mark.usefixtures("one_multi_process_study_at_a_time")
def test_ctrl_c_in_a_two_worker_study_then_the_same_command_completes_it(tmp_path):
    study_file, output, first = run_two_worker_study(tmp_path, "resume")
    try:
        wait_for_trials(output, "resume", "a finished trial and one in flight",
                        lambda states: TrialState.COMPLETE in states and TrialState.RUNNING in states)
        os.killpg(first.pid, signal.SIGINT)
        log = first.communicate(timeout=60)[0]
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert first.returncode == 130, log
    interrupted = load(output, "resume").get_trials()
    kept = {t.number: t.params for t in interrupted if t.state == TrialState.COMPLETE}
    assert kept and any(t.state == TrialState.FAIL for t in interrupted)
    assert not [t for t in interrupted if t.state == TrialState.RUNNING]

    again = run_tune(study_file, "--workers", "2", "--trials", "3")
    log = again.communicate(timeout=420)[0]
    assert again.returncode == 0, log
    trials = load(output, "resume").get_trials()
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    states = [(t.number, t.state.name, t.params, t.user_attrs.get("error_kind"), t.user_attrs.get("note"),
               t.user_attrs.get("error")) for t in trials]
    assert len(finished) == 3 and not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)], \
        (states, log)
    assert all(trials[n].params == p and trials[n].state == TrialState.COMPLETE for n, p in kept.items())
    assert sorted(t.number for t in trials) == list(range(len(trials)))
    # every failed (interrupted) trial was measured again, once; one interrupted before its
    # configuration was drawn measured nothing and has nothing to retry
    # (a grid point the other worker already measures is failed as a duplicate, skipped by design: CI once
    # drew one in the second run, and counted it here as an interruption never retried)
    retried = [t.user_attrs.get("retry_of") for t in trials if "retry_of" in t.user_attrs]
    failed = [t.number for t in trials if t.state == TrialState.FAIL and t.user_attrs.get("error_kind") == "interrupted"
              and (t.params or t.system_attrs.get("fixed_params"))]
    assert sorted(retried) == sorted(failed), states
    assert {t.user_attrs.get("error_kind") for t in trials if t.state == TrialState.FAIL} <= {"interrupted", "duplicate"}, \
        states
    # two grid points (8, 16) and the incumbent fill the budget of 3: none measured twice
    configs = [tuple(sorted(t.params.items())) for t in finished]
    assert len(set(configs)) == len(configs)
    assert len({t.user_attrs["pid"] for t in trials}) >= 2
    counts = json.loads((output / "summary.json").read_text())["trials"]
    assert counts["failed"] == 0 and counts["interrupted"] + counts["duplicate"] == sum(
        t.state == TrialState.FAIL for t in trials), counts  # an interruption is not the configuration's failure


@pytest.mark.slow
@pytest.mark.usefixtures("one_multi_process_study_at_a_time")
def test_sigterm_to_a_two_worker_study_stops_its_workers_and_servers_and_keeps_the_trials(tmp_path):
    # a scheduler (a Kubernetes CronJob, systemd) stops the job with SIGTERM to its main process only
    import psutil

    _, output, job = run_two_worker_study(tmp_path, "term")
    try:
        wait_for_trials(output, "term", "both workers measuring (servers up, trials in flight)",
                        lambda states: states.count(TrialState.RUNNING) == 2)
        descendants = psutil.Process(job.pid).children(recursive=True)
        assert any("tritonserver" in " ".join(p.cmdline()) for p in descendants)
        job.send_signal(signal.SIGTERM)
        log = job.communicate(timeout=90)[0]
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == 143, log
    assert "terminated (SIGTERM)" in log and "Traceback" not in log
    trials = load(output, "term").get_trials()
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    assert len([t for t in trials if t.state == TrialState.FAIL]) >= 2  # both in-flight trials
    time.sleep(1.0)
    alive = [p for p in descendants if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [" ".join(p.cmdline())[:120] for p in alive]


@pytest.mark.slow
@pytest.mark.usefixtures("one_multi_process_study_at_a_time")  # the lock test_resuming_... took (merged here)
def test_an_sla_nothing_meets_is_exit_3_naming_the_closest(tmp_path, capsys):
    # also test_resuming_a_study_with_another_model_config_or_sla_is_refused_naming_the_change (merged
    # into this one: the study it resumes is this one's, measured once instead of twice)
    study_file = write_tune_study(tmp_path, "strict", **{"sla.latency_ms": 0.5})
    assert main(["tune", str(study_file), "--quiet"]) == 3
    captured = capsys.readouterr()
    summary = json.loads((tmp_path / "strict" / "summary.json").read_text())
    assert summary["feasible"] is False and summary["best"] is None
    assert summary["message"].startswith("no configuration met the SLA (p99 <= 0.5 ms")
    closest = summary["closest"]
    assert closest["params"]["max_batch_size"] in (16, 64) and "closest: trial" in summary["message"]
    assert "tuner: error: no configuration met the SLA" in captured.err
    assert not (tmp_path / "strict" / "recommended" / "config.pbtxt").exists()
    assert (tmp_path / "strict" / "report.html").is_file()  # a report that says nothing met the SLA
    assert modelconfig.load(ROOT / "model_repository_templates" / "encoder_sim" / "config.pbtxt").max_batch_size == 64

    # the dry run says it resumes the study
    assert main(["tune", str(study_file), "--check"]) == 0
    assert re.search(r"resumes study 'strict': \d+ trial\(s\) measured of \d+", capsys.readouterr().out)

    # resuming the measured study with another SLA is refused naming the change, nothing rewritten; the
    # dry run says so first, as the real run will
    before = (tmp_path / "strict" / "summary.json").read_text()
    # the send-lag budget decides which steps count: another one is another measurement
    lagged = write_tune_study(tmp_path, "strict", **{"sla.latency_ms": 0.5, "replay.lag_budget_ms": 20})
    assert main(["tune", str(lagged), "--check"]) == 2
    assert "another measurement.lag_budget_ms (100.0 -> 20.0)" in _one_line_error(capsys)
    changed = write_tune_study(tmp_path, "strict", **{"sla.latency_ms": 50})
    for check in (["--check"], ["--quiet", "--trials", "1"]):
        assert main(["tune", str(changed), *check]) == 2
        line = _one_line_error(capsys)
        assert "was measured with another sla" in line and "--output NEW_DIR" in line
    assert (tmp_path / "strict" / "summary.json").read_text() == before  # nothing rewritten


def test_bad_input_is_one_line_and_exit_2_before_any_server_starts(tmp_path, capsys):
    assert main(["tune", str(tmp_path / "missing.yaml")]) == 2
    bad_key = write_tune_study(tmp_path, "badkey")
    bad_key.write_text(bad_key.read_text().replace("sla:", "slaa:"))
    assert main(["tune", str(bad_key)]) == 2
    no_traffic = write_tune_study(tmp_path, "notraffic", **{"traffic.path": str(tmp_path / "none.csv")})
    assert main(["tune", str(no_traffic)]) == 2
    broken = repository(tmp_path)
    (broken / "encoder_sim" / "config.pbtxt").write_text("max_batch_size: [")
    assert main(["tune", str(write_tune_study(tmp_path, "broken", broken))]) == 2
    assert main(["tune", str(write_tune_study(tmp_path, "gpu", **{"cost.gpu": "v100"}))]) == 2
    assert main(["tune", str(write_tune_study(tmp_path, "w")), "--workers", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 6 and all(line.startswith("tuner: error: ") for line in err), err
    assert "slaa: unknown key" in err[1] and "none.csv" in err[2] and "config.pbtxt:1" in err[3]
    assert f"{tmp_path / 'gpu.yaml'}: cost.gpu: unknown GPU 'v100'" in err[4]
    assert not list(tmp_path.glob("*/study.db")) and not list(tmp_path.glob("*/study.journal"))


# --- what a new user tries: each answered in one line, before any server starts ---------------------


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("tuner: error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_a_model_that_cannot_batch_is_refused_and_nothing_is_left_behind(tmp_path, capsys):
    repo = repository(tmp_path, max_batch_size=0)
    study = write_tune_study(tmp_path, "nobatch", repo)
    assert main(["tune", str(study)]) == 2
    line = _one_line_error(capsys)
    assert "max_batch_size is 0: this model does not batch" in line and "config.pbtxt" in line
    assert not (tmp_path / "nobatch").exists()


def test_a_search_of_instance_count_over_two_instance_groups_is_refused_and_nothing_is_left_behind(tmp_path, capsys):
    repo = repository(tmp_path)
    path = repo / "encoder_sim" / "config.pbtxt"
    one_group = "instance_group [ { count: 1, kind: KIND_CPU } ]"
    assert one_group in path.read_text()
    path.write_text(path.read_text().replace(one_group, one_group[:-2] + ", { count: 2, kind: KIND_CPU } ]"))
    study = write_tune_study(tmp_path, "groups", repo, **{"search.instance_count": {"low": 1, "high": 2}})
    for argv in (["tune", str(study), "--check"], ["tune", str(study)]):
        assert main(argv) == 2
        line = _one_line_error(capsys)
        assert f"{path}: search.instance_count: the config has 2 instance groups (counts 1, 2)" in line, line
    assert not (tmp_path / "groups").exists()


@pytest.mark.parametrize("where, message", [
    ("file", "exists and is not a directory"),
    ("proc", "cannot write"),
    ("long", "File name too long"),
])
def test_an_output_directory_that_cannot_be_written_is_one_line(tmp_path, capsys, where, message):
    target = {"file": tmp_path / "a-file", "proc": Path("/proc/tuner-out"), "long": tmp_path / ("d" * 300)}[where]
    if where == "file":
        target.write_text("mine")
    assert main(["tune", str(write_tune_study(tmp_path, "out")), "--output", str(target)]) == 2
    line = _one_line_error(capsys)
    assert "output directory" in line and message in line
    if where == "file":
        assert target.read_text() == "mine"


def _traffic_with_rows(tmp: Path, rows: int) -> Path:
    df = read_traffic(PROFILE).head(400).copy()
    df["batch_size"] = 1
    df.loc[17, "batch_size"] = rows
    path = tmp / f"rows{rows}.csv"
    df.to_csv(path, index=False)
    return path


def test_an_incumbent_outside_a_knobs_choices_is_one_line_before_any_server(tmp_path, capsys):
    # a trial takes one of a categorical knob's choices: Optuna raised "'none' not in ('powers_of_two',)"
    # from the search, after the server had started
    study = write_tune_study(tmp_path, "choices", **{"search.preferred_batch_size": ["powers_of_two"]})
    for argv in (["tune", str(study), "--check"], ["tune", str(study)]):
        assert main(argv) == 2
        line = _one_line_error(capsys)
        assert ("search.preferred_batch_size: the incumbent's preferred_batch_size is none, not one of the "
                "choices [powers_of_two]") in line and "add none to search.preferred_batch_size" in line, line
    assert not (tmp_path / "choices").exists()


def test_a_study_measured_with_another_model_py_is_not_resumed(tmp_path, capsys):
    # the study as `tune` opens it, before any trial: then the model's code changes
    from tuner import search
    from tuner.settings import read_study
    from tuner.tune import identity, prepare

    repo = repository(tmp_path)
    study = write_tune_study(tmp_path, "code", repo)
    prepared = prepare(read_study(study))
    assert set(prepared.model_files) == {"1/model.py"}
    search.open_study(prepared.settings, prepared.storage, sampler=search.make_sampler(prepared.settings.search),
                      identity=identity(prepared))
    assert main(["tune", str(study), "--check"]) == 0 and "resumes study 'code'" in capsys.readouterr().out
    # Python's cache beside it is not the model
    (repo / "encoder_sim" / "1" / "__pycache__").mkdir()
    (repo / "encoder_sim" / "1" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    assert main(["tune", str(study), "--check"]) == 0
    capsys.readouterr()
    code = repo / "encoder_sim" / "1" / "model.py"
    code.write_text(code.read_text() + "\n# another version\n")
    assert main(["tune", str(study), "--check"]) == 2
    assert "was measured with another model_files.1/model.py (" in _one_line_error(capsys)
    code.write_text(code.read_text().removesuffix("\n# another version\n"))
    (repo / "encoder_sim" / "1" / "weights.bin").write_bytes(b"\1" * 100)  # a file added is a change too
    assert main(["tune", str(study), "--check"]) == 2
    assert "another model_files.1/weights.bin (absent -> " in _one_line_error(capsys)


def test_requests_larger_than_the_models_max_batch_size_are_refused_naming_the_row(tmp_path, capsys):
    study = write_tune_study(tmp_path, "rows", repository(tmp_path, max_batch_size=4),
                        **{"traffic.path": str(_traffic_with_rows(tmp_path, 8))})
    assert main(["tune", str(study)]) == 2
    line = _one_line_error(capsys)
    assert "max_batch_size is 4" in line and "requests of 8 rows (traffic row 18, timestamp " in line


def test_requests_larger_than_the_smallest_max_batch_size_in_the_space_narrow_it(tmp_path):
    from tuner.settings import read_study
    from tuner.tune import prepare

    study = write_tune_study(tmp_path, "narrow", **{"traffic.path": str(_traffic_with_rows(tmp_path, 8)),
                                               "search.max_batch_size": {"low": 1, "high": 64, "log": True}})
    prepared = prepare(read_study(study))
    assert prepared.settings.search.max_batch_size.low == 8
    assert any("low raised from 1 to 8" in note and "(traffic row 18, timestamp " in note for note in prepared.notes)
    too_big = write_tune_study(tmp_path, "big", repository(tmp_path, max_batch_size=128),
                          **{"traffic.path": str(_traffic_with_rows(tmp_path, 80)),
                                              "search.max_batch_size": {"low": 1, "high": 64, "log": True}})
    with pytest.raises(Exception, match="raise search.max_batch_size.high to at least 80"):
        prepare(read_study(too_big))


def test_a_study_output_that_is_a_file_is_said_as_one_not_as_its_storage(tmp_path, capsys):
    # said "storage sqlite:///.../afile.txt/study.db: Not a directory"
    (tmp_path / "afile.txt").write_text("mine")
    study = write_tune_study(tmp_path, "file", output=str(tmp_path / "afile.txt"))
    for argv in (["tune", str(study), "--check"], ["tune", str(study)]):
        assert main(argv) == 2
        assert _one_line_error(capsys).endswith(f"output directory {tmp_path / 'afile.txt'}: exists and is not a directory")
    assert (tmp_path / "afile.txt").read_text() == "mine"


def test_an_output_inside_the_models_directory_is_refused_before_anything_is_written(tmp_path, capsys):
    # the outputs landed in the user's model directory, and every server's private copy took them along
    repo = repository(tmp_path)
    before = sorted(p.name for p in (repo / "encoder_sim").rglob("*"))
    study = write_tune_study(tmp_path, "inside", repo, output=str(repo / "encoder_sim" / "out"))
    for argv in (["tune", str(study), "--check"], ["tune", str(study)]):
        assert main(argv) == 2
        assert "in the model's directory" in _one_line_error(capsys)
    assert sorted(p.name for p in (repo / "encoder_sim").rglob("*")) == before


def test_a_seq_len_column_no_input_takes_is_named_in_a_note(tmp_path):
    # the recorded lengths changed no request of a model of fixed dims, and nothing said so
    from tuner.settings import read_study
    from tuner.tune import prepare

    study = write_tune_study(tmp_path, "sized")
    assert not any("is not sent" in note for note in prepare(read_study(study)).notes)  # dims [-1]: it sizes them
    repo = repository(tmp_path)
    config = repo / "encoder_sim" / "config.pbtxt"
    config.write_text(config.read_text().replace("dims: [ -1 ]", "dims: [ 128 ]", 1))
    notes = prepare(read_study(write_tune_study(tmp_path, "fixed", repo))).notes
    assert [note for note in notes if "is not sent" in note] == [
        f"{PROFILE}: column 'seq_len' is not sent: no input of encoder_sim has a variable dim it sizes (each "
        f"request takes the dims config.pbtxt gives)"]


def test_the_first_lines_say_where_the_study_lives_and_an_incumbent_outside_the_search(tmp_path):
    from tuner.settings import read_study
    from tuner.tune import prepare

    study = write_tune_study(tmp_path, "where", **{"search.max_batch_size": {"low": 1, "high": 32, "log": True}})
    notes = prepare(read_study(study)).notes
    assert notes[0] == f"study 'where' in sqlite:///{tmp_path / 'where' / 'study.db'}"
    assert any("max_batch_size 64 (search.max_batch_size: 1..32) lies outside the search" in n for n in notes)


@pytest.mark.slow
def test_every_replay_unmeasured_finishes_the_study_writes_the_summary_and_exits_1(tmp_path, capsys):
    # no warm-up (its replays keep no send-lag budget and measure nothing this test reads): each trial is
    # its three attempts at the recorded load, all over the budget. The incumbent is batch 32, which fits
    # the emulated memory at any length: the template's 64 could run out of it on every request of a
    # window (its cold start, unwarmed, queues full batches of long requests), a server that failed every
    # request it was sent, which is an SLA miss whatever the lag (CI saw exit 3)
    study = write_tune_study(tmp_path, "lag", repository(tmp_path, max_batch_size=32),
                             **{"replay.lag_budget_ms": 0.001,
                                "search.max_batch_size": {"low": 8, "high": 16, "log": True},
                                "measurement": {"warmup": False}})
    assert main(["tune", str(study), "--quiet"]) == 1
    captured = capsys.readouterr()
    line = _one_line_error_from(captured.err)
    assert "no trial could be measured" in line and "raise replay.lag_budget_ms" in line
    summary = json.loads((tmp_path / "lag" / "summary.json").read_text())
    assert summary["trials"]["unmeasured"] == 3 and summary["best"] is None  # the incumbent and the grid's 8, 16
    assert all(u["attempts"] == 3 and u["send_lag_p99_ms"] > 0.001 for u in summary["unmeasured"])
    assert "unmeasured: 3 trial(s)" in captured.out or "unmeasured" in (tmp_path / "lag" / "trials.csv").read_text()


def _one_line_error_from(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("tuner: error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def closing_cell(out: str, row: str, column: str) -> str:
    """A cell of the closing table as the terminal shows it: the row whose tag starts with `row`, under
    `column` (pandas aligns each cell's right edge with its header's)."""
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if " trial " in line and column in line)
    end = lines[at].index(column) + len(column)
    line = next(line for line in lines[at + 1:] if line.lstrip().startswith(row))
    return line[:end].split()[-1]


@pytest.mark.slow
def test_a_new_knob_needs_only_the_space_a_bounded_queue_end_to_end(tmp_path, capsys):
    # dynamic_batching.default_queue_policy.max_queue_size was added to tuner/space.py and the settings
    # only: the search draws it, the server runs it (read back), and every output carries it
    study = write_tune_study(tmp_path, "queue", **{"search.max_queue_size": {"low": 0, "high": 64, "step": 64},
                                              "search.remeasure_repeats": 1, **QUICK_TRIALS})
    assert main(["tune", str(study), "--quiet"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    output = tmp_path / "queue"
    summary = json.loads((output / "summary.json").read_text())
    # the closing table shows the drawn value under the knob's label, in the best configuration's row
    assert closing_cell(out, "best", "queue max") == str(summary["best"]["params"]["max_queue_size"]), out
    trials = pd.read_csv(output / "trials.csv")
    assert set(trials["max_queue_size"].dropna()) <= {0, 64} and len(trials) == 3  # the incumbent and 2 points
    recommended = modelconfig.parse((output / "recommended" / "config.pbtxt").read_text())
    assert recommended.dynamic_batching.default_queue_policy.max_queue_size == summary["best"]["params"]["max_queue_size"]
    # tuner config set takes it by its name or its config.pbtxt path
    target = tmp_path / "set.pbtxt"
    assert main(["config", "set", str(output / "incumbent" / "config.pbtxt"),
                 "--set", "dynamic_batching.default_queue_policy.max_queue_size=16", "-o", str(target)]) == 0
    assert modelconfig.load(target).dynamic_batching.default_queue_policy.max_queue_size == 16
    assert "Search history" in (output / "report.html").read_text()


# --- issue 24: storages, outputs of another study, what the replay would refuse, profiles ----------


@pytest.mark.parametrize("storage, message", [
    ("notes.txt", "exists and is not an Optuna journal"),
    ("garbage!!", "neither a storage URL"),
    ("postgres//user@host/db", "neither a storage URL"),
    ("sqlite:///notes.txt", "exists and is not an SQLite database"),
    # an SQLite database of the user's: Optuna made its 13 tables beside theirs, even in a dry run
    ("sqlite:///app.db", "an SQLite database that is not an Optuna storage (its tables: customers)"),
])
@pytest.mark.parametrize("check", [False, True])
def test_a_storage_that_is_not_one_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch,
                                                                       storage, message, check):
    import sqlite3

    monkeypatch.chdir(tmp_path)
    study = write_tune_study(tmp_path, "st")
    (tmp_path / "notes.txt").write_text("my notes\n")
    with contextlib.closing(sqlite3.connect(tmp_path / "app.db")) as db:
        db.execute("CREATE TABLE customers (id INTEGER, name TEXT)")
        db.commit()
    app = (tmp_path / "app.db").read_bytes()
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert main(["tune", str(study), "--storage", storage, *(["--check"] if check else [])]) == 2
    line = _one_line_error(capsys)
    assert f"storage {storage}: {message}" in line, line
    assert (tmp_path / "notes.txt").read_text() == "my notes\n" and (tmp_path / "app.db").read_bytes() == app
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no output directory, no journal


@pytest.mark.parametrize("storage, reason", [
    ("{long}.journal", "File name too long"),
    ("sqlite:///{long}.db", "File name too long"),
    ("{tmp}/loop/study.journal", "Too many levels of symbolic links"),
    ("sqlite:///{tmp}/loop", "Too many levels of symbolic links"),
    ("{tmp}/notes.txt/study.journal", "Not a directory"),
    ("sqlite:////proc/tuner-storage/study.db", "takes no new file"),
])
@pytest.mark.parametrize("check", [False, True])
def test_a_storage_path_the_os_refuses_is_one_line_before_anything_is_written(tmp_path, capsys, monkeypatch,
                                                                            storage, reason, check):
    # the storage is a path the user gave (tuner.paths): `--check` says so, not a traceback in the real run
    monkeypatch.chdir(tmp_path)
    study = write_tune_study(tmp_path, "st")
    (tmp_path / "notes.txt").write_text("my notes\n")
    (tmp_path / "loop").symlink_to("loop")
    storage = storage.format(long="n" * 300, tmp=tmp_path)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert main(["tune", str(study), "--storage", storage, *(["--check"] if check else [])]) == 2
    line = _one_line_error(capsys)
    assert f"storage {storage}: " in line and reason in line, line
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no output directory, no probe left


def test_a_database_that_cannot_be_reached_is_the_runs_one_line_and_nothing_before_it(tmp_path, capsys):
    # the real run connects as it opens the study: the study's notes ("study 'st' in ...") waited until then
    from tuner.localhost import free_ports

    study = write_tune_study(tmp_path, "st")
    url = f"postgresql://tuner@127.0.0.1:{free_ports(1)[0]}/tuner"
    assert main(["tune", str(study), "--storage", url, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tuner: error: storage ") and err.count("\n") == 1 and "cannot open" in err, err


class _MetricsLike(http.server.BaseHTTPRequestHandler):
    """Answers every GET as Triton's metrics port answers GET /v2: 200 with an empty body."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):  # quiet
        pass


@pytest.mark.parametrize("check", [False, True])
def test_a_remote_url_that_answers_but_is_not_triton_is_refused_before_anything(tmp_path, capsys, check):
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), _MetricsLike) as listener:
        threading.Thread(target=listener.serve_forever, daemon=True).start()
        address = f"127.0.0.1:{listener.server_address[1]}"
        study = write_tune_study(tmp_path, "remote", **{"server": {"launcher": "remote", "url": address}})
        try:
            code = main(["tune", str(study), *(["--check"] if check else [])])
        finally:
            listener.shutdown()
    assert code == 2
    line = _one_line_error(capsys)
    assert f"{address} answers but is not Triton's HTTP endpoint (GET /v2: an empty answer" in line, line
    assert not (tmp_path / "remote").exists()  # no output directory, no study.db


def _outputs_of(tmp: Path, name: str) -> Path:
    out = tmp / "shared-out"
    (out / "records").mkdir(parents=True)
    (out / "summary.json").write_text(json.dumps({"study_name": name, "feasible": True}))
    (out / "records" / "trial_0.parquet").write_bytes(b"PAR1 measured once")
    return out


@pytest.mark.parametrize("check", [False, True])
def test_a_study_of_another_name_is_refused_where_another_studys_outputs_are(tmp_path, capsys, check):
    out = _outputs_of(tmp_path, "first")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    study = write_tune_study(tmp_path, "second", **{"output": str(out)})
    assert main(["tune", str(study), *(["--check"] if check else [])]) == 2
    line = _one_line_error(capsys)
    assert f"output directory {out}: holds the outputs of study 'first', not 'second'" in line, line
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # no study.db either


@pytest.mark.parametrize("check", [False, True])
def test_files_of_an_outputs_names_that_no_study_wrote_are_refused_and_kept(tmp_path, capsys, check):
    out = tmp_path / "mine"
    (out / "recommended").mkdir(parents=True)
    (out / "recommended" / "config.pbtxt").write_text("my production config\n")
    (out / "report.html").write_text("<html>mine</html>")
    (out / "notes.txt").write_text("mine")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    study = write_tune_study(tmp_path, "fresh", **{"output": str(out)})
    assert main(["tune", str(study), *(["--check"] if check else [])]) == 2
    line = _one_line_error(capsys)
    assert f"output directory {out}: holds recommended/config.pbtxt, report.html, which no tuner study " in line
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # no study.db either


def test_a_study_of_another_name_is_refused_where_another_study_began(tmp_path, capsys):
    out = tmp_path / "began"
    optuna.create_study(study_name="first", storage=open_storage(f"sqlite:///{out / 'study.db'}"))
    study = write_tune_study(tmp_path, "second", **{"output": str(out)})
    assert main(["tune", str(study)]) == 2
    assert "holds the outputs of study 'first'" in _one_line_error(capsys)
    names = [s.study_name for s in optuna.get_all_study_summaries(open_storage(f"sqlite:///{out / 'study.db'}"))]
    assert names == ["first"]


def test_a_report_that_cannot_be_written_is_not_a_success(tmp_path, capsys, monkeypatch):
    from tuner import export
    from tuner import tune as tune_module  # `tuner tune` imports it where the command runs

    summary = {"message": "best: trial 1", "feasible": True, "report_error": "report.html: cannot write "
               "(No space left on device)"}
    monkeypatch.setattr(tune_module, "tune", lambda *a, **k: summary)
    monkeypatch.setattr(export, "closing_table", lambda s: "table")
    assert main(["tune", str(write_tune_study(tmp_path, "full"))]) == 2
    captured = capsys.readouterr()
    assert "not written" not in captured.out
    assert "tuner: error: report not written (report.html: cannot write (No space left on device))" in captured.err


def _traffic(tmp: Path, rows: list[tuple[float, int, float]]) -> Path:
    path = tmp / "traffic.csv"
    pd.DataFrame(rows, columns=["timestamp", "batch_size", "seq_len"]).to_csv(path, index=False)
    return path


@pytest.mark.parametrize("check", [False, True])
def test_a_row_the_replay_would_refuse_is_refused_before_a_server_starts(tmp_path, capsys, check):
    rows = [(i * 0.05, 1, 100) for i in range(200)]
    rows[17] = (rows[17][0], 1, 1e12)
    study = write_tune_study(tmp_path, "huge", **{"traffic": {"path": str(_traffic(tmp_path, rows)), "speed": 1.0}})
    assert main(["tune", str(study), *(["--check"] if check else [])]) == 2
    line = _one_line_error(capsys)
    assert "traffic row 18, timestamp 0.85" in line and "above the replay's limit" in line, line  # the CSV's 18th data row
    assert not (tmp_path / "huge").exists()


@pytest.mark.parametrize("rows", [[(5.0, 1, 100)], [(5.0, 1, 100)] * 40])
def test_traffic_with_no_request_in_the_measured_window_is_refused_up_front(tmp_path, capsys, rows):
    study = write_tune_study(tmp_path, "still", **{"traffic": {"path": str(_traffic(tmp_path, rows)), "speed": 1.0}})
    assert main(["tune", str(study), "--check"]) == 2
    line = _one_line_error(capsys)
    assert "traffic.csv" in line and "no requests due in the measured window" in line, line


def test_a_warm_up_as_long_as_the_traffic_leaves_no_measured_window(tmp_path, capsys):
    rows = [(i * 0.1, 1, 100) for i in range(10)]  # 0.9 s of traffic, a 2 s warm-up
    study = write_tune_study(tmp_path, "warm", **{"traffic": {"path": str(_traffic(tmp_path, rows)), "speed": 1.0},
                                             "replay.warmup_s": 2.0})
    assert main(["tune", str(study), "--check"]) == 2
    line = _one_line_error(capsys)
    assert "no requests due in the measured window" in line and "replay.warmup_s" in line, line


PROFILE_CSV = "rows,length,median_ms\n1,128,1.0\n8,128,{ms}\n"


@pytest.mark.parametrize("profile, message", [
    ("# model: matmul_cpu\n" + PROFILE_CSV.format(ms=2.0), "measured on model matmul_cpu, not encoder_sim"),
    (None, "no such file"),
    (PROFILE_CSV.format(ms=-2.0), "median_ms must be a number > 0"),
])
@pytest.mark.parametrize("check", [False, True])
def test_the_model_strategys_profile_is_checked_before_anything_starts(tmp_path, capsys, profile, message, check):
    path = tmp_path / "profile.csv"
    if profile is not None:
        path.write_text(profile)
    study = write_tune_study(tmp_path, "prof", **{"search.strategy": "model", "search.profile": str(path)})
    assert main(["tune", str(study), *(["--check"] if check else [])]) == 2
    line = _one_line_error(capsys)
    assert str(path) in line and message in line, line
    assert not (tmp_path / "prof").exists()


def test_a_profile_of_this_model_passes_the_check(tmp_path, capsys):
    path = tmp_path / "profile.csv"
    path.write_text("# model: encoder_sim\n" + PROFILE_CSV.format(ms=2.0))
    study = write_tune_study(tmp_path, "mine", **{"search.strategy": "model", "search.profile": str(path)})
    assert main(["tune", str(study), "--check"]) == 0
    assert "ok (nothing was started)" in capsys.readouterr().out


@pytest.mark.parametrize("overrides, message", [
    ({"search.strategy": "model"}, "search.strategy model measures a handful of configurations on one server"),
    ({"server": {"launcher": "remote", "url": "127.0.0.1:9"}}, "server.launcher remote drives one running server"),
])
@pytest.mark.parametrize("check", [False, True])
def test_workers_that_cannot_each_have_a_server_are_refused_by_the_check_too(tmp_path, capsys, overrides, message,
                                                                             check):
    study = write_tune_study(tmp_path, "many", **overrides)
    assert main(["tune", str(study), "--workers", "2", *(["--check"] if check else [])]) == 2
    line = _one_line_error(capsys)
    assert message in line and "--workers must be 1" in line, line
    assert not (tmp_path / "many").exists()


def test_the_check_says_how_many_workers_measure(tmp_path, capsys):
    study = write_tune_study(tmp_path, "two")
    assert main(["tune", str(study), "--workers", "2", "--check"]) == 0
    assert "(2 workers, a server each)" in capsys.readouterr().out


@pytest.mark.parametrize(("percentile", "where", "noted"), [
    (99, "is their 3rd slowest", True),                       # (201 - 1) x 1 % = 2 requests above it
    (90, "is their 21st slowest", False),                     # 20 above it
    (99.7, "lies between their 1st and 2nd slowest", True),   # 0.6 of one
])
def test_the_check_says_how_many_requests_the_slas_percentile_is_read_from(tmp_path, capsys, percentile, where,
                                                                            noted):
    # one request a second for 100 s, and a burst of 200 more within 0.2 s at 50 s: the busiest second holds 201
    quiet = pd.DataFrame({"timestamp": [float(t) for t in range(100)]})
    burst = pd.DataFrame({"timestamp": [50.0 + 0.001 * (i + 1) for i in range(200)]})
    traffic = pd.concat([quiet, burst]).sort_values("timestamp").assign(batch_size=1, seq_len=64)
    traffic.to_csv(tmp_path / "traffic.csv", index=False)
    study = write_tune_study(tmp_path, "tail", traffic={"path": str(tmp_path / "traffic.csv"), "speed": 1.0},
                             **{"sla.percentile": percentile})
    assert main(["tune", str(study), "--check"]) == 0
    out = capsys.readouterr().out
    assert f"at the recorded load 201 requests, whose p{percentile:g} {where}" in out, out
    assert ("a slow request or two decide the SLA's verdict" in out) == noted, out


@pytest.mark.parametrize("check", [False, True])
def test_an_unreachable_database_is_refused_and_leaves_no_output_directory(tmp_path, capsys, check):
    study = write_tune_study(tmp_path, "pg")
    url = "postgresql://tuner:secret@127.0.0.1:9/tuner"  # nothing listens on port 9
    assert main(["tune", str(study), "--storage", url, *(["--check"] if check else [])]) == 2
    line = _one_line_error(capsys)
    assert "storage postgresql://tuner:***@127.0.0.1:9/tuner: cannot open" in line and "secret" not in line
    assert not (tmp_path / "pg").exists()


def test_a_full_disk_making_the_database_leaves_no_empty_file_or_directory(tmp_path, capsys, monkeypatch):
    import sqlite3

    study = write_tune_study(tmp_path, "full")
    db = tmp_path / "full" / "study.db"

    def full_disk(url, **_kw):  # SQLite made the file, then found no room for its schema
        db.touch()
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(optuna.storages, "RDBStorage", full_disk)
    assert main(["tune", str(study)]) == 2
    line = _one_line_error(capsys)
    assert f"storage sqlite:///{db}: cannot open: database or disk is full" in line, line
    assert not db.exists() and not (tmp_path / "full").exists()


def test_the_dry_run_of_a_docker_study_starts_nothing_and_says_when_docker_is_checked(tmp_path, capsys, monkeypatch):
    # no Docker engine is reached: a DOCKER_HOST that nothing answers changes nothing in a dry run
    study = write_tune_study(tmp_path, "dock", **{"server": {"launcher": "docker", "image": "example/triton:1"}})
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-engine.sock'}")
    assert main(["tune", str(study), "--check"]) == 0
    out = capsys.readouterr().out
    assert ("docker example/triton:1 (the Docker engine and the image are checked when a run starts, not here)"
            in out), out
    assert out.rstrip().endswith("ok (nothing was started)") and not (tmp_path / "dock").exists()
