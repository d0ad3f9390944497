"""The Optuna loop with a real storage (SQLite by default, a journal file of earlier versions) and an
injected evaluation (a pure function of the configuration, like httpx's MockTransport): incumbent
first, SLA constraint, pruning, grid ground truth, unmeasured trials, resume after Ctrl-C, a worker
killed mid-trial (Optuna's heartbeat), two worker processes, re-measurement."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
import warnings

import optuna
import pandas as pd
import pytest
from optuna.trial import TrialState
from support import FakeEvaluation, SlowFakeEvaluation, capacity_of, fake_settings, fake_worker, latency_of

from tuner import search, space
from tuner.errors import SettingsError
from tuner.settings import IntRange, SearchSettings, study_from_dict
from tuner.trial import UNMEASURED, Hints

optuna.logging.set_verbosity(optuna.logging.WARNING)

INCUMBENT = {"max_batch_size": 4, "max_queue_delay_microseconds": 0}


@contextlib.contextmanager
def fake_session(latency_ms: float = 30.0):
    yield SlowFakeEvaluation(latency_ms)


def best_in_grid(search_settings: SearchSettings, latency_ms: float = 30.0) -> float:
    g = space.grid(search_settings)
    values = [
        capacity_of({"max_batch_size": b, "max_queue_delay_microseconds": d})
        for b in g["max_batch_size"]
        for d in g["max_queue_delay_microseconds"]
        if latency_of({"max_batch_size": b, "max_queue_delay_microseconds": d}) <= latency_ms
    ]
    return max(values)


def new_study(s, storage=None, incumbent=INCUMBENT):
    storage = storage or search.storage_url(s)
    return search.open_study(s, storage, sampler=search.make_sampler(s.search), incumbent=incumbent,
                             metadata={"scoring": s.scoring, "storage": storage})


def test_incumbent_first_constraint_recorded_and_trial_budget_kept(tmp_path):
    s = fake_settings(tmp_path, trials=6)
    study = new_study(s)
    fake = FakeEvaluation()
    search.run_trials(study, s, fake, n_trials=6)
    trials = study.get_trials()
    assert fake.calls[0][0] == INCUMBENT and trials[0].user_attrs["incumbent"] is True
    assert len(trials) == 6 and all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    for t in trials:
        assert t.constraints["sla"] == pytest.approx(latency_of(t.params) / 30.0 - 1.0)
    # the first trial had nothing to start from; later ones start at the best trial's capacity
    assert fake.calls[0][1] == Hints()
    assert any(h.start_speed is not None and h.beat_rps is not None for _, h in fake.calls[1:])


def test_grid_is_exhaustive_and_finds_the_optimum(tmp_path):
    s = fake_settings(tmp_path, sampler="grid")
    study = new_study(s)
    # no pruning in the ground truth: every configuration gets its full capacity search
    fake = FakeEvaluation()
    search.run_trials(
        study, s, lambda p, h: fake(p, Hints(h.start_speed)), n_trials=10_000
    )
    size = space.grid_size(s.search)
    assert size == 7 * 5
    configs = {tuple(sorted(t.params.items())) for t in study.trials if not t.user_attrs.get("incumbent")}
    assert len(configs) == size
    assert study.best_trial.user_attrs["capacity_rps"] == pytest.approx(best_in_grid(s.search))


def test_tpe_gets_near_the_optimum_measuring_a_quarter_of_the_grid(tmp_path):
    s = fake_settings(tmp_path, trials=9)
    study = new_study(s)
    search.run_trials(study, s, FakeEvaluation(), n_trials=9)
    assert len(study.trials) <= 0.26 * space.grid_size(s.search)
    best = search.top_trials(study, 1)[0]
    assert best.user_attrs["capacity_rps"] >= 0.95 * best_in_grid(s.search)


def test_pruning_stops_trials_that_cannot_beat_the_best(tmp_path):
    s = fake_settings(tmp_path, trials=12)
    study = new_study(s)
    search.run_trials(study, s, FakeEvaluation(), n_trials=12)
    pruned = [t for t in study.trials if t.state == TrialState.PRUNED]
    assert pruned, "some configurations worse than the best should have been pruned"
    best = max(t.user_attrs["capacity_rps"] for t in study.trials if t.state == TrialState.COMPLETE)
    assert all(t.user_attrs["capacity_rps"] <= best for t in pruned)


def test_utilization_scoring_does_not_prune_on_capacity(tmp_path):
    s = fake_settings(tmp_path, trials=8, scoring="utilization")
    study = new_study(s)
    fake = FakeEvaluation()
    search.run_trials(study, s, fake, n_trials=8)
    assert all(h.beat_rps is None for _, h in fake.calls)
    assert study.best_value == pytest.approx(study.best_trial.user_attrs["score_utilization"])


def test_interrupted_trial_is_failed_then_retried_and_no_finished_trial_is_lost(tmp_path):
    s = fake_settings(tmp_path, trials=7)
    study = new_study(s)
    with pytest.raises(KeyboardInterrupt):
        search.run_trials(study, s, FakeEvaluation(interrupt_at=4), n_trials=7)
    before = {t.number: t.params for t in study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))}
    (failed,) = study.get_trials(states=(TrialState.FAIL,))
    assert len(before) == 3 and failed.user_attrs["error"] == "interrupted"

    again = new_study(s)  # the same command, run again
    assert search.requeue_interrupted(again) == [failed.number]
    # the progress bar's start: the 3 finished, not the interrupted one waiting to be measured again
    assert search.spent_done(again) == 3 and search.finished_count(again) == 4
    fake = FakeEvaluation()
    search.run_trials(again, s, fake, n_trials=7)
    assert fake.calls[0][0] == failed.params  # the interrupted configuration is measured first
    done = {t.number: t.params for t in again.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))}
    assert len(done) == 7 and all(done[n] == p for n, p in before.items())
    assert search.spent_done(again) == 7  # the interrupted trial counted once, by its retry
    assert search.requeue_interrupted(again) == []  # retried once only


def test_an_incumbent_measured_after_a_better_trial_is_never_pruned(tmp_path):
    """Ctrl-C while the incumbent is measured, with a better configuration queued behind it (the model
    strategy's picks, another worker's trial): the resumed run measures the better one first, then the
    incumbent's retry, whose capacity search must run to its bracket, not be pruned against the best."""
    s = fake_settings(tmp_path, trials=3)
    study = new_study(s)
    better = {"max_batch_size": 32, "max_queue_delay_microseconds": 0}
    study.enqueue_trial(better)
    with pytest.raises(KeyboardInterrupt):
        search.run_trials(study, s, FakeEvaluation(interrupt_at=1), n_trials=3)

    again = new_study(s)
    assert search.requeue_interrupted(again) == [0]
    fake = FakeEvaluation()
    search.run_trials(again, s, fake, n_trials=2)
    assert [p for p, _ in fake.calls] == [better, INCUMBENT]  # the queue's order: the incumbent last
    assert fake.calls[1][1].beat_rps is None and fake.calls[1][1].start_speed is not None
    retry = search.incumbent_trial(again)
    assert retry is not None and retry.user_attrs["retry_of"] == 0 and retry.state == TrialState.COMPLETE
    # a trial that is not the incumbent is still pruned against the best
    assert search.requeue_interrupted(again) == []
    again.enqueue_trial({"max_batch_size": 2, "max_queue_delay_microseconds": 0})
    search.run_trials(again, s, fake, n_trials=3)
    assert fake.calls[2][1].beat_rps is not None and again.trials[-1].state == TrialState.PRUNED


