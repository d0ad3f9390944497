"""The Optuna loop with a real journal storage and an injected evaluation (a pure function of the
configuration, like httpx's MockTransport): incumbent first, SLA constraint, pruning, grid ground
truth, resume after Ctrl-C, a dead worker's trial, two worker processes, re-measurement."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
import time

import optuna
import pytest
from optuna.trial import TrialState

from tuner import search
from tuner.errors import ServerSetupError, SettingsError
from tuner.score import Hints, TrialResult
from tuner.settings import IntRange, SearchSettings, study_from_dict

optuna.logging.set_verbosity(optuna.logging.WARNING)

INCUMBENT = {"max_batch_size": 4, "max_queue_delay_microseconds": 0}


def settings(tmp_path, sampler="tpe", trials=12, latency_ms=30.0, scoring="capacity", **search_kw):
    s = study_from_dict(
        {
            "name": "fake",
            "model_repository": str(tmp_path),
            "model": "m",
            "traffic": {"path": "t.csv"},
            "output": str(tmp_path / "out"),
            "scoring": scoring,
            "sla": {"latency_ms": latency_ms},
            "search": {"sampler": sampler, "trials": trials, "seed": 1},
        },
        base_dir=tmp_path,
    )
    space = dataclasses.replace(
        s.search,
        max_batch_size=IntRange(1, 64, log=True),
        max_queue_delay_microseconds=IntRange(0, 4000, step=1000),
        **search_kw,
    )
    return dataclasses.replace(s, search=space)


def capacity_of(p: dict) -> float:
    """An interior optimum in max_batch_size (32), the delay adding a little."""
    b = p["max_batch_size"]
    return 100.0 * b / (1.0 + (b / 32.0) ** 2) + p["max_queue_delay_microseconds"] / 1000.0


def latency_of(p: dict) -> float:
    return 5.0 + p["max_queue_delay_microseconds"] / 1000.0 + 0.5 * p["max_batch_size"]


class FakeEvaluation:
    def __init__(
        self,
        latency_ms: float = 30.0,
        interrupt_at: int | None = None,
        noise: dict | None = None,
        fail_config: int | None = None,
    ):
        self.latency_ms = latency_ms
        self.interrupt_at = interrupt_at
        self.noise = noise or {}
        self.fail_config = fail_config
        self.calls: list[tuple[dict, Hints]] = []

    def __call__(self, params: dict, hints: Hints) -> TrialResult:
        self.calls.append((params, hints))
        if self.interrupt_at is not None and len(self.calls) == self.interrupt_at:
            raise KeyboardInterrupt
        if self.fail_config is not None and params["max_batch_size"] == self.fail_config:
            raise ServerSetupError("config refused by Triton: preferred size must be <= max batch size")
        factors = self.noise.get(params["max_batch_size"], [1.0])
        seen = sum(p["max_batch_size"] == params["max_batch_size"] for p, _ in self.calls) - 1
        cap = capacity_of(params) * factors[seen % len(factors)]
        violation = latency_of(params) / self.latency_ms - 1.0
        pruned = hints.beat_rps is not None and cap <= hints.beat_rps
        return TrialResult(
            feasible=violation <= 0,
            violation=violation,
            capacity_rps=cap,
            capacity_speed=cap / 10.0,
            scores={"capacity": cap * 3600 / 0.1, "utilization": 1e6 / latency_of(params)},
            pruned=pruned,
            attrs={"latency_ms_p99": latency_of(params), "fill_rate": 0.5},
        )


class SlowFakeEvaluation(FakeEvaluation):
    """Takes a little time per trial, so that two workers overlap."""

    def __call__(self, params: dict, hints: Hints) -> TrialResult:
        time.sleep(0.5)
        return super().__call__(params, hints)


@contextlib.contextmanager
def fake_session(latency_ms: float = 30.0):
    yield SlowFakeEvaluation(latency_ms)


def best_in_grid(space: SearchSettings, latency_ms: float = 30.0) -> float:
    g = search.grid(space)
    values = [
        capacity_of({"max_batch_size": b, "max_queue_delay_microseconds": d})
        for b in g["max_batch_size"]
        for d in g["max_queue_delay_microseconds"]
        if latency_of({"max_batch_size": b, "max_queue_delay_microseconds": d}) <= latency_ms
    ]
    return max(values)


def new_study(s, storage, incumbent=INCUMBENT):
    return search.open_study(s, storage, incumbent, {"scoring": s.scoring})


def test_incumbent_first_constraint_recorded_and_trial_budget_kept(tmp_path):
    s = settings(tmp_path, trials=6)
    storage = str(tmp_path / "study.journal")
    study = new_study(s, storage)
    fake = FakeEvaluation()
    search.run_trials(study, s, fake, n_trials=6, lock=search.lock_path(storage))
    trials = study.get_trials()
    assert fake.calls[0][0] == INCUMBENT and trials[0].user_attrs["incumbent"] is True
    assert len(trials) == 6 and all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    for t in trials:
        assert t.constraints["sla"] == pytest.approx(latency_of(t.params) / 30.0 - 1.0)
    # the first trial had nothing to start from; later ones start at the best trial's capacity
    assert fake.calls[0][1] == Hints()
    assert any(h.start_speed is not None and h.beat_rps is not None for _, h in fake.calls[1:])


def test_grid_is_exhaustive_and_finds_the_optimum(tmp_path):
    s = settings(tmp_path, sampler="grid")
    storage = str(tmp_path / "study.journal")
    study = new_study(s, storage)
    # no pruning in the ground truth: every configuration gets its full capacity search
    fake = FakeEvaluation()
    search.run_trials(
        study, s, lambda p, h: fake(p, Hints(h.start_speed)), n_trials=10_000, lock=search.lock_path(storage)
    )
    size = search.grid_size(s.search)
    assert size == 7 * 5
    configs = {tuple(sorted(t.params.items())) for t in study.trials if not t.user_attrs.get("incumbent")}
    assert len(configs) == size
    assert study.best_trial.user_attrs["capacity_rps"] == pytest.approx(best_in_grid(s.search))


def test_tpe_gets_near_the_optimum_measuring_a_quarter_of_the_grid(tmp_path):
    s = settings(tmp_path, trials=9)
    storage = str(tmp_path / "study.journal")
    study = new_study(s, storage)
    search.run_trials(study, s, FakeEvaluation(), n_trials=9, lock=search.lock_path(storage))
    assert len(study.trials) <= 0.26 * search.grid_size(s.search)
    best = search.top_trials(study, 1)[0]
    assert best.user_attrs["capacity_rps"] >= 0.95 * best_in_grid(s.search)


def test_pruning_stops_trials_that_cannot_beat_the_best(tmp_path):
    s = settings(tmp_path, trials=12)
    storage = str(tmp_path / "study.journal")
    study = new_study(s, storage)
    search.run_trials(study, s, FakeEvaluation(), n_trials=12, lock=search.lock_path(storage))
    pruned = [t for t in study.trials if t.state == TrialState.PRUNED]
    assert pruned, "some configurations worse than the best should have been pruned"
    best = max(t.user_attrs["capacity_rps"] for t in study.trials if t.state == TrialState.COMPLETE)
    assert all(t.user_attrs["capacity_rps"] <= best for t in pruned)


def test_utilization_scoring_does_not_prune_on_capacity(tmp_path):
    s = settings(tmp_path, trials=8, scoring="utilization")
    storage = str(tmp_path / "study.journal")
    study = new_study(s, storage)
    fake = FakeEvaluation()
    search.run_trials(study, s, fake, n_trials=8, lock=search.lock_path(storage))
    assert all(h.beat_rps is None for _, h in fake.calls)
    assert study.best_value == pytest.approx(study.best_trial.user_attrs["score_utilization"])


def test_interrupted_trial_is_failed_then_retried_and_no_finished_trial_is_lost(tmp_path):
    s = settings(tmp_path, trials=7)
    storage = str(tmp_path / "study.journal")
    study = new_study(s, storage)
    with pytest.raises(KeyboardInterrupt):
        search.run_trials(
            study, s, FakeEvaluation(interrupt_at=4), n_trials=7, lock=search.lock_path(storage)
        )
    before = {t.number: t.params for t in study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))}
    (failed,) = study.get_trials(states=(TrialState.FAIL,))
    assert len(before) == 3 and failed.user_attrs["error"] == "interrupted"

    again = new_study(s, storage)  # the same command, run again
    assert search.recover(again, search.lock_path(storage)) == [failed.number]
    fake = FakeEvaluation()
    search.run_trials(again, s, fake, n_trials=7, lock=search.lock_path(storage))
    assert fake.calls[0][0] == failed.params  # the interrupted configuration is measured first
    done = {t.number: t.params for t in again.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))}
    assert len(done) == 7 and all(done[n] == p for n, p in before.items())
    assert search.recover(again, search.lock_path(storage)) == []  # retried once only


def test_a_dead_process_trial_is_failed_and_retried(tmp_path):
    s = settings(tmp_path, trials=3)
    storage = str(tmp_path / "study.journal")
    study = new_study(s, storage)
    trial = study.ask()
    search.suggest(trial, s.search)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    trial.set_user_attr("host", __import__("socket").gethostname())
    trial.set_user_attr("pid", int(dead.stdout))
    assert search.recover(study, None) == [trial.number]
    assert study.trials[trial.number].state == TrialState.FAIL


def test_a_refused_configuration_fails_its_trial_and_the_study_goes_on(tmp_path):
    s = settings(tmp_path, trials=6, sampler="random")
    storage = str(tmp_path / "study.journal")
    study = new_study(s, storage, incumbent={"max_batch_size": 2, "max_queue_delay_microseconds": 0})
    search.run_trials(study, s, FakeEvaluation(fail_config=2), n_trials=6, lock=search.lock_path(storage))
    failed = study.get_trials(states=(TrialState.FAIL,))
    assert failed and failed[0].user_attrs["error_kind"] == "config"
    assert search.finished_count(study) == 6
    assert search.recover(study, None) == []  # the server refused it: not retried


def test_two_worker_processes_share_the_storage_without_duplicates_or_losses(tmp_path):
    s = settings(tmp_path, trials=10, sampler="random")
    storage = str(tmp_path / "study.journal")
    study, remeasured = search.tune(
        s,
        fake_session,
        storage,
        n_trials=10,
        workers=2,
        incumbent=INCUMBENT,
        metadata={"scoring": "capacity"},
        progress=False,
    )
    trials = study.get_trials()
    assert sorted(t.number for t in trials) == list(range(len(trials)))
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    assert len(trials) == 10
    assert len({t.user_attrs["pid"] for t in trials}) == 2 and os.getpid() not in {
        t.user_attrs["pid"] for t in trials
    }
    assert study.user_attrs["remeasured"] and remeasured


def test_remeasure_is_interleaved_and_recommends_by_median(tmp_path):
    s = settings(tmp_path, trials=12, sampler="grid", top_k=2, remeasure_repeats=3)
    s = dataclasses.replace(
        s,
        search=dataclasses.replace(
            s.search, max_batch_size=IntRange(16, 32, log=True), max_queue_delay_microseconds=IntRange(0, 0)
        ),
    )
    storage = str(tmp_path / "study.journal")
    study = new_study(s, storage)
    search.run_trials(study, s, lambda p, h: FakeEvaluation()(p, Hints()), n_trials=100)
    # 32 wins the search, but one of its re-measurements was a lucky outlier: 16 is better by median
    noisy = FakeEvaluation(noise={32: [0.5, 0.5, 3.0], 16: [1.0]})
    remeasured = search.remeasure(study, noisy, s)
    order = [p["max_batch_size"] for p, _ in noisy.calls]
    assert order == [32, 16, 4] * 3  # top 2 and the incumbent, interleaved
    best = search.recommend(remeasured)
    assert best.params["max_batch_size"] == 16 and best.spread == pytest.approx(0.0)
    worst = next(r for r in remeasured if r.params["max_batch_size"] == 32)
    assert worst.spread == pytest.approx((3.0 - 0.5) / 0.5)
    assert next(r for r in remeasured if r.incumbent).params == INCUMBENT


def test_no_configuration_meets_the_sla(tmp_path):
    s = settings(tmp_path, trials=5, latency_ms=1.0)
    storage = str(tmp_path / "study.journal")
    study = new_study(s, storage)
    search.run_trials(study, s, FakeEvaluation(latency_ms=1.0), n_trials=5)
    assert search.top_trials(study, 3) == []
    fake = FakeEvaluation(latency_ms=1.0)
    assert search.remeasure(study, fake, s) == [] and fake.calls == []
    assert search.recommend([]) is None


def test_grid_walks_log_ranges_in_powers_of_two():
    space = SearchSettings(
        max_batch_size=IntRange(3, 40, log=True),
        max_queue_delay_microseconds=IntRange(0, 1000, step=500),
        preferred_batch_size="search",
        instance_count=IntRange(1, 2),
    )
    g = search.grid(space)
    assert g["max_batch_size"] == [3, 4, 8, 16, 32, 40]
    assert g["max_queue_delay_microseconds"] == [0, 500, 1000]
    assert search.grid_size(space) == 6 * 3 * 3 * 2


def test_grid_per_octave_refines_log_ranges_only():
    space = SearchSettings(
        max_batch_size=IntRange(1, 64, log=True),
        max_queue_delay_microseconds=IntRange(0, 1000, step=500),
        grid_per_octave=2,
    )
    g = search.grid(space)
    assert g["max_batch_size"] == [1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64]
    assert g["max_queue_delay_microseconds"] == [0, 500, 1000]
    assert search.grid_size(space) == 12 * 3


def test_grid_per_octave_must_be_positive(tmp_path):
    with pytest.raises(SettingsError, match="search.grid_per_octave: must be > 0, got 0"):
        study_from_dict({"name": "fake", "model_repository": str(tmp_path), "model": "m",
                         "traffic": {"path": "t.csv"}, "search": {"grid_per_octave": 0}}, base_dir=tmp_path)


def test_any_optuna_url_works_as_storage(tmp_path):
    s = settings(tmp_path, trials=4, sampler="random")
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = new_study(s, url)
    search.run_trials(study, s, FakeEvaluation(), n_trials=4, lock=search.lock_path(url))
    again = optuna.load_study(study_name="fake", storage=url)
    assert search.finished_count(again) == 4 and again.trials[0].user_attrs["incumbent"]
    assert search.lock_path("postgresql://db/tuner") is None  # several hosts: no local lock


def test_every_sampler_is_made_or_refused_by_name():
    import importlib.util

    for name in ("tpe", "random", "grid"):
        assert search.make_sampler(SearchSettings(sampler=name)) is not None
    if importlib.util.find_spec("torch") is None:
        with pytest.raises(SettingsError, match="search.sampler: gp needs PyTorch"):
            search.make_sampler(SearchSettings(sampler="gp"))
    else:
        assert isinstance(search.make_sampler(SearchSettings(sampler="gp")), optuna.samplers.GPSampler)
