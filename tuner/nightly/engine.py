"""The real Engine: the study's server, its evaluation (apply the config, replay, measure, score)
and a warm-started Optuna study in the night's run directory.

One server serves the whole night: the search's trials and then the confirmation's alternating
replays, so both arms of every pair meet the same machine in the same state.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import optuna
import pandas as pd
from optuna.trial import TrialState
from tqdm import tqdm

from tuner import evaluate as evaluate_mod
from tuner import search
from tuner.cost import price_for
from tuner.errors import ReplayError
from tuner.measure import measure
from tuner.modelconfig import ModelConfig
from tuner.nightly.job import SearchResult
from tuner.nightly.rule import Replay
from tuner.score import Hints, TrialResult, check_sla, utilization_score
from tuner.server import Launcher, make_launcher
from tuner.settings import StudySettings
from tuner.traffic import read_traffic, step_window

LoadReplay = Callable[[dict], TrialResult]
TRIES = 2  # a confirmation replay whose send lag broke its budget is run once more


class RealEngine:
    """`evaluate` scores a search trial; `load_replay`, when given, is the cheaper confirmation
    replay (utilization scoring needs only the replay at the recorded load, not a capacity search)."""

    def __init__(self, study: StudySettings, evaluate: search.Evaluate, load_replay: LoadReplay | None = None):
        self.study = study
        self.evaluate = evaluate
        self.load_replay = load_replay
        self.speeds: dict[tuple, float] = {}  # capacity speed each configuration reached in the search

    def search(self, enqueue: list[dict], trials: int, workdir: Path, production: dict) -> SearchResult:
        workdir.mkdir(parents=True, exist_ok=True)
        # SQLite: one file in the run directory, for next night's warm start and for `tuner report`
        storage = f"sqlite:///{workdir / 'study.db'}"
        settings = dataclasses.replace(self.study, output=str(workdir), storage=storage)
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # the progress bar says enough
        study = search.open_study(settings, storage, incumbent=None,
                                  metadata={"scoring": settings.scoring, "nightly": True})
        for k, params in enumerate(enqueue):
            study.enqueue_trial(params, user_attrs={"enqueued": k, "incumbent": k == len(enqueue) - 1})
        total = len(enqueue) + trials
        with tqdm(total=total, desc="nightly search", unit="trial", leave=False) as bar:
            search.run_trials(study, settings, self.evaluate, total, timeout_s=None,
                              lock=search.lock_path(storage), on_trial=lambda _t: bar.update())
        study.trials_dataframe().to_csv(workdir / "trials.csv", index=False)
        for t in study.trials:
            if t.user_attrs.get("capacity_speed"):
                self.speeds[_key(t.params)] = t.user_attrs["capacity_speed"]
        top = search.top_trials(study, 1)
        done = search.finished_count(study)
        feasible = len(search.top_trials(study, total))
        prod_values = [t.value or 0.0 for t in study.trials
                       if t.state == TrialState.COMPLETE and _key(t.params) == _key(production)]
        prod_value = max(prod_values) if prod_values else None
        if not top:
            return SearchResult(None, None, done, 0, prod_value)
        best = dict(top[0].user_attrs.get("config") or top[0].params)
        return SearchResult(best, float(top[0].value), done, feasible, prod_value)

    def replay(self, params: dict, arm: str) -> Replay:
        try:
            if self.load_replay is not None:
                result = self.load_replay(dict(params))
            else:
                result = self.evaluate(dict(params), Hints(start_speed=self.speeds.get(_key(params))))
        except ReplayError as exc:  # the load generator could not keep up: says nothing of the arm
            return Replay(arm, False, None, valid=False, note=str(exc).splitlines()[0])
        return to_replay(result, arm, self.study.scoring, self.study.sla.percentile)


def to_replay(result: TrialResult, arm: str, scoring: str, percentile: float) -> Replay:
    attrs = result.attrs
    latency = attrs.get(f"latency_p{percentile:g}_ms", attrs.get("latency_ms", float("nan")))
    valid = bool(attrs.get("valid", True))
    note = str(attrs.get("sla_reason") or attrs.get("invalid_reason") or "")
    score = result.scores.get(scoring)
    return Replay(arm, bool(result.feasible), None if score is None else float(score),
                  latency_ms=float(latency) if latency is not None else float("nan"),
                  error_rate=float(attrs.get("error_rate", 0.0) or 0.0), valid=valid, note=note,
                  detail={k: v for k, v in attrs.items() if isinstance(v, (int, float, str, bool))})


def _key(params: dict) -> tuple:
    return tuple(sorted(params.items()))


def tonight(study: StudySettings, traffic_path: Path) -> StudySettings:
    """The study pointed at tonight's traffic file, whole (the night's window is already cut)."""
    traffic = dataclasses.replace(study.traffic, path=str(traffic_path), start_s=None, duration_s=None,
                                  busiest_s=None)
    return dataclasses.replace(study, traffic=traffic)


def make_load_replay(launcher: Launcher, study: StudySettings, production: ModelConfig,
                     traffic: pd.DataFrame) -> LoadReplay:
    """One replay at the recorded load, measured and scored as the study's evaluation scores its
    first step (same window, same SLA check, same utilization score); a replay whose send lag broke
    its budget is run once more, then reported invalid."""
    from tuner.replay import replay  # Locust runs in subprocesses; this side stays unpatched

    price = price_for(study.cost).price_per_hour
    speed = study.traffic.speed
    window, warmup = step_window(traffic, speed, study.replay.warmup_s,
                                              study.search.capacity.step_duration_s)
    duration = warmup + study.search.capacity.step_duration_s

    def run(params: dict) -> TrialResult:
        launcher.apply_config(study.model, evaluate_mod.trial_config(production, params, study.search))
        for _ in range(TRIES):
            r = replay(launcher.endpoints, study.model, window, speed, study.replay, warmup_s=warmup,
                       duration_s=duration, stats=lambda: launcher.statistics(study.model))
            m = measure(r.records, r.stats_before, r.stats_after, speed=speed, warmup_s=r.warmup_s,
                        lag_budget_ms=study.replay.lag_budget_ms, max_batch_size=int(params["max_batch_size"]),
                        sla_percentile=study.sla.percentile, load_generator_cpu=r.load_generator_cpu,
                        workers=r.workers, duration_s=r.duration_s)
            if m.valid:
                break
        if not m.valid:
            raise ReplayError(f"confirmation replay stayed invalid after {TRIES} tries: {m.invalid_reason}")
        sla = check_sla(m, study.sla)
        attrs = {f"latency_{k}_ms": v for k, v in m.latency_ms.items()}
        attrs.update(valid=m.valid, sla_reason=sla.reason, error_rate=m.error_rate, busy_s=m.busy_s,
                     mean_batch_size=m.mean_batch_size, requests=m.requests, send_lag_p99_ms=m.send_lag_ms["p99"])
        return TrialResult(feasible=sla.ok, violation=sla.violation, capacity_rps=0.0, capacity_speed=0.0,
                           scores={"utilization": utilization_score(m, price) if sla.ok else None,
                                   "capacity": None},
                           attrs=attrs)

    return run


@contextmanager
def real_engine(study: StudySettings, production: ModelConfig, traffic_path: Path, staging: Path,
                launcher: Launcher | None = None) -> Iterator[RealEngine]:
    """The study's server (or `launcher`, already started, left running: tests share one)."""
    study = tonight(study, traffic_path)
    traffic = read_traffic(traffic_path)
    with contextlib.ExitStack() as stack:
        if launcher is None:
            launcher = stack.enter_context(make_launcher(study, log_dir=staging / "server"))
        evaluate = evaluate_mod.make_evaluate(launcher, study, production, traffic)
        load_replay = (make_load_replay(launcher, study, production, traffic)
                       if study.scoring == "utilization" else None)
        yield RealEngine(study, evaluate, load_replay)