class InterruptInsideAsk(optuna.samplers.RandomSampler):
    """Signals this process from inside `study.ask()` of trial `at`: after Optuna has written the
    trial's RUNNING row, before the objective runs (where a Ctrl-C used to leave the trial RUNNING)."""

    def __init__(self, at: int, signum: int):
        super().__init__(seed=1)
        self.at, self.signum = at, signum

    def before_trial(self, study, trial):
        super().before_trial(study, trial)
        if trial.number == self.at:
            os.kill(os.getpid(), self.signum)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("at", [0, 2])  # the enqueued incumbent; a trial the sampler draws
def test_an_interrupt_inside_optunas_bookkeeping_fails_its_trial_and_the_study_resumes(tmp_path, signum, at):
    from tuner.errors import Terminated, sigterm_as_interrupt

    s = fake_settings(tmp_path, trials=5)
    study = new_study(s)
    study.sampler = InterruptInsideAsk(at, signum)
    with pytest.raises(Terminated if signum == signal.SIGTERM else KeyboardInterrupt), sigterm_as_interrupt():
        search.run_trials(study, s, FakeEvaluation(), n_trials=5)
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * at + [TrialState.FAIL]
    assert trials[at].user_attrs["error_kind"] == "interrupted"

    again = new_study(s)
    # the trial's configuration was drawn before the interrupt was let through: it is measured again
    assert search.requeue_interrupted(again) == [at]
    fake = FakeEvaluation()
    search.run_trials(again, s, fake, n_trials=5)
    measured = [t for t in again.get_trials() if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(measured) == 5 and not again.get_trials(states=(TrialState.RUNNING,))
    assert INCUMBENT in [t.params for t in measured]


def test_an_interrupt_inside_ask_of_a_grid_study_loses_no_grid_point(tmp_path):
    """The grid point's id is given inside `ask`: the interrupted trial must be retried with it, or the
    study ends with that point never measured (CI once finished a two-worker grid study one short)."""
    s = fake_settings(tmp_path, trials=10_000, sampler="grid")
    study = new_study(s)
    sampler = study.sampler
    original = sampler.before_trial

    def interrupting(study_, trial):
        original(study_, trial)
        if trial.number == 2:
            os.kill(os.getpid(), signal.SIGINT)

    sampler.before_trial = interrupting
    with pytest.raises(KeyboardInterrupt):
        search.run_trials(study, s, FakeEvaluation(), n_trials=10_000)
    sampler.before_trial = original
    failed = study.get_trials(states=(TrialState.FAIL,))
    assert [t.number for t in failed] == [2] and failed[0].params and "grid_id" in failed[0].system_attrs

    again = new_study(s)
    assert search.requeue_interrupted(again) == [2]
    search.run_trials(again, s, FakeEvaluation(), n_trials=10_000)
    measured = {tuple(sorted(t.params.items())) for t in again.get_trials()
                if t.state in (TrialState.COMPLETE, TrialState.PRUNED)}  # the incumbent is a grid point here
    assert len(measured) == space.grid_size(s.search)


def test_a_grid_draw_of_the_point_a_retry_just_took_from_the_queue_is_its_duplicate():
    """Two workers of a resumed grid study: one takes the interrupted point's retry from the queue, the
    other draws that point from the grid before the retry suggested it (no parameters yet). The earlier
    trial keeps it by what it was enqueued with (CI: both measured it, four trials where three were due)."""
    from tuner.search._loop import _twin

    study = optuna.create_study()
    point = {"max_batch_size": 16, "max_queue_delay_microseconds": 0}
    study.enqueue_trial(point, user_attrs={"retry_of": 2})
    retry = study.ask()  # RUNNING, its parameters not suggested yet
    assert retry.params == {}
    drawn_later = study.ask()
    assert _twin(study, drawn_later.number, point) == retry.number
    assert _twin(study, retry.number, point) is None  # the earlier keeps it, whichever looks first
    drawn_later.suggest_int("max_batch_size", 16, 16)
    drawn_later.suggest_int("max_queue_delay_microseconds", 0, 0)
    assert _twin(study, retry.number, point) is None and _twin(study, drawn_later.number, point) == retry.number


def test_a_journal_from_an_earlier_version_resumes_and_a_dead_process_trial_is_retried(tmp_path):
    s = fake_settings(tmp_path, trials=3)
    journal = tmp_path / "out" / "study.journal"
    first = new_study(s, str(journal))
    search.run_trials(first, s, FakeEvaluation(), n_trials=2)
    assert search.storage_url(s) == str(journal)  # the output directory's journal is kept
    trial = first.ask()
    space.suggest(trial, s.search)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    trial.set_user_attr("host", __import__("socket").gethostname())
    trial.set_user_attr("pid", int(dead.stdout))
    again = new_study(s, str(journal))
    assert search.requeue_interrupted(again) == [trial.number]  # no heartbeat in a journal: the pid tells
    assert again.trials[trial.number].state == TrialState.FAIL
    search.run_trials(again, s, FakeEvaluation(), n_trials=3)
    assert search.counts(again)["complete"] + search.counts(again)["pruned"] == 3


def test_a_refused_configuration_fails_its_trial_and_the_study_goes_on(tmp_path):
    s = fake_settings(tmp_path, trials=6, sampler="random")
    study = new_study(s, incumbent={"max_batch_size": 2, "max_queue_delay_microseconds": 0})
    search.run_trials(study, s, FakeEvaluation(fail_config=2), n_trials=6)
    failed = study.get_trials(states=(TrialState.FAIL,))
    assert failed and failed[0].user_attrs["error_kind"] == "config"
    assert search.finished_count(study) == 6
    assert search.requeue_interrupted(study) == []  # the server refused it: not retried


def test_unmeasured_trials_are_failed_not_infeasible_and_the_study_goes_on(tmp_path):
    s = fake_settings(tmp_path, trials=8, sampler="grid")
    s = dataclasses.replace(s, search=dataclasses.replace(
        s.search, max_batch_size=IntRange(1, 8, log=True), max_queue_delay_microseconds=IntRange(0, 1000, step=1000)))
    study = new_study(s)
    search.run_trials(study, s, FakeEvaluation(unmeasured={2, 8}), n_trials=100)
    unmeasured = [t for t in study.trials if t.user_attrs.get("outcome") == UNMEASURED]
    assert {t.params["max_batch_size"] for t in unmeasured} == {2, 8}
    assert all(t.state == TrialState.FAIL and not t.constraints and "send lag" in t.user_attrs["note"]
               for t in unmeasured)
    counts = search.counts(study)
    assert counts["unmeasured"] == 4 and counts["failed"] == 0 and counts["feasible"] == counts["complete"] - 0
    best = search.best_trial(study)
    assert best is not None and best.params["max_batch_size"] == 4  # decided on the measured ones


def test_every_trial_unmeasured_ends_the_study_without_a_loop(tmp_path):
    s = fake_settings(tmp_path, trials=5, sampler="random")
    study = new_study(s)
    fake = FakeEvaluation(unmeasured=set(range(1, 65)))
    search.run_trials(study, s, fake, n_trials=5)
    assert len(fake.calls) == 5 and search.counts(study)["unmeasured"] == 5 and search.best_trial(study) is None


def test_two_worker_processes_share_the_storage_without_duplicates_or_losses(tmp_path):
    s = fake_settings(tmp_path, trials=10, sampler="random")
    study = new_study(s)
    search.run_workers(s, fake_session, search.storage_url(s), n_trials=10, workers=2)
    trials = study.get_trials()
    assert sorted(t.number for t in trials) == list(range(len(trials)))
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    assert 10 <= len(trials) <= 11  # Optuna's budget check runs after each trial: one extra at most
    assert len({t.user_attrs["pid"] for t in trials}) == 2 and os.getpid() not in {
        t.user_attrs["pid"] for t in trials
    }


def test_a_worker_killed_mid_trial_is_retried_by_the_other_after_the_grace_period(tmp_path):
    s = fake_settings(tmp_path, sampler="grid", trials=100)
    search_settings = dataclasses.replace(
        s.search, max_batch_size=IntRange(1, 4, log=True), max_queue_delay_microseconds=IntRange(0, 2000, step=1000),
        heartbeat_s=1, grace_period_s=3)
    s = dataclasses.replace(s, search=search_settings)
    study = new_study(s, incumbent=None)
    url = search.storage_url(s)
    command = fake_worker(s, url, tmp_path)
    logs = [open(tmp_path / f"worker-{i}.log", "w+") for i in range(2)]
    workers = [subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT) for log in logs]
    try:
        deadline = time.monotonic() + 30
        victim = None
        while victim is None and time.monotonic() < deadline:  # kill -9 the first worker with a trial running
            for t in study.get_trials(states=(TrialState.RUNNING,)):
                if t.user_attrs.get("pid") == workers[0].pid and t.params:  # drawn, being measured
                    victim = t
            time.sleep(0.05)
        assert victim is not None, "the first worker never ran a trial"
        workers[0].send_signal(signal.SIGKILL)
        assert workers[1].wait(timeout=90) == 0, (tmp_path / "worker-1.log").read_text()[-2000:]
    finally:
        for w, log in zip(workers, logs, strict=True):
            if w.poll() is None:
                w.kill()
            w.wait()
            log.close()
    trials = study.get_trials()
    killed = study.trials[victim.number]
    assert killed.state == TrialState.FAIL
    complete = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    measured = sorted(tuple(sorted(t.params.items())) for t in complete)
    grid = sorted(tuple(sorted({"max_batch_size": b, "max_queue_delay_microseconds": d}.items()))
                  for b in (1, 2, 4) for d in (0, 1000, 2000))
    assert measured == grid  # every configuration measured exactly once, the killed one included
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        retry = [t for t in complete
                 if optuna.storages.RetryHeartbeatStaleTrialCallback.retried_trial_number(t) == killed.number]
    assert len(retry) == 1 and retry[0].params == killed.params  # run again by the surviving worker
    assert retry[0].user_attrs["pid"] == workers[1].pid


