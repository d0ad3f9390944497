"""One trial, for real: where the IO leaves meet (server, config, replay, measure, score).

    make_evaluate(launcher, settings, base_config, traffic) -> Evaluate   (params, Hints) -> TrialResult
    make_measure(launcher, settings, traffic)              the same measurement of whatever config runs
    session(settings)                                      context manager: server up, yields Evaluate
    incumbent_params(base_config, space)                   the current config as trial parameters

A trial: write the trial's config (the base config with only the tuned fields changed), load it on
the server (read back and compared by the launcher), then
1. replay the profile at the recorded load (`traffic.speed`) for one step: the SLA there decides
   feasibility, and Triton's execution time gives the utilization score;
2. if the SLA held, search the capacity (bracketing + bisection on the speed, `tuner.score`), each
   step a short replay: the profile's busiest stretch that lasts `search.capacity.step_duration_s`
   at the step's speed, after the traffic that came before it as the warm-up. A step whose send lag
   broke its budget is replayed again with one more load-generator process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd

from tuner import modelconfig
from tuner.cost import price_for
from tuner.errors import ReplayError, ServerError
from tuner.measure import Measurement, measure
from tuner.modelconfig import ModelConfig, SchedulingParams
from tuner.score import (
    Hints,
    Step,
    TrialResult,
    capacity_score,
    check_sla,
    find_capacity,
    monthly_cost,
    servers_needed,
    utilization_score,
)
from tuner.server import Launcher, make_launcher
from tuner.settings import SearchSettings, StudySettings
from tuner.traffic import busiest_window, mean_rps, peak_rps, read_traffic, step_window, window

# an informed guess (the best trial's capacity) brackets in small steps; a blind one doubles
INFORMED_GROWTH = 1.3
# the SLA constraint of a configuration that crashed the server: worse than any measured violation
CRASHED = 1000.0


def preferred_sizes(strategy: str, max_batch_size: int) -> tuple[int, ...] | None:
    if strategy == "max":
        return (max_batch_size,)
    if strategy == "powers_of_two":
        sizes, p = [], 1
        while p < max_batch_size:
            sizes.append(p)
            p *= 2
        return (*sizes, max_batch_size)
    return None  # "none": leave the base config's (too large ones are dropped by apply_params)


def scheduling(params: dict, space: SearchSettings) -> SchedulingParams:
    mbs = int(params["max_batch_size"])
    strategy = params.get("preferred_batch_size", space.preferred_batch_size)
    return SchedulingParams(
        max_batch_size=mbs,
        max_queue_delay_microseconds=int(params["max_queue_delay_microseconds"]),
        preferred_batch_size=preferred_sizes(strategy, mbs),
        instance_count=params.get("instance_count"),
    )


def trial_config(base: ModelConfig, params: dict, space: SearchSettings) -> ModelConfig:
    return modelconfig.apply_params(base, scheduling(params, space))


def incumbent_params(base: ModelConfig, space: SearchSettings) -> dict:
    """The base config's own values for the tuned parameters (the first trial of a new study)."""
    params = {
        "max_batch_size": int(base.max_batch_size),
        "max_queue_delay_microseconds": int(base.dynamic_batching.max_queue_delay_microseconds),
    }
    if space.preferred_batch_size == "search":
        sizes = list(base.dynamic_batching.preferred_batch_size)
        params["preferred_batch_size"] = "max" if sizes == [base.max_batch_size] else "none"
    if space.instance_count is not None:
        groups = list(base.instance_group)
        params["instance_count"] = int(groups[0].count or 1) if groups else 1
    return params


def study_traffic(settings: StudySettings) -> pd.DataFrame:
    """The profile the study replays: the file, cut to the study's window if it names one."""
    t = settings.traffic
    df = read_traffic(t.path)
    if t.busiest_s is not None:
        start, _ = busiest_window(df, t.busiest_s)
        df = window(df, start, t.busiest_s)
    elif t.start_s is not None or t.duration_s is not None:
        df = window(df, t.start_s, t.duration_s)
    return df


