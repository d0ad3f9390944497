"""Several worker processes on this machine, each with its own server, on one study."""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Callable

import optuna

from tuner.errors import Terminated, TunerError, sigterm_as_interrupt
from tuner.search._loop import make_sampler, run_trials
from tuner.search._store import open_storage
from tuner.settings import StudySettings

OpenEvaluation = Callable[[], contextlib.AbstractContextManager]  # yields an Evaluate


def _worker(settings: StudySettings, open_evaluation: OpenEvaluation, storage: str, *, n_trials: int,
            timeout_s: float | None) -> None:
    study = optuna.load_study(study_name=settings.name, storage=open_storage(storage, settings.search),
                              sampler=make_sampler(settings.search))
    study.sampler.reseed_rng()  # one seed in every worker would draw the same configurations in each
    try:
        with sigterm_as_interrupt(), open_evaluation() as evaluate:
            run_trials(study, settings, evaluate, n_trials=n_trials, timeout_s=timeout_s)
    except KeyboardInterrupt:
        pass  # the trial is marked FAIL already; the parent reports the interruption


def run_workers(settings: StudySettings, open_evaluation: OpenEvaluation, storage: str, *, n_trials: int,
                workers: int, timeout_s: float | None = None, poll: Callable[[], None] | None = None) -> None:
    """Start `workers` processes on the study and wait for them; `poll` runs while they work (progress).
    `open_evaluation` must pickle: each process opens its own server."""
    ctx = multiprocessing.get_context("spawn")  # a clean interpreter: no inherited threads or servers
    procs = [ctx.Process(target=_worker, args=(settings, open_evaluation, storage),
                         kwargs={"n_trials": n_trials, "timeout_s": timeout_s},
                         name=f"tuner-worker-{i}") for i in range(workers)]
    for p in procs:
        p.start()
    try:
        while any(p.is_alive() for p in procs):
            for p in procs:
                p.join(timeout=2.0 / len(procs))
            if poll is not None:
                poll()
    except KeyboardInterrupt as exc:
        for p in procs:  # Ctrl-C reached the whole group; SIGTERM only this process: pass it on
            if isinstance(exc, Terminated) and p.is_alive():
                p.terminate()
        for p in procs:  # give them time to mark their trials FAIL and stop their servers
            p.join(timeout=30)
        raise
    failed = [p.exitcode for p in procs if p.exitcode]
    if failed:
        raise TunerError(f"{len(failed)} of {workers} workers failed (exit codes {failed}); "
                         f"the study is kept: run the same command again to resume")
