"""The real Engine: the study's server, its evaluation (apply the config, replay, measure, score)
and a warm-started Optuna study in the night's run directory.

One server serves the whole night: the search's trials and then the confirmation's alternating
replays, so both arms of every pair meet the same machine in the same state. A model vLLM serves is
evaluated as `tuner tune` evaluates it (`tuner.trial.run`'s engine path): each configuration's engine
knobs written into the served copy's model.json (the engine restarted), every replay streamed, the
token SLA checked and output tokens per dollar scored; its confirmation replays are the same.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import optuna
import pandas as pd
from optuna.trial import TrialState
from tqdm import tqdm

from tuner import search, space
from tuner.export import trials_frame
from tuner.files import write_atomic
from tuner.measurement import percentile_key
from tuner.modelconfig import ModelConfig
from tuner.nightly import rundir
from tuner.nightly.job import SearchResult, tonight
from tuner.nightly.rule import ArmResult
from tuner.server import Launcher, make_launcher
from tuner.settings import StudySettings
from tuner.traffic import read_traffic
from tuner.trial import NO_VERDICT, Hints, TrialRecord
from tuner.trial.run import make_evaluate, make_measure

LoadReplay = Callable[[dict], TrialRecord]


class RealEngine:
    """`evaluate` scores a search trial; `load_replay`, when given, is the cheaper confirmation
    replay (utilization scoring needs only the replay at the recorded load, not a capacity search)."""

    def __init__(self, study: StudySettings, evaluate: search.Evaluate, load_replay: LoadReplay | None = None,
                 *, unit: str = "requests"):
        self.study = study
        self.evaluate = evaluate
        self.load_replay = load_replay
        self.unit = unit  # what the scores count per dollar: requests, or a generative model's output tokens
        self.speeds: dict[tuple, float] = {}  # capacity speed each configuration reached in the search

    def search(self, enqueue: list[dict], trials: int, workdir: Path, *, production: dict,
               timeout_s: float | None = None) -> SearchResult:
        """The search's best and production's own trial, after the enqueued trials and `trials` more,
        none started once `timeout_s` has passed (the trial running then is finished)."""
        workdir.mkdir(parents=True, exist_ok=True)
        # SQLite: one file in the run directory, for next night's warm start and for `tuner report`
        storage = f"sqlite:///{workdir / 'study.db'}"
        settings = dataclasses.replace(self.study, output=str(workdir), storage=storage)
        with _optuna_quiet():  # Optuna's "A new study created" INFO line is not the night's to print
            study = search.open_study(settings, storage, sampler=search.make_sampler(settings.search),
                                      metadata={"scoring": settings.scoring, "nightly": True, "storage": storage})
        for k, params in enumerate(enqueue):
            study.enqueue_trial(params, user_attrs={"enqueued": k, "incumbent": k == len(enqueue) - 1})
        total = len(enqueue) + trials
        started = time.monotonic()
        with tqdm(total=total, desc="nightly search", unit="trial", leave=False) as bar:
            search.run_trials(study, settings, self.evaluate, n_trials=total, timeout_s=timeout_s,
                              on_trial=lambda _t: bar.update())
        timed_out = search.timed_out(study, total, timeout_s=timeout_s, started=started)
        write_atomic(workdir / "trials.csv", trials_frame(study).to_csv(index=False))
        for t in study.trials:
            if t.user_attrs.get("capacity_speed"):
                self.speeds[_key(search.config_of(t))] = t.user_attrs["capacity_speed"]
        feasible = search.feasible_trials(study)
        done = search.finished_count(study)
        prod_values = [t.value or 0.0 for t in study.trials
                       if t.state == TrialState.COMPLETE and _key(search.config_of(t)) == _key(production)]
        prod_value = max(prod_values) if prod_values else None
        if not feasible:
            return SearchResult(None, None, done, 0, prod_value, timed_out=timed_out)
        return SearchResult(search.config_of(feasible[0]), float(feasible[0].value), done, len(feasible), prod_value,
                            timed_out=timed_out)

    def replay(self, params: dict, arm: str) -> ArmResult:
        """One confirmation replay of `params` as the rule reads it, as arm `arm`."""
        if self.load_replay is not None:
            record = self.load_replay(dict(params))
        else:
            record = self.evaluate(dict(params), Hints(start_speed=self.speeds.get(_key(params))))
        return to_arm(record, arm, self.study.scoring, percentile=self.study.sla.percentile, unit=self.unit)


def to_arm(record: TrialRecord, arm: str, scoring: str, *, percentile: float, unit: str = "requests") -> ArmResult:
    """A confirmation replay's record as the rule reads it (unmeasured: not valid, no verdict); a
    generative model's with its TTFT and TPOT at the SLA's percentile."""
    load = record.at_load
    q = percentile_key(percentile)  # 100: max
    latency = load.latency_ms.get(q) if load is not None else None
    ttft = load.ttft_ms.get(q) if load is not None and load.generative else None
    tpot = load.tpot_ms.get(q) if load is not None and load.generative else None
    score = record.scores.get(scoring)
    valid = record.outcome not in NO_VERDICT
    return ArmResult(arm=arm, meets_sla=record.meets_sla, per_dollar=None if score is None or not valid else float(score),
                     per_dollar_upper=record.score_upper(scoring) if valid else None,
                     unit=unit, latency_ms=float(latency) if latency is not None else float("nan"),
                     ttft_ms=None if ttft is None else float(ttft), tpot_ms=None if tpot is None else float(tpot),
                     error_rate=load.error_rate if load is not None else 0.0, valid=valid,
                     note=record.note if not valid else record.sla_reason,
                     detail={k: v for k, v in (("requests", load.requests if load else 0),
                                               ("send_lag_p99_ms", load.send_lag_p99_ms if load else None),
                                               ("busy_s", load.busy_s if load else 0.0),
                                               ("mean_batch_size", load.mean_batch_size if load else 0.0),
                                               ("output_tokens_per_s", load.output_tokens_per_s if load else None))
                             if v is not None})


@contextmanager
def _optuna_quiet() -> Iterator[None]:
    """Optuna's logging at WARNING inside, restored after (as `tuner.search` runs its trials)."""
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(verbosity)