def retry_workers(requested: int, attempt: int, cpus: int | None = None) -> int:
    """Load-generator processes for a re-run: one more per attempt, leaving a core to the server
    (on 2 cores a re-run is one process again: another try, and reported if it stays invalid)."""
    cpus = cpus or os.cpu_count() or 1
    return max(1, min((requested or 1) + attempt, cpus - 1))


def make_evaluate(launcher: Launcher, settings: StudySettings, base: ModelConfig, traffic: pd.DataFrame):
    """An `Evaluate` for the study on a started server."""
    price = price_for(settings.cost).price_per_hour
    peak = peak_rps(traffic, settings.traffic.speed)
    measured = make_measure(launcher, settings, traffic)

    def evaluate(params: dict, hints: Hints) -> TrialResult:
        if not launcher.is_alive():  # a previous configuration crashed it: start afresh
            restart()
        config = trial_config(base, params, settings.search)
        launcher.apply_config(settings.model, config)
        try:
            return measured(int(params["max_batch_size"]), hints)
        except ServerError as exc:
            if launcher.is_alive():
                raise
            # the configuration brought the server down (as an out-of-memory can on a GPU): that is
            # the configuration's result, not a failed trial
            restart()
            return TrialResult(feasible=False, violation=CRASHED, capacity_rps=0.0, capacity_speed=0.0,
                               scores={"capacity": None, "utilization": None},
                               attrs={"sla_reason": f"the server crashed: {str(exc).splitlines()[0]}",
                                      "server_error": str(exc),  # with the server's last log lines
                                      "crashed": True, "valid": True, "price_per_hour": price,
                                      "peak_rps": peak})

    def restart() -> None:
        launcher.stop()
        launcher.start()
        launcher.wait_ready()

    return evaluate


Measured = Callable[[int, Hints], TrialResult]


