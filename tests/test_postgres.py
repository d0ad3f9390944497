"""Many hosts, one study, against a real PostgreSQL (a private cluster: tests/pg_cluster.py).

- three `tuner tune` processes, each with its own local Triton (three hosts), share one grid study of
  9 configurations: each configuration is measured exactly once; one of them is killed (kill -9) in
  the middle of a trial, which another retries after the grace period (Optuna's heartbeat); one host
  re-measures and writes the outputs, the other says who does; a fourth process exports the
  recommended config, writes the outputs and the report from the database alone, and re-measures on
  its own server (`tuner finish`);
- a host with another GPU type is refused in one line, unless the study allows mixed GPUs, where each
  GPU type measures its own incumbent once;
- the study's lock holds one process at a time and is let go when its holder dies;
- an unreachable database, wrong credentials, a missing driver, a missing database: one line, exit 2;
- with the default storage (a SQLite file in the output directory), a study stopped mid-trial and
  started again with the same command completes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from support import QUICK_TRIALS, FakeEvaluation, fake_settings, fake_worker, write_tune_study

from tuner import export, search
from tuner.cli import main
from tuner.errors import SettingsError
from tuner.localhost import GPU_TYPE_ENV, free_ports
from tuner.settings import IntRange
from tuner.trial import Hints
from tuner.tune import Handover

ROOT = Path(__file__).resolve().parent.parent
GRID = {"search.max_batch_size": {"low": 4, "high": 16, "log": True},  # 4, 8, 16
        "search.max_queue_delay_microseconds": {"low": 0, "high": 2000, "step": 1000},  # 0, 1000, 2000
        "search.heartbeat_s": 1, "search.grace_period_s": 3,
        "search.remeasure_repeats": 1}


def tuner_process(*args: str, env: dict | None = None, log: Path | None = None) -> subprocess.Popen:
    """`python -m tuner ARGS` in its own process group (a host: kill -9 takes its Triton with it)."""
    out = open(log, "w") if log else subprocess.PIPE  # noqa: SIM115  closed by the caller's wait
    return subprocess.Popen([sys.executable, "-m", "tuner", *args], stdout=out, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, cwd=ROOT, env={**os.environ, **(env or {})})


def study_in(url: str, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=search.open_storage(url))


def measured(trials) -> list[tuple]:
    return sorted(tuple(sorted(t.params.items())) for t in trials
                  if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and not t.user_attrs.get("incumbent"))


# --- three hosts ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.usefixtures("one_multi_process_study_at_a_time")
def test_three_hosts_share_a_grid_study_survive_a_kill_and_any_machine_reads_it(tmp_path, postgres):
    url = postgres.create_database("three_hosts")
    # two capacity steps, one load-generator process (support.QUICK_TRIALS): the claims are the shared
    # study, the kill and the retry, not the capacity; the warm-up stays (three cold servers on 2 cores
    # met no SLA without it); an SLA a loaded machine still meets: the closing `tuner finish` claims a
    # re-measured best (stop 63's last CI run re-measured none within 100 ms, and the summary rightly
    # fell back to the search's own figures)
    study_file = write_tune_study(tmp_path, "shared", **GRID, **QUICK_TRIALS, **{"sla.latency_ms": 1000})
    logs = [tmp_path / f"host-{i}.log" for i in range(3)]
    hosts = [tuner_process("tune", str(study_file), "--storage", url, "--quiet", "--output",
                           str(tmp_path / f"out-{i}"), log=log) for i, log in enumerate(logs)]
    try:
        deadline = time.monotonic() + 300  # generous: four test workers on 2 cores
        victim = None
        while victim is None and time.monotonic() < deadline:  # in the middle of the study, mid-trial
            time.sleep(0.5)
            try:
                trials = study_in(url, "shared").get_trials()
            except (KeyError, SettingsError):  # the first host is still making the study (or its tables)
                continue
            done = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
            running = [t for t in trials if t.state == TrialState.RUNNING and t.params
                       and t.user_attrs.get("pid") == hosts[0].pid]
            if len(done) >= 2 and running:
                victim = running[0]
        assert victim is not None, logs[0].read_text()[-3000:]
        os.killpg(hosts[0].pid, signal.SIGKILL)  # the host is lost, its Triton with it
        hosts[0].wait()
        for host, log in zip(hosts[1:], logs[1:], strict=True):
            assert host.wait(timeout=420) == 0, log.read_text()[-3000:]
    finally:
        for host in hosts:
            if host.poll() is None:
                os.killpg(host.pid, signal.SIGKILL)
                host.wait()

    study = study_in(url, "shared")
    trials = study.get_trials()
    grid = sorted(tuple(sorted({"max_batch_size": b, "max_queue_delay_microseconds": d}.items()))
                  for b in (4, 8, 16) for d in (0, 1000, 2000))
    assert measured(trials) == grid  # every configuration measured exactly once, the killed one included
    incumbents = [t for t in trials if t.user_attrs.get("incumbent") and t.state == TrialState.COMPLETE]
    assert len(incumbents) == 1
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    killed = study.trials[victim.number]
    assert killed.state == TrialState.FAIL
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        retry = [t for t in trials if optuna.storages.RetryHeartbeatStaleTrialCallback.retried_trial_number(t)
                 == killed.number]
    assert len(retry) == 1 and retry[0].params == killed.params and retry[0].state != TrialState.FAIL
    assert retry[0].user_attrs["pid"] in (hosts[1].pid, hosts[2].pid)
    # every trial says where it was measured; the three hosts each measured some
    finished = [t for t in trials if t.state != TrialState.FAIL]
    assert all(t.user_attrs.get("gpu") == "cpu" and t.user_attrs.get("host") for t in finished)
    assert {t.user_attrs["pid"] for t in trials} == {h.pid for h in hosts}

    # one host re-measured and wrote the outputs; the other said who does
    texts = [log.read_text() for log in logs[1:]]
    finisher = [i for i, text in enumerate(texts) if "outputs:" in text]
    assert len(finisher) == 1, texts
    other = texts[1 - finisher[0]]
    on = study.user_attrs["remeasured_on"]
    assert on["pid"] == hosts[1 + finisher[0]].pid
    assert f"(pid {on['pid']}, cpu) re-measures the top configurations" in other, other
    output = tmp_path / f"out-{1 + finisher[0]}"
    summary = json.loads((output / "summary.json").read_text())
    assert summary["best"]["host"] and summary["remeasured_on"]["pid"] == on["pid"]
    assert {h["pid"] for h in summary["hosts"]} == {h.pid for h in hosts}
    assert "secret" not in json.dumps(summary) and postgres.password not in json.dumps(summary)
    table = (output / "trials.csv").read_text().splitlines()
    assert {"host", "pid", "gpu"} <= set(table[0].split(","))
    assert not (tmp_path / f"out-{2 - finisher[0]}" / "summary.json").exists()

    # a fourth machine: the password from $PGPASSWORD, as a Secret would give it
    reader = {"PGPASSWORD": postgres.password}
    bare = postgres.url("three_hosts", with_password=False)
    config = tmp_path / "exported" / "config.pbtxt"
    config.parent.mkdir()  # a file named with -o goes into a directory that is there
    done = tuner_process("export", "--storage", bare, "--study", "shared", "-o", str(config), env=reader)
    assert done.wait(timeout=60) == 0, done.stdout.read()
    # the same config the finishing host recommended (the first line dates the export)
    assert config.read_text().splitlines()[1:] == (output / "recommended" / "config.pbtxt").read_text().splitlines()[1:]
    read = tmp_path / "read"
    done = tuner_process("finish", "--storage", bare, "--study", "shared", "--output", str(read),
                         "--no-remeasure", env=reader)
    text = done.communicate(timeout=120)[0]
    assert done.returncode == 0, text
    assert (read / "report.html").is_file() and "report:" in text
    assert json.loads((read / "summary.json").read_text())["best"]["params"] == summary["best"]["params"]

    again = tmp_path / "again"
    done = tuner_process("finish", str(study_file), "--storage", url, "--output", str(again), "--quiet")
    text = done.communicate(timeout=180)[0]
    assert done.returncode == 0, text
    remeasured = json.loads((again / "summary.json").read_text())
    assert remeasured["remeasured_on"]["pid"] == done.pid and remeasured["best"]["repeats"]["values"]
    assert study_in(url, "shared").user_attrs["remeasured_on"]["pid"] == done.pid


def test_a_host_killed_measuring_an_incumbent_outside_the_ranges_has_it_measured_elsewhere(tmp_path, postgres):
    # the incumbent (the model's own config) may lie outside the search: Optuna's retry of a stale
    # trial copies its values into the ranges' distributions, which refuse them
    url = postgres.create_database("stale_incumbent")
    s = fake_settings(tmp_path, sampler="grid", trials=100)
    s = dataclasses.replace(s, search=dataclasses.replace(
        s.search, max_batch_size=IntRange(1, 2, log=True), max_queue_delay_microseconds=IntRange(0, 0),
        heartbeat_s=1, grace_period_s=2))
    incumbent = {"max_batch_size": 64, "max_queue_delay_microseconds": 0}
    study = search.open_study(s, url, sampler=search.make_sampler(s.search), incumbent=incumbent)
    worker = subprocess.Popen(fake_worker(s, url, tmp_path), cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not [t for t in study.get_trials(states=(TrialState.RUNNING,))
                                                   if t.params == incumbent]:
            time.sleep(0.05)
        worker.kill()
        worker.wait()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    (killed,) = [t for t in study.get_trials() if t.params == incumbent]
    search.run_trials(study, s, FakeEvaluation(), n_trials=100)  # another host: waits out the grace period, retries it
    trials = study.get_trials()
    assert study.trials[killed.number].state == TrialState.FAIL
    again = [t for t in trials if t.params == incumbent and t.number != killed.number]
    assert len(again) == 1 and again[0].state == TrialState.COMPLETE and again[0].user_attrs["incumbent"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        assert optuna.storages.RetryHeartbeatStaleTrialCallback.retried_trial_number(again[0]) == killed.number
    assert measured(trials) == [(("max_batch_size", 1), ("max_queue_delay_microseconds", 0)),
                                (("max_batch_size", 2), ("max_queue_delay_microseconds", 0))]
    assert search.incumbent_trial(study).number == again[0].number


# --- GPU types ------------------------------------------------------------------------------------


def test_a_host_with_another_gpu_type_is_refused_in_one_line(tmp_path, postgres):
    from tuner.settings import read_study
    from tuner.tune import identity, prepare

    url = postgres.create_database("gpu_types")
    study_file = write_tune_study(tmp_path, "gpus", **GRID)
    p = prepare(read_study(study_file), url)
    first = search.Host("l4-node-1", 1, "NVIDIA L4")
    search.open_study(p.settings, url, sampler=search.make_sampler(p.settings.search), identity=identity(p),
                      host=first, incumbent={"max_batch_size": 64, "max_queue_delay_microseconds": 0})
    # another host with an A100: refused before its server starts, naming both GPU types
    done = tuner_process("tune", str(study_file), "--storage", url, "--quiet", env={GPU_TYPE_ENV: "NVIDIA A100"})
    out = done.communicate(timeout=60)[0]
    lines = [line for line in out.splitlines() if line.startswith("tuner: error:")]
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in out, out
    assert "is measured on 'NVIDIA L4' (its first host, l4-node-1)" in lines[0]
    assert "this host" in lines[0] and "'NVIDIA A100'" in lines[0] and "search.mixed_gpus: true" in lines[0]
    assert postgres.password not in out
    assert len(study_in(url, "gpus").get_trials()) == 1  # only the incumbent the first host enqueued
    # the same GPU type joins
    search.open_study(p.settings, url, sampler=search.make_sampler(p.settings.search), identity=identity(p),
                      host=search.Host("l4-node-2", 2, "NVIDIA L4"))


def test_a_mixed_gpu_study_measures_the_incumbent_once_per_gpu_type(tmp_path, postgres):
    url = postgres.create_database("mixed")
    s = fake_settings(tmp_path, trials=8, sampler="random")
    s = dataclasses.replace(s, search=dataclasses.replace(s.search, mixed_gpus=True))
    incumbent = {"max_batch_size": 4, "max_queue_delay_microseconds": 0}
    hosts = [search.Host("l4-a", 101, "NVIDIA L4"), search.Host("a100-a", 102, "NVIDIA A100"),
             search.Host("l4-b", 103, "NVIDIA L4")]
    for n, host in enumerate(hosts, 1):
        with search.exclusive(url, s.name):
            study = search.open_study(s, url, sampler=search.make_sampler(s.search), incumbent=incumbent, host=host)
            claimed = search.claim_incumbent(study, host)
        assert claimed == (host.name != "l4-b")  # the second L4 host finds its type's incumbent claimed
        if claimed:
            search.add_incumbent(study, s, FakeEvaluation()(incumbent, Hints()), host=host)
        search.run_trials(study, s, FakeEvaluation(), n_trials=3 * n, host=host)
    trials = study.get_trials()
    incumbents = [t for t in trials if t.user_attrs.get("incumbent")]
    assert sorted(t.user_attrs["gpu"] for t in incumbents) == ["NVIDIA A100", "NVIDIA L4"]
    assert all(search.config_of(t) == incumbent and t.state == TrialState.COMPLETE for t in incumbents)
    assert search.incumbent_trial(study) is not None
    assert {(r["host"], r["gpu"]) for r in export.hosts(study)} == {(h.name, h.gpu) for h in hosts}
    assert "NVIDIA A100" in export.hosts_table(export.hosts(study))


# --- one decision at a time ----------------------------------------------------------------------

_HOLDER = """
import sys, time
from tuner.search import exclusive
with exclusive(sys.argv[1], "locked"):
    print("held", flush=True)
    time.sleep(120)
