"""One trial, for real: where the IO leaves meet (server, config, measurement step, score).

    make_evaluate(launcher, settings, base, traffic) -> Evaluate   (params, Hints) -> TrialRecord
    make_measure(launcher, settings, traffic)   the same measurement of whatever config the server runs
    session(settings)                           context manager: server up, yields an Evaluate

A trial: the base config with only the tuned fields changed (`tuner.space.apply`) is loaded on the
server (read back and compared by the launcher) and warmed up to steady state (`tuner.trial.warmup`: a server
that never settles leaves the trial `unstable`; one whose model fails the warm-up's requests is measured and
infeasible, its reason the model failing with its first error), then
1. the profile is replayed at the recorded load (`traffic.speed`) for one step (`tuner.trial.step`, with its
   retry policy): the SLA there decides feasibility, and Triton's execution time gives the utilization
   score. A replay the load generator could not keep on time even after the retries leaves the trial
   `unmeasured`: not the configuration's fault, and no score;
2. if the SLA held, the capacity is searched (bracketing + bisection on the speed, `tuner.trial.capacity`), each
   step a probe of the profile's busiest stretch at the step's speed.
An evaluation of the configuration the server has run since the last one, measured (the re-measurement's
mirrored rounds, `A B C C B A`), is neither loaded again nor warmed: the server is at steady state on it.
A server that dies is started again: during a measurement, the configuration `crashed` (its result, as an
out-of-memory on a GPU); during a load, the load is tried once more first (`LOAD_ATTEMPTS`: Triton's own
crash is no verdict on the configuration), and the measured trial's note says so.
A vLLM-backend model's trial writes its engine knobs into the served copy's model.json instead (a combination
vLLM refuses is the trial's result: `refused`), is not warmed (the warm-up reads Triton's batch statistics,
which an engine batching on its own has not), streams each replay (`tuner.trial.generate`) and is checked
and scored in tokens (`tuner.trial.record.TOKENS`: TTFT and TPOT limits, output tokens per dollar).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd

from tuner import space
from tuner.cost import price_for
from tuner.errors import ConfigError, ServerError
from tuner.formats import first_line
from tuner.measurement import Measurement
from tuner.modelconfig import ModelConfig
from tuner.server import Launcher, make_launcher
from tuner.settings import StudySettings
from tuner.study import base_config, base_engine, study_traffic
from tuner.traffic import mean_output_tps, mean_rps, peak_rps
from tuner.trial.capacity import Capacity, Hints, Step, find_capacity
from tuner.trial.generate import keeping_up, load_check, make_settled_probe, make_token_probe
from tuner.trial.record import (
    CRASHED,
    MEASURED,
    REFUSED,
    REQUESTS,
    TOKENS,
    UNMEASURED,
    UNSTABLE,
    Evaluate,
    TrialRecord,
    Warmup,
    assess,
)
from tuner.trial.step import make_probe, step_windows
from tuner.trial.warmup import warm_up

__all__ = ["make_evaluate", "make_measure", "session"]

# an informed guess (the best trial's capacity) brackets in small steps; a blind one doubles
INFORMED_GROWTH = 1.3
# the SLA constraint of a configuration that crashed the server: worse than any measured violation
CRASHED_VIOLATION = 1000.0
# loads of one configuration before a server that dies during them counts as the configuration's crash:
# one death can be Triton's own (its Python backend once aborted on a reload after ~100 loads, in the
# shared memory's lock: boost::interprocess::lock_exception), which is no verdict on the configuration
LOAD_ATTEMPTS = 2



def make_evaluate(launcher: Launcher, settings: StudySettings, base: ModelConfig, *, traffic: pd.DataFrame,
                  engine: dict | None = None, on_measure: Callable[[Measurement], None] | None = None) -> Evaluate:
    """An `Evaluate` for the study on a started server: apply the trial's config, then measure it.
    `engine`: a vLLM-backend model's engine arguments (its model.json), which the trial's engine knobs
    change instead (`tuner.study.base_engine`); `on_measure`: every replay's measurement (progress)."""
    measure_running = make_measure(launcher, settings, traffic, generative=engine is not None, on_measure=on_measure)
    price = price_for(settings.cost, source=settings.source).price_per_hour
    running: list[space.Params | None] = [None]  # the configuration measured last, still loaded

    def evaluate(params: space.Params, hints: Hints) -> TrialRecord:
        record = _evaluate(params, hints)
        running[0] = dict(params) if engine is None and record.outcome == MEASURED else None
        return record

    def _evaluate(params: space.Params, hints: Hints) -> TrialRecord:
        if not launcher.is_alive():  # a previous configuration crashed it: start afresh
            _restart(launcher)
            running[0] = None
        if running[0] == params:  # loaded and measured just now: at steady state (a vLLM engine is never
            # kept: its prefix cache would hold the replay's prompts)
            return measure_running(params, hints, warmed=True)
        running[0] = None
        if engine is None:
            config = space.apply(base, params, settings.search)
            load = functools.partial(launcher.apply_config, settings.model, config)
        else:  # vLLM batches: the engine knobs go to model.json, config.pbtxt stays the model's
            try:
                args = space.apply_engine(engine, space.split(params)[1])
            except ConfigError as exc:  # a combination vLLM will not start: the configuration's result
                return TrialRecord(params=dict(params), outcome=REFUSED, violation=CRASHED_VIOLATION,
                                   sla_reason=str(exc).split(": ", 1)[-1], price_per_hour=price,
                                   peak_rps=peak_rps(traffic, settings.traffic.speed))
            load = functools.partial(launcher.apply_engine_args, settings.model, base, args)
        survived = ""
        for attempt in range(LOAD_ATTEMPTS):
            try:
                load()
                break
            except ServerError as exc:
                if launcher.is_alive():
                    raise
                crash = _crashed(launcher, exc)
                _restart(launcher)
                if attempt + 1 == LOAD_ATTEMPTS:  # every load brought it down: the configuration's result
                    return crashed(params, f"the server crashed loading this configuration "
                                           f"{LOAD_ATTEMPTS} times: {crash[0]}", crash[1])
                survived = (f"the server crashed during this configuration's load and was started again, "
                            f"the second load held: {crash[0]}")
        try:
            record = measure_running(params, hints)
        except ServerError as exc:
            if launcher.is_alive():
                raise
            # the configuration brought the server down (as an out-of-memory can on a GPU): that is
            # the configuration's result, not a failed trial
            crash = _crashed(launcher, exc)
            _restart(launcher)
            return crashed(params, f"the server crashed: {crash[0]}", crash[1])
        if survived:
            record = dataclasses.replace(record, note="\n".join(filter(None, (survived, record.note))))
        return record

    def crashed(params: space.Params, reason: str, note: str) -> TrialRecord:
        return TrialRecord(params=dict(params), outcome=CRASHED, violation=CRASHED_VIOLATION, sla_reason=reason,
                           note=note, price_per_hour=price, peak_rps=peak_rps(traffic, settings.traffic.speed))

    return evaluate


