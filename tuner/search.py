"""The Optuna study: space, sampler, SLA constraint, warm start, pruning, storage, workers.

The evaluation is injected: `evaluate(params, hints) -> TrialResult` (see `tuner.evaluate` for the
real one, which drives a Triton server and a Locust replay). Everything Optuna does is in
`run_trials` (ask, evaluate, tell), readable top to bottom:

- the incumbent (the model's current config) is enqueued as the first trial of a new study;
- each trial's SLA violation at the recorded load is its constraint (`trial.set_constraint`);
- the capacity search starts at the best trial's capacity and stops (PRUNED) once the SLA breaks
  at a rate the best trial already serves;
- a trial interrupted (Ctrl-C) or whose process died is marked FAIL and enqueued again on the next
  run; finished trials are kept, so the same command resumes the study;
- several workers share one storage; a file lock makes "count, then ask" atomic on one machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import math
import os
import socket
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import TrialState

from tuner.errors import (
    ConfigError,
    ServerSetupError,
    SettingsError,
    Terminated,
    TunerError,
    sigterm_as_interrupt,
)
from tuner.score import Hints, TrialResult
from tuner.settings import IntRange, SearchSettings, StudySettings

Evaluate = Callable[[dict, Hints], TrialResult]

PARAMS = ("max_batch_size", "max_queue_delay_microseconds", "preferred_batch_size", "instance_count")
COUNTED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
MAX_FAILURES_IN_A_ROW = 3


# --- the space ---------------------------------------------------------------------------------


def suggest(trial: optuna.trial.BaseTrial, space: SearchSettings) -> dict:
    """The trial's configuration, drawn from the study's bounds."""
    params = {
        "max_batch_size": _suggest_int(trial, "max_batch_size", space.max_batch_size),
        "max_queue_delay_microseconds": _suggest_int(
            trial, "max_queue_delay_microseconds", space.max_queue_delay_microseconds
        ),
    }
    if space.preferred_batch_size == "search":
        params["preferred_batch_size"] = trial.suggest_categorical(
            "preferred_batch_size", ["none", "max", "powers_of_two"]
        )
    if space.instance_count is not None:
        params["instance_count"] = _suggest_int(trial, "instance_count", space.instance_count)
    return params


def _suggest_int(trial: optuna.trial.BaseTrial, name: str, r: IntRange) -> int:
    if r.log:
        return trial.suggest_int(name, r.low, r.high, log=True)
    return trial.suggest_int(name, r.low, r.high, step=r.step)


def grid(space: SearchSettings) -> dict[str, list]:
    """Every configuration of the space: the ground truth the other samplers are measured against.
    A log-scale range is walked in powers of two (and its bounds), or with `grid_per_octave` points
    per doubling (2: 1, 2, 3, 4, 6, 8, 11, 16, ...) where the optimum needs a finer look."""

    def values(r: IntRange) -> list[int]:
        if r.log:
            per = space.grid_per_octave
            out = {r.low, r.high}
            k = 0
            while (v := round(2 ** (k / per))) <= r.high:
                if v >= r.low:
                    out.add(v)
                k += 1
            return sorted(out)
        return list(range(r.low, r.high + 1, r.step))

    g = {"max_batch_size": values(space.max_batch_size),
         "max_queue_delay_microseconds": values(space.max_queue_delay_microseconds)}
    if space.preferred_batch_size == "search":
        g["preferred_batch_size"] = ["none", "max", "powers_of_two"]
    if space.instance_count is not None:
        g["instance_count"] = values(space.instance_count)
    return g


def grid_size(space: SearchSettings) -> int:
    return math.prod(len(v) for v in grid(space).values())


def make_sampler(space: SearchSettings) -> optuna.samplers.BaseSampler:
    seed = space.seed
    if space.sampler == "tpe":
        # few startup trials: the incumbent plus a handful of random ones, then TPE
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(5, max(2, space.trials // 4)))
    if space.sampler == "gp":
        if importlib.util.find_spec("torch") is None:  # Optuna's GP sampler is built on PyTorch
            raise SettingsError("search.sampler: gp needs PyTorch, which is not installed "
                                "(pip install torch), or choose tpe, random or grid")
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=min(5, max(2, space.trials // 4)))
    if space.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if space.sampler == "grid":
        return _GridSampler(grid(space), seed=seed)
    raise SettingsError(f"search.sampler: unknown sampler {space.sampler!r}")


class _GridSampler(optuna.samplers.GridSampler):
    """Optuna's grid, minus its `study.stop()` once exhausted (only allowed inside `optimize`):
    `run_trials` checks that the grid is used up itself, counting points other workers run."""

    def after_trial(self, study, trial, state, values) -> None:
        pass

    def all_started(self, study: optuna.Study) -> bool:
        started = {t.system_attrs["grid_id"] for t in study._storage.get_all_trials(study._study_id)
                   if "grid_id" in t.system_attrs and t.state != TrialState.WAITING}
        return set(range(self._n_min_trials)) <= started


# --- storage -----------------------------------------------------------------------------------


def storage_url(settings: StudySettings, override: str | None = None) -> str:
    """The study's storage: an Optuna URL (sqlite:///..., postgresql://...) or a journal file
    path; by default a journal file in the output directory (safe for several processes)."""
    return override or settings.storage or str(Path(settings.output) / "study.journal")


def open_storage(url: str) -> optuna.storages.BaseStorage:
    if "://" in url:
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(url))
        except Exception as exc:  # bad URL, missing driver, unreachable database
            raise SettingsError(f"storage {url!r}: cannot open: {exc}") from None
    path = Path(url)
    path.parent.mkdir(parents=True, exist_ok=True)
    backend = optuna.storages.journal.JournalFileBackend(
        str(path), lock_obj=optuna.storages.journal.JournalFileOpenLock(str(path))
    )
    return optuna.storages.JournalStorage(backend)


def _engine_kwargs(url: str) -> dict:
    # SQLite with several writers: wait for the lock instead of failing at once
    return {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}


def lock_path(url: str) -> Path | None:
    """A file lock beside a file storage; none for a database shared between hosts."""
    if "://" in url and not url.startswith("sqlite:///"):
        return None
    base = url[len("sqlite:///"):] if url.startswith("sqlite:///") else url
    return Path(base + ".tuner-lock")  # not ".lock": the journal backend uses that name


@contextlib.contextmanager
def _locked(path: Path | None) -> Iterator[None]:
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def open_study(settings: StudySettings, storage: str, incumbent: dict | None = None,
               metadata: dict | None = None) -> optuna.Study:
    """Create the study, or load it to resume; a new one gets the incumbent as its first trial."""
    with _locked(lock_path(storage)):
        study = optuna.create_study(
            study_name=settings.name,
            storage=open_storage(storage),
            sampler=make_sampler(settings.search),
            direction="maximize",
            load_if_exists=True,
        )
        if not study.trials:
            for key, value in (metadata or {}).items():
                study.set_user_attr(key, value)
            if incumbent is not None:
                study.enqueue_trial(incumbent, user_attrs={"incumbent": True})
        else:
            _check_same_study(study, settings)
    return study


def _check_same_study(study: optuna.Study, settings: StudySettings) -> None:
    scoring = study.user_attrs.get("scoring")
    if scoring is not None and scoring != settings.scoring:
        raise SettingsError(
            f"study {settings.name!r} in this storage was scored by {scoring}, not {settings.scoring}: "
            f"use another study name or output directory"
        )


def recover(study: optuna.Study, lock: Path | None) -> list[int]:
    """Mark trials of dead processes on this host FAIL and enqueue every failed trial once more
    (an interruption is not the configuration's fault). Returns the trial numbers enqueued."""
    host = socket.gethostname()
    again = []
    with _locked(lock):
        trials = study.get_trials(deepcopy=False)
        retried = {t.user_attrs.get("retry_of") for t in trials}
        for t in trials:
            if (t.state == TrialState.RUNNING and t.user_attrs.get("host") == host
                    and not _alive(t.user_attrs.get("pid"))):
                # Optuna's public API cannot fail another process's trial; its storage can
                study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
            elif t.state != TrialState.FAIL:
                continue
            if t.number in retried or not t.params or t.user_attrs.get("error_kind") == "config":
                continue
            attrs = {"retry_of": t.number}
            if t.user_attrs.get("incumbent"):
                attrs["incumbent"] = True
            study.enqueue_trial(t.params, user_attrs=attrs)
            again.append(t.number)
    return again


def _alive(pid: object) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- the loop ----------------------------------------------------------------------------------


def hints(study: optuna.Study, scoring: str, prune: bool = True) -> Hints:
    """Start the capacity search where the best configuration so far reached; prune against it."""
    best = _best(study)
    if best is None:
        return Hints()
    speed = best.user_attrs.get("capacity_speed") or None
    beat = best.user_attrs.get("capacity_rps") if prune and scoring == "capacity" else None
    return Hints(start_speed=speed, beat_rps=beat or None)


def _best(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    feasible = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if t.value is not None and t.value > 0 and all(c <= 0 for c in t.constraints.values())]
    return max(feasible, key=lambda t: t.value) if feasible else None


def run_trials(
    study: optuna.Study,
    settings: StudySettings,
    evaluate: Evaluate,
    n_trials: int,
    timeout_s: float | None = None,
    lock: Path | None = None,
    on_trial: Callable[[optuna.trial.FrozenTrial], None] | None = None,
) -> int:
    """Ask, evaluate, tell until the study holds `n_trials` finished or running trials (all
    workers together), the grid is exhausted, or the timeout passes. Returns trials run here."""
    deadline = time.monotonic() + timeout_s if timeout_s else None
    ran = failures = 0
    while deadline is None or time.monotonic() < deadline:
        with _locked(lock):
            trials = study.get_trials(deepcopy=False)
            if sum(t.state in COUNTED for t in trials) >= n_trials:
                break
            if _grid_exhausted(study, trials):
                break
            trial = study.ask()
            trial.set_user_attr("host", socket.gethostname())
            trial.set_user_attr("pid", os.getpid())
        params = suggest(trial, settings.search)
        try:
            result = evaluate(params, hints(study, settings.scoring))
        except KeyboardInterrupt:
            trial.set_user_attr("error", "interrupted")
            study.tell(trial, state=TrialState.FAIL)
            raise
        except TunerError as exc:
            # a configuration the server refuses is the configuration's fault: FAIL, move on;
            # anything else failing several times in a row is the setup's fault: stop
            trial.set_user_attr("error", str(exc)[:500])
            trial.set_user_attr("error_kind", "config" if _is_config_error(exc) else type(exc).__name__)
            study.tell(trial, state=TrialState.FAIL)
            failures += 1
            if failures >= MAX_FAILURES_IN_A_ROW:
                raise
            continue
        failures = 0
        ran += 1
        _record(trial, params, result, settings.scoring)
        if result.pruned:
            frozen = study.tell(trial, state=TrialState.PRUNED)
        else:
            frozen = study.tell(trial, result.value(settings.scoring))
        if on_trial:
            on_trial(frozen)
    return ran


def _is_config_error(exc: TunerError) -> bool:
    return isinstance(exc, (ConfigError, ServerSetupError))


def _grid_exhausted(study: optuna.Study, trials: list) -> bool:
    sampler = study.sampler
    if not isinstance(sampler, _GridSampler):
        return False
    waiting = any(t.state == TrialState.WAITING for t in trials)
    return not waiting and sampler.all_started(study)


def _record(trial: optuna.Trial, params: dict, result: TrialResult, scoring: str) -> None:
    trial.set_constraint("sla", result.violation)
    trial.set_user_attr("feasible", result.feasible)
    trial.set_user_attr("capacity_rps", result.capacity_rps)
    trial.set_user_attr("capacity_speed", result.capacity_speed)
    for name, score in result.scores.items():
        trial.set_user_attr(f"score_{name}", score)
    for key, value in result.attrs.items():
        trial.set_user_attr(key, value)
    trial.set_user_attr("config", params)


def finished_count(study: optuna.Study) -> int:
    return sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED)
               for t in study.get_trials(deepcopy=False))