def test_a_trial_whose_worker_dies_before_optunas_first_heartbeat_is_still_found_stale(tmp_path):
    # Optuna's heartbeat thread writes a trial's first heartbeat when it is first scheduled, and never
    # finds a RUNNING trial without one stale: a worker killed in between left a trial the others waited
    # for for good (CI, under load). A trial's draw writes one at once (search._store.beat_now).
    from tuner.search._store import beat_now

    s = fake_settings(tmp_path, sampler="grid", trials=100)
    s = dataclasses.replace(s, search=dataclasses.replace(s.search, heartbeat_s=1, grace_period_s=1))
    study = new_study(s, incumbent=None)
    silent, beaten = study.ask(), study.ask()  # two workers killed before their heartbeat thread ran
    beat_now(beaten)
    time.sleep(2.5)
    optuna.storages.fail_stale_trials(study)
    states = {t.number: t.state for t in study.get_trials()}
    assert states[silent.number] == TrialState.RUNNING and states[beaten.number] == TrialState.FAIL


def test_remeasure_is_interleaved_and_recommends_by_median(tmp_path):
    s = fake_settings(tmp_path, trials=12, sampler="grid", top_k=2, remeasure_repeats=3)
    s = dataclasses.replace(
        s,
        search=dataclasses.replace(
            s.search, max_batch_size=IntRange(16, 32, log=True), max_queue_delay_microseconds=IntRange(0, 0)
        ),
    )
    study = new_study(s)
    search.run_trials(study, s, lambda p, h: FakeEvaluation()(p, Hints()), n_trials=100)
    # 32 wins the search, but one of its re-measurements was a lucky outlier: 16 is better by median
    noisy = FakeEvaluation(noise={32: [0.5, 0.5, 3.0], 16: [1.0]})
    remeasured = search.remeasure(study, noisy, s)
    order = [p["max_batch_size"] for p, _ in noisy.calls]
    assert order == [32, 16, 4, 4, 16, 32, 32, 16, 4]  # top 2 and the incumbent, interleaved in mirrored rounds
    ranked = search.recommend([search.repeats_as_dict(r) for r in remeasured])  # as `tuner export` reads them
    assert [r["params"]["max_batch_size"] for r in ranked] == [16, 32, 4]
    best = next(r for r in remeasured if r.trial == ranked[0]["trial"])
    assert best.params["max_batch_size"] == 16 and best.observed_spread == pytest.approx(0.0)
    assert best.spread == pytest.approx(0.1)  # never below the capacity bracket (10 % wide in the fake)
    worst = next(r for r in remeasured if r.params["max_batch_size"] == 32)
    assert worst.spread == pytest.approx((3.0 - 0.5) / 0.5)
    assert next(r for r in remeasured if r.incumbent).params == INCUMBENT