def _crashed(launcher: Launcher, exc: ServerError) -> tuple[str, str]:
    """A dead server's error's first line, and the note a crashed trial keeps: that line and the server's
    last log lines, read before it starts again (the error may be a refused connection that names no cause)."""
    line = first_line(exc)
    return line, f"{line}\nlast log lines:\n{launcher.logs(20)}"


def _restart(launcher: Launcher) -> None:
    launcher.stop()
    launcher.start()
    launcher.wait_ready()


def make_measure(launcher: Launcher, settings: StudySettings, traffic: pd.DataFrame, *, capacity: bool = True,
                 on_measure: Callable[[Measurement], None] | None = None, generative: bool = False) -> Evaluate:
    """Measure the configuration the server runs now, as a trial is measured: `(params, Hints) ->
    TrialRecord` (`params` must hold its max_batch_size, unless `generative`: a vLLM-backend model,
    streamed and scored in tokens). Without `capacity`, only the recorded load is replayed.
    `on_measure` sees every replay's measurement (progress)."""
    price = price_for(settings.cost, source=settings.source).price_per_hour
    cap = settings.search.capacity
    load_speed = settings.traffic.speed
    peak = peak_rps(traffic, load_speed)
    rate = mean_rps(traffic)
    windows = step_windows(traffic, settings)
    scoring = TOKENS if generative else REQUESTS
    # a generative capacity step's seconds of latency do not show an engine falling behind: its token rate does
    step_check = keeping_up(scoring.check, tokens_per_s=mean_output_tps(traffic)) if generative else scoring.check

    def measure_running(params: space.Params, hints: Hints, *, warmed: bool = False) -> TrialRecord:
        """`warmed`: the server has run this configuration at steady state since it was loaded: no warm-up."""
        if generative:
            # no warm-up: its shape sweep and steady-state windows read Triton's batch statistics, which a
            # model that batches inside its engine does not have; the engine starts with each trial's load
            warm = None
            probe = make_token_probe(launcher, settings, windows, on_measure=on_measure)
        else:
            mbs = int(params["max_batch_size"])
            warm = (warm_up(launcher, settings, traffic, max_batch_size=mbs)
                    if settings.measurement.warmup and not warmed else None)
            probe = make_probe(launcher, settings, windows, max_batch_size=mbs, on_measure=on_measure)
        load = probe(load_speed)
        used: dict[float, float] = {}  # a generative trial's capacity steps: speed -> their warm-up
        if generative and load.valid:
            # a short step from an idle engine measures a burst it absorbs, not the rate it holds (see
            # make_settled_probe): the capacity steps are warmed by a request's life at the load, then
            # at the fastest step that held
            # ... and a step whose engine fell behind its window ends there: that settles its verdict
            probe, used = make_settled_probe(launcher, settings, traffic, load=load, check=step_check,
                                             on_measure=on_measure, cut_tokens_per_s=mean_output_tps(traffic))
        common = {"params": dict(params), "at_load": scoring.figures(load), "price_per_hour": price, "peak_rps": peak,
                  "warmup": warm}
        if warm is not None and warm.failing:  # the model fails its requests: the configuration's result, a verdict
            return failing(load, warm, common)
        if not load.valid:  # the load generator's limit, not the configuration's: no verdict
            return TrialRecord(outcome=UNMEASURED, note=load.invalid_reason, **common)
        if warm is not None and not warm.stable:  # measured on a server still changing: no verdict either
            return TrialRecord(outcome=UNSTABLE, note=warm.reason, **common)
        def capacity_search(lower: Step) -> Capacity:
            start = hints.start_speed or max(cap.start_speed, load_speed)
            return find_capacity(probe, settings.sla, cap, start_speed=start, beat_rps=hints.beat_rps,
                                 min_speed=load_speed, growth=INFORMED_GROWTH if hints.start_speed else 2.0,
                                 rate=rate, lower=lower, upper_guess=hints.upper_speed, check=step_check)

        # a generative model's load is judged as its capacity steps are: does the engine keep up with it?
        at_load = load_check(scoring.check, load, tokens_per_s=mean_output_tps(traffic)) if generative else None
        record = assess(params, load, settings.sla, capacity=capacity_search if capacity else None,
                        price_per_hour=price, load_speed=load_speed, peak_rps=peak,
                        peak_at=lambda s: peak_rps(traffic, s), warmup=warm, scoring=scoring, check=at_load)
        # the warm-up of the step that decided the capacity: `tuner replay --step --warmup` replays it again
        return dataclasses.replace(record, step_warmup_s=used.get(record.capacity_speed)) if used else record

    def failing(load: Measurement, warm: Warmup, common: dict) -> TrialRecord:
        """The record of a configuration whose model failed its warm-up's requests: measured and infeasible
        (never unsteady: it fails, it is not slow), its reason the warm-up's, with the first error, after what
        the replay at the load broke."""
        check = scoring.check(load, settings.sla)
        return TrialRecord(outcome=MEASURED, sla_met=False, violation=check.violation if not check.ok else
                           CRASHED_VIOLATION, sla_reason="; ".join(filter(None, (check.reason, warm.reason))),
                           note=warm.reason, **common)

    return measure_running


@contextlib.contextmanager
def session(settings: StudySettings, log_dir: str | None = None, *,
            on_measure: Callable[[Measurement], None] | None = None) -> Iterator[Evaluate]:
    """Start the study's server, yield its `Evaluate`, stop the server (`on_measure`: every replay's
    measurement, for progress within a trial)."""
    base = base_config(settings)
    traffic = study_traffic(settings)
    engine = base_engine(settings, base)
    if log_dir is not None:  # one folder per process: workers each run their own server
        log_dir = str(Path(log_dir) / f"pid-{os.getpid()}")
    # a vLLM model is loaded by its first trial, with that trial's engine arguments: not at start too
    with make_launcher(settings, log_dir=log_dir, load_models=engine is None) as launcher:  # a remote one restores its config
        yield make_evaluate(launcher, settings, base, traffic=traffic, engine=engine, on_measure=on_measure)