# --- noise: re-measure the best ----------------------------------------------------------------


@dataclass(frozen=True)
class Remeasured:
    params: dict
    trial: int
    incumbent: bool
    results: tuple[TrialResult, ...]
    scoring: str

    def values(self) -> list[float]:
        return [r.value(self.scoring) for r in self.results]

    @property
    def median(self) -> float:
        return statistics.median(self.values())

    @property
    def spread(self) -> float:
        """(max - min) / median of the repeats' requests per dollar."""
        v = self.values()
        return (max(v) - min(v)) / self.median if self.median > 0 else float("inf")

    def median_of(self, pick: Callable[[TrialResult], float | None]) -> float | None:
        values = [x for x in (pick(r) for r in self.results) if x is not None]
        return statistics.median(values) if values else None


def top_trials(study: optuna.Study, k: int) -> list[optuna.trial.FrozenTrial]:
    """The k best feasible trials with distinct configurations."""
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.value is not None and t.value > 0 and all(c <= 0 for c in t.constraints.values())]
    out, seen = [], set()
    for t in sorted(done, key=lambda t: t.value, reverse=True):
        key = tuple(sorted(t.params.items()))
        if key not in seen:
            seen.add(key)
            out.append(t)
        if len(out) == k:
            break
    return out


def incumbent_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.user_attrs.get("incumbent")]
    return done[-1] if done else None