def test_the_recommendation_is_the_best_median_that_met_the_sla():
    stored = [{"trial": 1, "median": 5.0, "feasible_runs": 2, "values": [5.0, 5.0]},
              {"trial": 2, "median": 7.0, "feasible_runs": 0, "values": [7.0, 7.0]},
              {"trial": 3, "median": 0.0, "feasible_runs": 1, "values": [0.0, 0.0, 1.0]},
              {"trial": 4, "median": 6.0, "feasible_runs": 1, "values": [6.0]},
              {"trial": 5, "median": 6.0, "feasible_runs": 3, "values": [6.0, 6.0, 6.0]},
              # met the SLA in one of two repeats: its median is half a measurement, and it is not confirmed
              {"trial": 6, "median": 9.0, "feasible_runs": 1, "values": [0.0, 18.0]},
              {"trial": 7, "median": 8.0, "feasible_runs": 2, "values": [0.0, 8.0, 9.0]}]
    assert [r["trial"] for r in search.recommend(stored)] == [7, 4, 5, 1]  # a tie keeps the re-measurement's order
    # a tie with the incumbent goes to it: a change that gains nothing (+0.0 %) is not recommended
    tied = [{"trial": 3, "median": 6.0, "feasible_runs": 2}, {"trial": 0, "median": 6.0, "feasible_runs": 2,
                                                            "incumbent": True}]
    assert [r["trial"] for r in search.recommend(tied)] == [0, 3]