def _key(params: dict) -> tuple:
    return tuple(sorted(params.items()))


def make_load_replay(launcher: Launcher, study: StudySettings, production: ModelConfig,
                     *,
                     traffic: pd.DataFrame, engine: dict | None = None) -> LoadReplay:
    """One replay at the recorded load, measured and scored as a trial's first step (the same
    measurement step, window, SLA check and utilization score), for utilization scoring, where the
    confirmation needs no capacity search. `engine`: a vLLM-backend model's engine arguments, which
    the parameters change instead of the config (the replay streamed, scored in output tokens)."""
    measure = make_measure(launcher, study, traffic, capacity=False, generative=engine is not None)

    def run(params: dict) -> TrialRecord:
        if engine is None:
            launcher.apply_config(study.model, space.apply(production, params, study.search))
        else:  # both arms passed the search (or run in production): vLLM takes them
            launcher.apply_engine_args(study.model, production, space.apply_engine(engine, space.split(params)[1]))
        return measure(params, Hints())

    return run


@contextmanager
def real_engine(study: StudySettings, production: ModelConfig, traffic_path: Path, *, staging: Path,
                engine: dict | None = None, launcher: Launcher | None = None) -> Iterator[RealEngine]:
    """The study's server (or `launcher`, already started, left running: tests share one). `engine`:
    production's engine arguments, for a model vLLM serves."""
    study = tonight(study, traffic_path)
    traffic = read_traffic(traffic_path)
    with contextlib.ExitStack() as stack:
        if launcher is None:
            # a vLLM model is loaded by its first replay, with that arm's engine arguments: not at start too
            launcher = stack.enter_context(make_launcher(study, log_dir=staging / rundir.SERVER_LOGS, load_models=engine is None))
        evaluate = make_evaluate(launcher, study, production, traffic=traffic, engine=engine)
        load_replay = (make_load_replay(launcher, study, production, traffic=traffic, engine=engine)
                       if study.scoring == "utilization" else None)
        yield RealEngine(study, evaluate, load_replay, unit="requests" if engine is None else "tokens")