"""


def test_the_study_lock_holds_one_process_at_a_time_and_is_let_go_when_its_holder_dies(postgres):
    url = postgres.create_database("lock")
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, url], stdout=subprocess.PIPE, text=True,
                              cwd=ROOT, start_new_session=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        got = threading.Event()

        def take() -> None:
            with search.exclusive(url, "locked"):
                got.set()

        taker = threading.Thread(target=take, daemon=True)
        taker.start()
        assert not got.wait(1.5)  # held elsewhere: waits
        with search.exclusive(url, "another study"):  # another study's lock is another lock
            pass
        holder.kill()  # kill -9: the database ends its session, and the lock with it
        assert got.wait(10)
        taker.join(5)
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()


def test_the_first_host_to_find_the_search_over_re_measures_and_the_others_are_told(tmp_path, postgres):
    url = postgres.create_database("finish")
    s = fake_settings(tmp_path, trials=4, sampler="random")
    a, b = search.Host("node-a", 201, "cpu"), search.Host("node-b", 202, "cpu")
    study = search.open_study(s, url, sampler=search.make_sampler(s.search), incumbent=None, host=a)
    search.run_trials(study, s, FakeEvaluation(), n_trials=4, host=a)
    with warnings.catch_warnings():  # Optuna would rather heartbeats ran in optimize: here a trial stands still
        warnings.simplefilter("ignore", UserWarning)
        running = study.ask()  # another host measures a trial: nobody finishes yet
    running.set_user_attr("host", "node-c")
    by = search.claim_finish(study, a)
    assert by["running"] == running.number
    # a host does not wait for another's trial (its GPU is free): it says who measures, and the way out
    said = Handover(study.study_name, url, by, 4).message("gpu_study.yaml")
    assert f"node-c (pid None, None) still measures trial {running.number}: the last host to finish" in said
    assert said.endswith(f"If that host stops, run: tuner finish gpu_study.yaml --storage {url}")  # not a placeholder
    study.tell(running, 1.0)
    assert search.claim_finish(study, a) is None  # a first: it re-measures
    claim = search.claim_finish(study, b)
    assert (claim["host"], claim["pid"]) == ("node-a", 201)
    assert search.claim_finish(study, b, force=True) is None  # `tuner finish` takes it over
    assert study.user_attrs["finishing"]["host"] == "node-b"


# --- bad input --------------------------------------------------------------------------------------


def _one_line(out: str) -> str:
    lines = [line for line in out.splitlines() if line.startswith("tuner: error:")]
    assert len(lines) == 1 and "Traceback" not in out, out
    return lines[0]


@pytest.mark.parametrize("case", ["unreachable", "wrong password", "no such database"])
def test_a_database_that_cannot_be_used_is_one_line_and_exit_2(tmp_path, postgres, capsys, case):
    (closed,) = free_ports(1)
    url = {"unreachable": f"postgresql://tuner:{postgres.password}@127.0.0.1:{closed}/tuner",
           "wrong password": postgres.url("postgres", password="not-the-password"),
           "no such database": postgres.url("nosuch")}[case]
    study_file = write_tune_study(tmp_path, "bad", **GRID)
    for argv in (["tune", str(study_file), "--storage", url, "--quiet"],
                 ["export", "--storage", url, "--study", "bad"],
                 ["finish", "--storage", url, "--study", "bad", "--output", str(tmp_path / "o"), "--no-remeasure"]):
        assert main(argv) == 2, argv
        line = _one_line(capsys.readouterr().err)
        expected = {"unreachable": "Connection refused", "wrong password": "password authentication failed",
                    "no such database": 'database "nosuch" does not exist'}[case]
        assert "cannot open" in line and expected in line, line
        assert postgres.password not in line and "not-the-password" not in line
    assert not (tmp_path / "bad" / "study.db").exists()


@pytest.mark.parametrize("case", ["unreachable", "wrong password", "no such database"])
def test_tune_check_reaches_the_database_and_refuses_one_it_cannot_use(tmp_path, postgres, capsys, case):
    (closed,) = free_ports(1)
    url = {"unreachable": f"postgresql://tuner:{postgres.password}@127.0.0.1:{closed}/tuner",
           "wrong password": postgres.url("postgres", password="not-the-password"),
           "no such database": postgres.url("nosuch")}[case]
    study_file = write_tune_study(tmp_path, "bad", **GRID)
    assert main(["tune", str(study_file), "--storage", url, "--check"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "cannot open" in line and postgres.password not in line, line
    assert not (tmp_path / "bad").exists()  # checked before the output directory is made


def test_tune_check_on_a_database_it_reaches_makes_no_table(tmp_path, postgres, capsys):
    from sqlalchemy import create_engine, inspect

    url = postgres.create_database("checked")
    assert main(["tune", str(write_tune_study(tmp_path, "ok", **GRID)), "--storage", url, "--check"]) == 0
    assert "ok (nothing was started)" in capsys.readouterr().out
    engine = create_engine(url)
    try:
        assert inspect(engine).get_table_names() == []
    finally:
        engine.dispose()
    assert not (tmp_path / "ok").exists()


def test_tune_check_reads_the_study_in_the_database_as_the_run_does(tmp_path, postgres, capsys):
    """`--check` against a database server: a study measured against another SLA, and a study of the
    same name that tuner did not make, are refused as the run refuses them, and nothing is written."""
    from tuner.settings import read_study
    from tuner.tune import identity, prepare

    url = postgres.create_database("resumed")
    study_file = write_tune_study(tmp_path, "again", **GRID)
    p = prepare(read_study(study_file), url)
    search.open_study(p.settings, url, sampler=search.make_sampler(p.settings.search), identity=identity(p))
    assert main(["tune", str(study_file), "--storage", url, "--check"]) == 0
    assert "resumes study 'again': 0 trial(s) measured of 0" in capsys.readouterr().out
    changed = write_tune_study(tmp_path, "again", **GRID, **{"sla.latency_ms": 150})
    assert main(["tune", str(changed), "--storage", url, "--check"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "was measured with another sla.latency_ms" in line and "-> 150" in line, line
    theirs = optuna.create_study(study_name="theirs", storage=url, direction="maximize")
    theirs.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    for argv in (["--check"], ["--quiet"]):
        assert main(["tune", str(write_tune_study(tmp_path, "theirs", **GRID)), "--storage", url, *argv]) == 2
        assert "was not made by tuner" in _one_line(capsys.readouterr().err)
    assert study_in(url, "theirs").user_attrs == {} and len(study_in(url, "theirs").trials) == 1


def test_a_missing_database_driver_is_one_line_and_exit_2(tmp_path):
    study_file = write_tune_study(tmp_path, "nodriver", **GRID)
    # the driver hidden from this interpreter, as where `tuner[postgres]` was not installed
    code = ("import sys; sys.modules['psycopg'] = sys.modules['psycopg2'] = None; "
            "from tuner.cli import main; sys.exit(main(sys.argv[1:]))")
    for argv in (["tune", str(study_file), "--storage", "postgresql://tuner:pw@127.0.0.1:5432/tuner"],
                 ["export", "--storage", "postgresql://tuner:pw@127.0.0.1:5432/tuner"]):
        done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=ROOT,
                              timeout=60)
        line = _one_line(done.stderr)
        assert done.returncode == 2 and "pip install 'tuner[postgres]'" in line and ":pw@" not in line, line


# --- one host, the default storage -----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.usefixtures("one_multi_process_study_at_a_time")
def test_a_study_on_the_default_storage_stopped_mid_trial_completes_with_the_same_command(tmp_path):
    # the claim is the resume, not the capacity: an SLA a loaded machine still meets (stop 62's CI measured
    # the incumbent's p99 at 142 ms against 100, and the run rightly exited 3, nothing feasible)
    study_file = write_tune_study(tmp_path, "single", **{**GRID, "search.max_batch_size": {"low": 16, "high": 16},
                                                    "search.max_queue_delay_microseconds": {"low": 0, "high": 0},
                                                    "sla.latency_ms": 1000, **QUICK_TRIALS})
    output = tmp_path / "single"
    db = f"sqlite:///{output / 'study.db'}"
    first_log = tmp_path / "first.log"
    first = tuner_process("tune", str(study_file), "--quiet", log=first_log)
    try:
        # a generous deadline: four test workers on 2 cores slow a trial several times (CI: the incumbent
        # alone took over 120 s); a run that ended before is a failure of its own, said with its log
        deadline, states = time.monotonic() + 300, []
        while time.monotonic() < deadline and first.poll() is None:
            time.sleep(0.5)
            if (output / "study.db").exists():
                try:
                    states = [t.state for t in study_in(db, "single").get_trials()]
                except (KeyError, SettingsError):  # the study (or its tables) being made
                    continue
                if TrialState.COMPLETE in states and TrialState.RUNNING in states:
                    break
        else:
            pytest.fail(f"no trial in flight after a finished one (exit {first.poll()}, trials {states}): "
                        f"{first_log.read_text()[-3000:]}")
        first.send_signal(signal.SIGTERM)  # as a scheduler stops a job
        first.wait(timeout=60)
        log = first_log.read_text()
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    assert first.returncode == 143, log
    again = tuner_process("tune", str(study_file), "--quiet")
    log = again.communicate(timeout=360)[0]
    assert again.returncode == 0, log
    trials = study_in(db, "single").get_trials()
    done = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    seen = [(t.number, t.state.name, t.params, t.user_attrs.get("note")) for t in trials]
    assert measured(trials) == [(("max_batch_size", 16), ("max_queue_delay_microseconds", 0))], (seen, log)
    assert len(done) == 2 and not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    summary = json.loads((output / "summary.json").read_text())
    assert summary["storage"] == db and summary["remeasured_on"]["pid"] == again.pid
    assert (output / "report.html").is_file() and "outputs:" in log


# --- the deployment example -------------------------------------------------------------------------


def test_the_parallel_job_runs_tuner_tune_on_every_pod_against_one_database_with_no_password_in_sight():
    import yaml

    from tuner.cli import build_parser

    docs = {d["kind"]: d for d in yaml.safe_load_all((ROOT / "deploy" / "parallel-tune.yaml").read_text())}
    job, service = docs["Job"], docs["Service"]
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] >= 2
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = build_parser().parse_args(container["command"][1:])
    assert args.command == "tune" and args.func.__module__ == "tuner.cli.tune_cmd"
    assert args.storage == f"postgresql://tuner@{service['metadata']['name']}:5432/tuner"  # the service, no secret
    env = {e["name"]: e for e in container["env"]}
    assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "tuner-postgres"
    # one pod per GPU node, all of one GPU type
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    assert anti["labelSelector"]["matchLabels"] == job["spec"]["template"]["metadata"]["labels"]
    assert "nvidia.com/gpu.product" in pod["nodeSelector"] and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