def test_no_configuration_meets_the_sla(tmp_path):
    s = fake_settings(tmp_path, trials=5, latency_ms=1.0)
    study = new_study(s)
    search.run_trials(study, s, FakeEvaluation(latency_ms=1.0), n_trials=5)
    assert search.top_trials(study, 3) == []
    fake = FakeEvaluation(latency_ms=1.0)
    assert search.remeasure(study, fake, s) == [] and fake.calls == []
    assert search.recommend([]) == []


def test_grid_per_octave_must_be_positive(tmp_path):
    with pytest.raises(SettingsError, match="search.grid_per_octave: must be > 0, got 0"):
        study_from_dict({"name": "fake", "model_repository": str(tmp_path), "model": "m",
                         "traffic": {"path": "t.csv"}, "search": {"grid_per_octave": 0}}, base_dir=tmp_path)


def test_any_optuna_url_works_as_storage_and_the_default_is_sqlite_with_heartbeats(tmp_path):
    s = fake_settings(tmp_path, trials=4, sampler="random")
    url = f"sqlite:///{tmp_path / 'other.db'}"
    study = new_study(s, url)
    search.run_trials(study, s, FakeEvaluation(), n_trials=4)
    again = optuna.load_study(study_name="fake", storage=url)
    assert search.finished_count(again) == 4 and again.trials[0].user_attrs["incumbent"]
    assert search.storage_url(s) == f"sqlite:///{tmp_path / 'out' / 'study.db'}"
    storage = search.open_storage(search.storage_url(s), s.search)
    assert storage.get_heartbeat_interval() == s.search.heartbeat_s


@pytest.mark.parametrize("url, message", [
    ("postgresql://tuner:secret@127.0.0.1:9/tuner", "cannot open"),
    ("nosuchdb://x/y", "unknown database scheme 'nosuchdb'"),
    ("postgres://tuner:secret@127.0.0.1:9/tuner", "did you mean postgresql://"),
    ("postgresql://tuner:secret@127.0.0.1:abc/tuner", "the port 'abc' is not a number"),
    ("postgresql+psycopg2://tuner:secret@127.0.0.1:9/tuner",
     "): install the driver SQLAlchemy names for this URL (tuner[postgres] installs psycopg 3, for postgresql://)"),
])
def test_a_storage_that_cannot_be_opened_is_one_line_without_its_password(tmp_path, url, message):
    with pytest.raises(SettingsError) as exc:
        search.open_storage(url, SearchSettings())
    text = str(exc.value)
    assert message in text and "\n" not in text and "secret" not in text


def test_resuming_with_another_sla_or_traffic_is_refused_naming_what_changed(tmp_path):
    s = fake_settings(tmp_path, trials=2)
    url = search.storage_url(s)
    identity = {"model": "m", "sla": {"latency_ms": 30.0}, "traffic": "100 requests, hash 1"}
    search.open_study(s, url, sampler=search.make_sampler(s.search), identity=identity)
    search.open_study(s, url, sampler=search.make_sampler(s.search), identity=identity)  # same: resumes
    changed = {**identity, "sla": {"latency_ms": 50.0}}
    with pytest.raises(SettingsError, match=r"was measured with another sla.latency_ms \(30.0 -> 50.0\): .*"
                                            r"start fresh with --output NEW_DIR$"):
        search.open_study(s, url, sampler=search.make_sampler(s.search), identity=changed)
    # what an earlier tuner did not record is no change; what it recorded still is, however deep
    newer = {**identity, "measurement": {"lag_budget_ms": 20.0}}
    search.open_study(s, url, sampler=search.make_sampler(s.search), identity=newer)
    recorded = dataclasses.replace(s, name="recorded")
    search.open_study(recorded, url, sampler=search.make_sampler(s.search), identity=newer)
    with pytest.raises(SettingsError, match=r"another measurement.lag_budget_ms \(20.0 -> 50.0\)"):
        search.open_study(recorded, url, sampler=search.make_sampler(s.search),
                          identity={**identity, "measurement": {"lag_budget_ms": 50.0}})