def remeasure(
    study: optuna.Study,
    evaluate: Evaluate,
    settings: StudySettings,
    progress: Callable[[], None] | None = None,
) -> list[Remeasured]:
    """Measure the top configurations (and the incumbent) again, interleaved (A B C A B C ...), so
    that drift on the machine hits them alike. Each run starts its capacity search at the trial's
    own capacity, so it brackets in a few steps."""
    candidates = top_trials(study, settings.search.top_k)
    if not candidates:  # nothing met the SLA: nothing to recommend, nothing to compare
        return []
    incumbent = incumbent_trial(study)
    if incumbent is not None and all(t.params != incumbent.params for t in candidates):
        candidates.append(incumbent)
    runs: dict[int, list[TrialResult]] = {t.number: [] for t in candidates}
    for _ in range(settings.search.remeasure_repeats):
        for t in candidates:
            start = t.user_attrs.get("capacity_speed") or None
            runs[t.number].append(evaluate(dict(t.user_attrs.get("config") or t.params),
                                           Hints(start_speed=start)))
            if progress:
                progress()
    incumbent_params = incumbent.params if incumbent is not None else None
    return [Remeasured(dict(t.user_attrs.get("config") or t.params), t.number,
                       t.params == incumbent_params, tuple(runs[t.number]), settings.scoring)
            for t in candidates]