def make_measure(launcher: Launcher, settings: StudySettings, traffic: pd.DataFrame,
                 capacity: bool = True, on_step: Callable[[Measurement], None] | None = None) -> Measured:
    """Measure the configuration the server runs now, as a trial is measured: `(max_batch_size,
    Hints) -> TrialResult`. Without `capacity`, only the recorded load is replayed. `on_step` sees
    every replay's measurement (progress)."""
    from tuner.replay import replay  # the replay runs Locust in subprocesses; this side stays unpatched

    price = price_for(settings.cost).price_per_hour
    cap = settings.search.capacity
    load_speed = settings.traffic.speed
    peak = peak_rps(traffic, load_speed)
    rate = mean_rps(traffic)

    def run(speed: float, attempt: int, max_batch_size: int) -> Measurement:
        replay_settings = settings.replay
        if attempt:  # the last replay's send lag broke its budget: more load-generator processes
            replay_settings = dataclasses.replace(settings.replay, workers=retry_workers(settings.replay.workers,
                                                                                         attempt))
        part, warmup = step_window(traffic, speed, settings.replay.warmup_s, cap.step_duration_s)
        result = replay(launcher.endpoints, settings.model, part, speed, replay_settings, warmup_s=warmup,
                        duration_s=warmup + cap.step_duration_s, stats=lambda: launcher.statistics(settings.model))
        m = measure(result.records, result.stats_before, result.stats_after, speed=speed,
                    warmup_s=result.warmup_s, lag_budget_ms=settings.replay.lag_budget_ms,
                    max_batch_size=max_batch_size, sla_percentile=settings.sla.percentile,
                    load_generator_cpu=result.load_generator_cpu, workers=result.workers,
                    duration_s=result.duration_s)
        if on_step is not None:
            on_step(m)
        return m

    def measured(mbs: int, hints: Hints) -> TrialResult:
        load = run(load_speed, 0, mbs)
        for attempt in (1, 2):
            if load.valid:
                break
            load = run(load_speed, attempt, mbs)
        if not load.valid:  # the load generator's fault, not the configuration's: fail the trial
            raise ReplayError(f"replay at the recorded load stayed invalid after 3 tries: {load.invalid_reason}")
        sla = check_sla(load, settings.sla)
        attrs: dict = {**_figures(load, ""), "sla_reason": sla.reason, "valid": load.valid,
                       "invalid_reason": load.invalid_reason, "offered_rps_at_load": load.offered_rps,
                       "peak_rps": peak}
        capacity_rps = capacity_speed = 0.0
        pruned = False
        latencies: tuple[float, ...] = ()
        if sla.ok and capacity:
            start = hints.start_speed or max(cap.start_speed, load_speed)
            found = find_capacity(
                lambda s, attempt: run(s, attempt, mbs), settings.sla, cap, start_speed=start,
                beat_rps=hints.beat_rps, min_speed=load_speed,
                growth=INFORMED_GROWTH if hints.start_speed else 2.0, rate=rate,
                lower=Step(load_speed, load, sla, 1),
            )
            capacity_rps, capacity_speed, pruned = found.capacity_rps, found.speed, found.pruned
            at_cap = found.at_capacity
            attrs.update(
                capacity_steps=len(found.steps),
                capacity_converged=found.converged,
                capacity_limited_by=found.limited_by,
                capacity_upper_rps=found.upper_rps,
                capacity_upper_speed=found.upper_speed,
                capacity_lag_retries=sum(s.attempts - 1 for s in found.steps),
            )
            if at_cap is not None:
                attrs.update(_figures(at_cap, "capacity_"))
                latencies = tuple(at_cap.latencies_ms.tolist())
        # at its capacity speed the server holds the profile's peaks scaled alike
        servers = servers_needed(load_speed, capacity_speed)
        attrs.update(servers_needed=servers, monthly_cost=monthly_cost(servers, price),
                     price_per_hour=price)
        scores = {
            "capacity": capacity_score(capacity_rps, price) if capacity_rps > 0 else None,
            "utilization": utilization_score(load, price) if sla.ok else None,
        }
        return TrialResult(feasible=sla.ok, violation=sla.violation,
                           capacity_rps=capacity_rps, capacity_speed=capacity_speed, scores=scores,
                           pruned=pruned, attrs=attrs, latencies_ms=latencies)

    return measured


def _figures(m: Measurement, prefix: str) -> dict:
    out = {f"{prefix}latency_{k}_ms": _num(v) for k, v in m.latency_ms.items()}
    out.update({
        f"{prefix}fill_rate": m.fill_rate,
        f"{prefix}mean_batch_size": m.mean_batch_size,
        f"{prefix}error_rate": m.error_rate,
        f"{prefix}throughput_rps": m.throughput_rps,
        f"{prefix}busy_s": m.busy_s,
        # Triton's own split of the time: waiting in the queue per request, computing per execution
        f"{prefix}queue_ms": _num(m.queue_ms_mean),
        f"{prefix}compute_ms": _num(m.compute_ms_mean),
        f"{prefix}send_lag_p99_ms": _num(m.send_lag_ms.get("p99")),
        f"{prefix}batch_histogram": json.dumps({str(k): v for k, v in sorted(m.batch_histogram.items())}),
    })
    if not prefix:
        out.update(requests=m.requests, errors=m.errors, speed=m.speed)
    return out


def _num(value) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def base_config(settings: StudySettings) -> ModelConfig:
    """The model's current config.pbtxt in the study's repository (the incumbent)."""
    return modelconfig.load(Path(settings.model_repository) / settings.model / "config.pbtxt")


@contextlib.contextmanager
def session(settings: StudySettings, log_dir: str | None = None) -> Iterator:
    """Start the study's server, yield its `Evaluate`, stop the server."""
    base = base_config(settings)
    traffic = study_traffic(settings)
    if log_dir is not None:  # one folder per process: workers each run their own server
        log_dir = str(Path(log_dir) / f"pid-{os.getpid()}")
    with make_launcher(settings, log_dir=log_dir) as launcher:  # a remote one restores its config
        yield make_evaluate(launcher, settings, base, traffic)