def test_a_study_of_the_same_name_that_tuner_did_not_make_is_refused_and_left_as_it_was(tmp_path):
    import hashlib

    s = fake_settings(tmp_path, trials=2)
    url = search.storage_url(s)
    pathlib.Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    theirs = optuna.create_study(study_name=s.name, storage=url, direction="maximize")
    theirs.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    db = pathlib.Path(url.removeprefix("sqlite:///"))
    before = hashlib.md5(db.read_bytes()).hexdigest()
    identity = {"model": "m"}
    for attempt in (lambda: search.check_resume(s, url, identity=identity),
                    lambda: search.open_study(s, url, sampler=search.make_sampler(s.search), identity=identity)):
        with pytest.raises(SettingsError, match=rf"study {s.name!r} in .* was not made by tuner \(it holds 2 "
                                                r"trial\(s\) and none of tuner's records\)"):
            attempt()
    assert hashlib.md5(db.read_bytes()).hexdigest() == before
    # a study tuner began to make, stopped before it marked it made, is finished on the next run
    other = dataclasses.replace(s, name="half-made")
    half = optuna.create_study(study_name="half-made", storage=url, direction="maximize")
    half.set_user_attr("identity", identity)
    assert search.open_study(other, url, sampler=search.make_sampler(s.search), identity=identity).user_attrs["created"]


def test_a_resume_refusal_names_the_changed_config_field_in_one_line_and_a_remedy_that_works(tmp_path):
    from tuner import modelconfig

    template = pathlib.Path(__file__).resolve().parent.parent / "model_repository_templates" / "encoder_sim"
    before = (template / "config.pbtxt").read_text()
    config = modelconfig.parse(before)
    config.dynamic_batching.max_queue_delay_microseconds = 700
    identity = {"model": "m", "base_config": before}
    s = fake_settings(tmp_path, trials=2)
    url = search.storage_url(s)
    search.open_study(s, url, sampler=search.make_sampler(s.search), identity=identity)
    with pytest.raises(SettingsError) as exc:
        search.open_study(s, url, sampler=search.make_sampler(s.search),
                          identity={**identity, "base_config": modelconfig.to_text(config)})
    text = str(exc.value)
    assert "\n" not in text and "another base_config.dynamic_batching.max_queue_delay_microseconds" in text
    assert "(None -> 700)" in text or "(0 -> 700)" in text, text
    # a storage outside the output directory: a new directory alone would resume the same study
    shared = f"sqlite:///{tmp_path / 'shared.db'}"
    search.open_study(s, shared, sampler=search.make_sampler(s.search), identity=identity)
    with pytest.raises(SettingsError, match="start fresh with another name: in the study file and --output"):
        search.open_study(s, shared, sampler=search.make_sampler(s.search), identity={**identity, "model": "n"})