def recommend(remeasured: list[Remeasured]) -> Remeasured | None:
    """The best by median requests per dollar over the repeats; None when none met the SLA."""
    ok = [r for r in remeasured if r.median > 0]
    return max(ok, key=lambda r: r.median) if ok else None


def remeasured_as_dict(r: Remeasured) -> dict:
    """JSON-able: kept in the study's storage, so `tuner export` can rebuild the summary."""
    def med(key: str):
        return r.median_of(lambda x: x.attrs.get(key) if isinstance(x.attrs.get(key), (int, float)) else None)

    return {
        "trial": r.trial,
        "params": r.params,
        "incumbent": r.incumbent,
        "values": r.values(),
        "median": r.median,
        "spread": r.spread if math.isfinite(r.spread) else None,
        "feasible_runs": sum(x.feasible for x in r.results),
        "capacity_rps": r.median_of(lambda x: x.capacity_rps),
        "capacity_speed": r.median_of(lambda x: x.capacity_speed),
        "scores": {name: r.median_of(lambda x, n=name: x.scores.get(n))
                   for name in ("capacity", "utilization")},
        "attrs": {key: med(key) for key in sorted({k for x in r.results for k in x.attrs})
                  if med(key) is not None},
    }


# --- the whole session -------------------------------------------------------------------------


OpenEvaluation = Callable[[], contextlib.AbstractContextManager]  # yields an Evaluate