@pytest.mark.parametrize("storage, message", [
    ("notes.txt", "exists and is not an Optuna journal"),
    ("sqlite:///notes.txt", "exists and is not an SQLite database"),
    ("garbage!!", "neither a storage URL"),
    ("postgres//user@host/db", "neither a storage URL"),
    ("somedir", "is a directory"),
])
def test_a_storage_that_is_someones_file_or_no_storage_is_refused_and_left_untouched(tmp_path, monkeypatch,
                                                                                     storage, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("my notes\n")
    (tmp_path / "somedir").mkdir()
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(SettingsError) as exc:
        search.open_storage(storage, SearchSettings())
    assert message in str(exc.value) and storage in str(exc.value) and "\n" not in str(exc.value)
    assert (tmp_path / "notes.txt").read_text() == "my notes\n"
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no journal, no ./postgres/user@host


def test_a_journal_is_taken_by_its_name_or_by_what_it_holds(tmp_path):
    fresh = tmp_path / "a.journal"
    search.check_storage(str(fresh))
    search.check_storage(str(tmp_path / "journal.log"))
    study = optuna.create_study(storage=search.open_storage(str(fresh)), study_name="j")
    study.enqueue_trial({"x": 1})
    renamed = tmp_path / "old-study"  # an existing journal keeps working whatever its name
    renamed.write_bytes(fresh.read_bytes())
    search.check_storage(str(renamed))
    assert search.load_study(str(renamed), "j").study_name == "j"


@pytest.mark.parametrize("storage, reason", [
    ("{long}.journal", "File name too long"),
    ("sqlite:///{long}.db", "File name too long"),
    ("{tmp}/loop", "Too many levels of symbolic links"),
    ("sqlite:///{tmp}/loop/study.db", "Too many levels of symbolic links"),
])
def test_loading_a_study_from_a_storage_path_the_os_refuses_is_one_line(tmp_path, storage, reason):
    # `tuner export --storage`, `tuner report`: read, so a missing file is the loader's word, not this
    (tmp_path / "loop").symlink_to("loop")
    storage = storage.format(long=tmp_path / ("n" * 300), tmp=tmp_path)
    with pytest.raises(SettingsError) as exc:
        search.load_study(storage, "s")
    text = str(exc.value)
    assert text.startswith(f"storage {storage}: ") and reason in text and "\n" not in text, text
    with pytest.raises(SettingsError, match="no such storage file"):
        search.load_study(str(tmp_path / "missing.journal"), "s")


def test_a_storage_written_is_checked_as_an_output_and_one_read_only_by_its_name():
    # /proc takes no new file, whoever runs this (root too)
    for url in ("/proc/tuner-storage/s.journal", "sqlite:////proc/tuner-storage/s.db"):
        search.check_storage(url)  # export and report only read: checked by its name
        with pytest.raises(SettingsError, match=f"^storage {re.escape(url)}: cannot write: the directory /proc "):
            search.check_storage(url, write=True)


def test_tuner_uses_no_private_optuna_attribute():
    root = pathlib.Path(__file__).resolve().parent.parent / "tuner"
    private = ("._storage", "._study_id", "._trial_id", "._n_min_trials")
    hits = [f"{path.relative_to(root)}:{n}" for path in root.rglob("*.py")
            for n, line in enumerate(path.read_text().splitlines(), 1) if any(p in line for p in private)]
    assert hits == []


def test_every_sampler_is_made_or_refused_by_name():
    import importlib.util

    kinds = {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler,
             "grid": optuna.samplers.GridSampler}
    for name, kind in kinds.items():
        assert isinstance(search.make_sampler(SearchSettings(sampler=name)), kind)

    def draws(name: str, seed: int) -> list[int]:
        study = optuna.create_study(sampler=search.make_sampler(SearchSettings(sampler=name, seed=seed)))
        return [study.ask().suggest_int("x", 0, 10**9) for _ in range(3)]

    for name in ("tpe", "random"):  # seeded by search.seed: the same seed draws the same
        assert draws(name, 7) == draws(name, 7) != draws(name, 8)
    with pytest.raises(SettingsError, match="search.sampler: unknown sampler 'nope'"):
        search.make_sampler(SearchSettings(sampler="nope"))
    if importlib.util.find_spec("torch") is None:
        with pytest.raises(SettingsError, match="search.sampler: gp needs PyTorch"):
            search.make_sampler(SearchSettings(sampler="gp"))
    else:
        assert isinstance(search.make_sampler(SearchSettings(sampler="gp")), optuna.samplers.GPSampler)


def test_the_gp_sampler_draws_in_range_when_the_best_trial_is_an_incumbent_outside_the_search(tmp_path):
    pytest.importorskip("torch")
    incumbent = {"max_batch_size": 64, "max_queue_delay_microseconds": 0}  # encoder_sim's, above the range
    s = fake_settings(tmp_path, sampler="gp", trials=3)
    s = dataclasses.replace(s, search=dataclasses.replace(s.search, max_batch_size=IntRange(4, 32, log=True)))
    study = new_study(s, incumbent=incumbent)  # enqueued, as tune does: its values recorded as its parameters
    drawn = []
    for value in (10.0, 1.0, 2.0, None):  # the incumbent the best; past the GP's two startup trials
        trial = study.ask()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the incumbent's "Fixed parameter ... out of range"
            drawn.append(space.suggest(trial, s.search))
        if value is not None:
            trial.set_constraint("sla", -1.0)
            study.tell(trial, value)
    assert drawn[0] == incumbent
    for params in drawn[1:]:
        assert space.outside(params, s.search) == []


def _ask_many(url: str, count: int, numbers) -> None:
    study = optuna.load_study(study_name="race", storage=search.open_storage(url))
    numbers.extend([study.ask().number for _ in range(count)])


def test_worker_processes_on_a_sqlite_storage_never_take_the_same_waiting_trial(tmp_path):
    # Optuna pops a waiting trial by reading it and then marking it running: on SQLite, two processes
    # did both (51 distinct trials out of 60 asks, measured before each transaction began IMMEDIATE)
    import multiprocessing

    url = f"sqlite:///{tmp_path / 'race.db'}"
    study = optuna.create_study(study_name="race", storage=search.open_storage(url))
    for k in range(60):
        study.enqueue_trial({"x": k})
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        numbers = manager.list()
        procs = [ctx.Process(target=_ask_many, args=(url, 15, numbers)) for _ in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=60)
        assert all(p.exitcode == 0 for p in procs)
        taken = list(numbers)
    assert len(taken) == 60 and len(set(taken)) == 60


def fake_ranking(s, *, factor: float = 1.0):
    """The fake evaluation's space as a simulation would rank it, capacities `factor` x the fake's (its
    speed is capacity / 10, as the fake measures it), the finer estimate 2 % above the coarse one."""
    rows = []
    for b in range(1, 65):
        for d in range(0, 4001, 1000):
            p = {"max_batch_size": b, "max_queue_delay_microseconds": d}
            cap = capacity_of(p) * factor
            ok = latency_of(p) <= s.sla.latency_ms
            rows.append({**p, "capacity_rps": cap, "capacity_speed": cap / 10.0, "ranking_capacity_rps": cap * 1.02,
                         "value": cap * 3600 / 0.1 if ok else 0.0})
    table = pd.DataFrame(rows).sort_values("ranking_capacity_rps", ascending=False, kind="stable")
    table.insert(0, "rank", range(1, len(table) + 1))
    return table.reset_index(drop=True)


def test_the_model_strategys_capacity_searches_start_around_the_simulated_capacity(tmp_path):
    """Each configuration the simulation ranked, the incumbent with them, is measured from its simulated
    capacity (`Hints.around` its finer estimate); once the simulation is judged wrong, the sampler's
    trials start where the best reached, as in any study."""
    s = fake_settings(tmp_path, trials=4, strategy="model", model_top=2)
    ranking = fake_ranking(s)
    speeds = search.expected_speeds(ranking, s)
    fake = FakeEvaluation()
    planned = []  # what the progress bar is told: the trials the study will hold
    search.model_search(new_study(s), s, ranking, evaluate=fake, trials=4, host=search.this_host(),
                        on_plan=planned.append)
    assert len(fake.calls) == 3  # the incumbent and the top 2: the simulation held
    assert planned == [3]        # not the budget's 4: a bar stopped at 3/4 said work was skipped
    tolerance = s.search.capacity.tolerance
    for params, hints in fake.calls:
        expected = speeds[tuple(sorted(params.items()))]
        assert expected == pytest.approx(capacity_of(params) * 1.02 / 10.0)
        assert hints.start_speed == pytest.approx(expected / (1.0 + tolerance) ** 0.5)
        assert hints.start_speed < expected < hints.upper_speed <= hints.start_speed * (1.0 + tolerance)
    # infeasible in simulation: no estimate
    assert (64, 4000) not in {(p["max_batch_size"], p["max_queue_delay_microseconds"]) for p in
                              (dict(k) for k in speeds)}

    wrong = FakeEvaluation()  # the simulation 3x too optimistic: the fallback, from the best so far
    s2 = dataclasses.replace(s, output=str(tmp_path / "out2"))
    search.model_search(new_study(s2, storage=f"sqlite:///{tmp_path / 'wrong.db'}"), s2, fake_ranking(s2, factor=3.0),
                        evaluate=wrong, trials=5, host=search.this_host(), on_plan=planned.append)
    assert len(wrong.calls) == 5
    assert planned == [3, 3, 5]  # the fallback's trials told before they run
    assert all(h.upper_speed is not None for _, h in wrong.calls[:3])
    assert all(h.upper_speed is None and h.start_speed for _, h in wrong.calls[3:])


@pytest.mark.parametrize("failures", [1, 2])
def test_a_pick_the_server_fails_against_the_simulation_is_measured_once_more_before_it_is_judged(tmp_path, failures):
    """A pick feasible in simulation that breaks the SLA on the server is measured again, once, before
    the simulation is judged: one stalled replay (`failures` 1) keeps the simulation; a server that
    fails it twice (2) makes the error 100 % and the search falls back to the sampler."""
    s = fake_settings(tmp_path, trials=4, strategy="model", model_top=2)
    ranking = fake_ranking(s)
    plain = FakeEvaluation()
    search.model_search(new_study(s, storage=f"sqlite:///{tmp_path / 'plain.db'}"), s, ranking, evaluate=plain,
                        trials=4, host=search.this_host())
    top = plain.calls[1][0]  # the simulation's best, measured after the incumbent
    fake, notes = FakeEvaluation(failing={top["max_batch_size"]: failures}), []
    study = new_study(s)
    search.model_search(study, s, ranking, evaluate=fake, trials=4, host=search.this_host(), note=notes.append)
    assert [p for p, _ in fake.calls[:4]] == [p for p, _ in plain.calls] + [top]
    again = study.trials[3]
    assert again.user_attrs["retry_of"] == 1 and again.user_attrs["simulated_rank"] == 1
    assert any(space.describe(top) in n and "measured once more" in n for n in notes), notes
    info = study.user_attrs["model_search"]
    measured = {r["trial"] for r in info["measured"]}
    assert 1 not in measured and 3 in measured  # the retry stands for the configuration
    if failures == 1:
        assert not info["fallback"] and info["infeasible_measured"] == 0 and len(fake.calls) == 4
        assert search.spent(study) == 3  # the configuration counted once
        assert study.best_trial.number != 1
    else:
        assert info["fallback"] and info["infeasible_measured"] == 1
        assert len(fake.calls) == 5 and search.spent(study) == 4  # the sampler searched on to the budget
        assert fake.calls[4][0] != top  # measured twice: not a third time
    # a budget the picks use up leaves no fallback to decide: nothing is measured again
    spent_up, quiet = FakeEvaluation(failing={top["max_batch_size"]: failures}), []
    study = new_study(s, storage=f"sqlite:///{tmp_path / 'spent.db'}")
    search.model_search(study, s, ranking, evaluate=spent_up, trials=3, host=search.this_host(), note=quiet.append)
    assert len(spent_up.calls) == 3 and not any("measured once more" in n for n in quiet)
    assert study.user_attrs["model_search"]["infeasible_measured"] == 1