def tune(
    settings: StudySettings,
    open_evaluation: OpenEvaluation,
    storage: str,
    n_trials: int,
    timeout_s: float | None = None,
    workers: int = 1,
    incumbent: dict | None = None,
    metadata: dict | None = None,
    progress: bool = True,
) -> tuple[optuna.Study, list[Remeasured] | None]:
    """Run the study (resuming it if the storage holds it), then re-measure the best.

    `open_evaluation()` is a context manager yielding an `Evaluate` (it starts a server); with
    `workers > 1` each worker process opens its own, so `open_evaluation` must pickle.
    """
    study = open_study(settings, storage, incumbent, metadata)
    lock = lock_path(storage)
    recover(study, lock)
    total = n_trials if settings.search.sampler != "grid" else min(n_trials, grid_size(settings.search) + 1)
    bar = _bar(total, finished_count(study), progress, "trials")
    try:
        if workers <= 1:
            with open_evaluation() as evaluate:
                run_trials(study, settings, evaluate, n_trials, timeout_s, lock,
                           on_trial=lambda _t: _refresh(bar, study))
                remeasured = _remeasure_and_keep(study, evaluate, settings, progress)
        else:
            _run_workers(study, settings, open_evaluation, storage, n_trials, timeout_s, workers, bar)
            with open_evaluation() as evaluate:
                remeasured = _remeasure_and_keep(study, evaluate, settings, progress)
    finally:
        if bar is not None:
            bar.close()
    return study, remeasured


def _remeasure_and_keep(study, evaluate, settings, progress) -> list[Remeasured] | None:
    # a study run again with no new trial keeps its re-measurement
    if study.user_attrs.get("remeasured_at") == finished_count(study) and "remeasured" in study.user_attrs:
        return None
    top = top_trials(study, settings.search.top_k)
    incumbent = incumbent_trial(study)
    n = len(top) + (1 if top and incumbent and all(t.params != incumbent.params for t in top) else 0)
    bar = _bar(n * settings.search.remeasure_repeats, 0, progress, "re-measure")
    try:
        remeasured = remeasure(study, evaluate, settings, progress=(lambda: bar.update(1)) if bar else None)
    finally:
        if bar is not None:
            bar.close()
    study.set_user_attr("remeasured", [remeasured_as_dict(r) for r in remeasured])
    study.set_user_attr("remeasured_at", finished_count(study))
    return remeasured


def _worker(settings: StudySettings, open_evaluation: OpenEvaluation, storage: str, n_trials: int,
            timeout_s: float | None) -> None:
    study = optuna.load_study(study_name=settings.name, storage=open_storage(storage),
                              sampler=make_sampler(settings.search))
    try:
        with sigterm_as_interrupt(), open_evaluation() as evaluate:
            run_trials(study, settings, evaluate, n_trials, timeout_s, lock_path(storage))
    except KeyboardInterrupt:
        pass  # the trial is marked FAIL already; the parent reports the interruption


def _run_workers(study, settings, open_evaluation, storage, n_trials, timeout_s, workers, bar) -> None:
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")  # a clean interpreter: no inherited threads/servers
    procs = [ctx.Process(target=_worker, args=(settings, open_evaluation, storage, n_trials, timeout_s),
                         name=f"tuner-worker-{i}") for i in range(workers)]
    for p in procs:
        p.start()
    try:
        while any(p.is_alive() for p in procs):
            for p in procs:
                p.join(timeout=2.0 / len(procs))
            _refresh(bar, study)
    except KeyboardInterrupt as exc:
        for p in procs:  # Ctrl-C reached the whole group; SIGTERM only this process: pass it on
            if isinstance(exc, Terminated) and p.is_alive():
                p.terminate()
        for p in procs:  # give them time to mark their trials FAIL and stop their servers
            p.join(timeout=30)
        raise
    _refresh(bar, study)
    failed = [p.exitcode for p in procs if p.exitcode]
    if failed:
        raise TunerError(f"{len(failed)} of {workers} workers failed (exit codes {failed}); "
                         f"the study is kept: run the same command again to resume")


def _bar(total: int, initial: int, enabled: bool, desc: str):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=min(initial, total), desc=desc, unit="trial", dynamic_ncols=True)


def _refresh(bar, study: optuna.Study) -> None:
    if bar is None:
        return
    bar.n = min(finished_count(study), bar.total)
    best = _best(study)
    if best is not None:
        bar.set_postfix(best=f"{best.value:.3g}/$", trial=best.number, refresh=False)
    bar.refresh()
