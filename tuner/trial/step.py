"""The measurement step: replay a window of the traffic at a speed against the configuration the
server runs, and measure it, with one retry policy. Every command that measures goes through here:
`tuner tune` (each replay of a trial), `tuner audit`, the nightly confirmation, `tuner replay`, `tuner soak`.

    make_probe(launcher, settings, windows, max_batch_size=...) -> Probe     speed -> Measurement
    replay_measured(launcher, settings, part, speed, ...) -> (Measurement, ReplayResult)   one replay,
                                      measured, no retry (the soak's windows: its clock moves on)
    step_windows(traffic, settings)   what a capacity step replays: the busiest stretch at that speed
    whole_traffic(traffic, ...)       the traffic from its start (optionally cut to a duration)
    check_measured(windows, speed, source=...)   refuse, before a server starts, a window whose
                                      measured part holds no request at that speed

The retry policy: a replay whose send lag broke `replay.lag_budget_ms` says nothing about the server,
so it is run again with one more load-generator process (leaving a core to the server), `tries` times
in all; a window with no request due after its warm-up is the schedule's, not the machine's, and is not
run again. The last measurement is returned, valid or not, with the attempts it took: what an invalid
one means is the caller's to say (a capacity step: the search stops there; the replay at the recorded
load: the trial is unmeasured). The repeat policy: a measurement whose SLA percentile lies close to
the limit (`measurement.repeat_near_sla`) decides a close call, so it is repeated on the same window
until two in a row agree within `measurement.stability_pct` (as perf_analyzer repeats its windows),
and the median one stands.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:  # Locust runs in its own processes: the replay package is imported when used
    from tuner.replay import ReplayResult

from tuner.errors import TrafficError
from tuner.measurement import Measurement, measure
from tuner.score import check_sla
from tuner.server import Launcher, exit_watch
from tuner.settings import SlaSettings, StudySettings
from tuner.traffic import due_offsets, step_window
from tuner.trial.capacity import Probe

__all__ = ["TRIES", "Windows", "check_measured", "make_probe", "replay_measured", "retry_workers", "step_windows",
           "whole_traffic", "with_repeats", "with_retries"]

TRIES = 3
# speed -> (the traffic to replay, its warm-up in wall seconds, the schedule's length, where its measured
# window ends, or None: all of it, to its last request)
Windows = Callable[[float], tuple[pd.DataFrame, float, float | None]]


def step_windows(traffic: pd.DataFrame, settings: StudySettings, *, warmup_s: float | None = None,
                 fill: bool = False) -> Windows:
    """Each speed replays the profile's busiest stretch lasting `search.capacity.step_duration_s`,
    after up to `replay.warmup_s` (or `warmup_s`) of the traffic that preceded it (see
    `tuner.traffic.step_window`). With `fill`, a warm-up the traffic before the stretch is too short
    for is made whole with the stretch itself, replayed again just before it (the busiest traffic:
    a warm-up no lighter than the real one)."""
    measured_s = settings.search.capacity.step_duration_s
    before_s = settings.replay.warmup_s if warmup_s is None else warmup_s

    def windows(speed: float) -> tuple[pd.DataFrame, float, float | None]:
        part, warmup = step_window(traffic, speed, before_s, measured_s=measured_s)
        if fill and warmup < before_s - 1e-9 and len(part):
            part, warmup = _filled(part, speed, warmup=warmup, want_s=before_s, span=measured_s * speed)
        if part is traffic:  # the traffic is no longer than a step: all of it, over its own span
            return part, warmup, _until(traffic, speed, warmup + measured_s)
        # the stretch lasts the step whenever its last request is due: the window ends there
        return part, warmup, warmup + measured_s

    return windows


def _filled(part: pd.DataFrame, speed: float, *, warmup: float, want_s: float, span: float
            ) -> tuple[pd.DataFrame, float]:
    """`part` (a warm-up of `warmup` wall seconds, then the measured stretch, `span` of the recording's
    seconds) with copies of its measured stretch put before it until the warm-up lasts `want_s`."""
    stamps = part["timestamp"].to_numpy(dtype=float)
    start = float(stamps[0]) + warmup * speed  # the measured stretch's start, in the recording's seconds
    stretch = part[stamps >= start]
    missing = (want_s - warmup) * speed
    if span <= 0 or missing <= 0:
        return part, warmup
    copies, k = [], 1
    while k * span < missing + span:
        copy = stretch.copy()
        copy["timestamp"] = copy["timestamp"].to_numpy(dtype=float) - k * span - (start - float(stamps[0]))
        copies.append(copy)
        k += 1
    lead = pd.concat(copies[::-1], ignore_index=True)
    lead = lead[lead["timestamp"].to_numpy(dtype=float) >= float(stamps[0]) - missing]
    out = pd.concat([lead, part], ignore_index=True)
    return out, (start - float(out["timestamp"].iloc[0])) / speed


def whole_traffic(traffic: pd.DataFrame, warmup_s: float, duration_s: float | None = None) -> Windows:
    """The traffic from its first request at every speed; `duration_s` measured after the warm-up (no
    longer than the traffic)."""
    return lambda speed: (traffic, warmup_s,
                          None if duration_s is None else _until(traffic, speed, warmup_s + duration_s))


def _until(traffic: pd.DataFrame, speed: float, end: float) -> float | None:
    """The end of a replay of the whole of `traffic` at `speed` asked to last `end` seconds: `end`, or
    None (all of it: its window ends at its last request, the trace's span) where the traffic ends first."""
    due = due_offsets(traffic, speed)
    return end if len(due) and due[-1] >= end else None


def check_measured(windows: Windows, speed: float, *, source: str, hint: str = "replay.warmup_s") -> None:
    """Refuse the replay `windows` make at `speed` when no request is due in its measured part (after
    the warm-up, before the end): it would measure nothing; or when that part lasts no time (it ends at its
    last request, due where the warm-up ends): it would measure no rate. One line naming `source` and what
    to change."""
    part, warmup, end = windows(speed)
    due = due_offsets(part, speed)
    measured = (due >= warmup) & (due < end if end is not None else True)
    if measured.any():
        if end is None and float(due[-1]) <= warmup:  # it ends at its last request, where the warm-up ends
            raise TrafficError(f"{source}: the measured window has no length: at speed {speed:g} its "
                               f"{int(measured.sum())} request(s) are all due at {warmup:.3g} s, where the warm-up "
                               f"ends, and the window ends at the last request; requests per second need requests "
                               f"spread over time ({hint})")
        return
    last = float(due[-1]) if len(due) else 0.0
    where = (f"the traffic lasts {last:.3g} s, within the {warmup:g} s warm-up" if last < warmup else
             f"no request is due between {warmup:g} and {end:g} s")
    raise TrafficError(f"{source}: no requests due in the measured window: at speed {speed:g} {where} ({hint})")


def retry_workers(previous: int, cpus: int | None = None) -> int:
    """Load-generator processes for a re-run after the send lag broke its budget: one more than the
    attempt before used (`previous`), leaving a core to the server, and never fewer (a count asked for
    above the cores stands; on 2 cores a re-run is one process again: another try, reported if it stays
    invalid)."""
    cpus = cpus or os.cpu_count() or 1
    previous = max(previous, 1)
    return max(previous, min(previous + 1, cpus - 1))


def with_retries(run: Callable[[float, int], Measurement], *, tries: int = TRIES,
                 on_measure: Callable[[Measurement], None] | None = None) -> Probe:
    """The retry policy around `run(speed, attempt)`: again while the send lag broke its budget, at
    most `tries` times; the last measurement, with the attempts it took."""

    def probe(speed: float) -> Measurement:
        for attempt in range(tries):
            m = dataclasses.replace(run(speed, attempt), attempts=attempt + 1)
            if on_measure is not None:
                on_measure(m)
            if m.valid or m.requests == 0:  # nothing due to measure: another try would measure nothing again
                break
        return m

    return probe


def with_repeats(probe: Probe, *, sla: SlaSettings, near: float, max_repeats: int, pct: float) -> Probe:
    """A measurement that decides a close call, repeated on the same window: when its SLA percentile
    is within `near` (a share) of the limit, again until two in a row agree within `pct` percent or
    `max_repeats` ran; the median one stands, with the repeats it took, ranked by how far each breaks the
    SLA (`tuner.score.check_sla`'s violation: its percentile against the limit, its errors against their
    budget, whichever is worse). Of an even count the worse middle one stands: two runs that straddle
    the limit fail it, as their median (between them) would, where the better would pass a step that
    one real run broke (by its latency or by its errors)."""

    def repeated(speed: float) -> Measurement:
        runs = [probe(speed)]
        first = runs[0]
        latency = first.latency(sla.percentile) if first.valid else math.nan
        if not (math.isfinite(latency) and abs(latency / sla.latency_ms - 1.0) <= near):
            return first
        while len(runs) < max_repeats:
            m = probe(speed)
            if not m.valid:
                break
            runs.append(m)
            a, b = runs[-2].latency(sla.percentile), runs[-1].latency(sla.percentile)
            if abs(a - b) <= pct / 100 * max(a, b):
                break
        ranked = sorted(runs, key=lambda r: (check_sla(r, sla).violation, r.latency(sla.percentile)))
        return dataclasses.replace(ranked[len(ranked) // 2], repeats=len(runs))

    return repeated


def make_probe(launcher: Launcher, settings: StudySettings, windows: Windows, *, max_batch_size: int,
               tries: int = TRIES, repeats: bool = True, progress: bool = False,
               on_measure: Callable[[Measurement], None] | None = None,
               on_replay: Callable[[ReplayResult], None] | None = None) -> Probe:
    """Measure the configuration the server runs now at a speed (`max_batch_size` is that
    configuration's, for the fill rate). `on_measure` sees every replay's measurement, `on_replay`
    every replay (its requests: `tuner replay --records`)."""
    used = [0]  # the processes the attempt before used (the first: as many as the replay decides)

    def run(speed: float, attempt: int) -> Measurement:
        part, warmup, duration = windows(speed)
        # a re-run after the send lag broke its budget: more load-generator processes
        workers = retry_workers(max(settings.replay.workers, used[0])) if attempt else None
        m, result = replay_measured(launcher, settings, part, speed=speed, warmup_s=warmup, duration_s=duration,
                                    max_batch_size=max_batch_size, workers=workers, progress=progress)
        used[0] = m.workers
        if on_replay is not None:
            on_replay(result)
        return m

    probe = with_retries(run, tries=tries, on_measure=on_measure)
    if not repeats or settings.measurement.max_repeats <= 1:
        return probe
    m = settings.measurement
    return with_repeats(probe, sla=settings.sla, near=m.repeat_near_sla, max_repeats=m.max_repeats,
                        pct=m.stability_pct)


def replay_measured(launcher: Launcher, settings: StudySettings, part: pd.DataFrame, *, speed: float,
                    warmup_s: float, max_batch_size: int, duration_s: float | None = None,
                    workers: int | None = None, progress: bool = False) -> tuple[Measurement, ReplayResult]:
    """One replay of `part` at `speed` against the configuration the server runs, measured (no retry):
    the measurement, and the replay's result for what a caller reads beyond it (the soak: errors and
    Triton's counters). `workers` overrides `replay.workers`. A server that exits during the replay
    ends it within a second, with the launcher's error (ServerError)."""
    from tuner.replay import replay  # Locust runs in its own processes; this side stays unpatched

    model = settings.model
    replay_settings = settings.replay if workers is None else dataclasses.replace(settings.replay, workers=workers)
    # a server that dies ends the replay at once, with the launcher's error (not the schedule's end)
    result = replay(launcher.endpoints, model, part, speed=speed, settings=replay_settings, warmup_s=warmup_s,
                    duration_s=duration_s, stats=lambda: launcher.statistics(model), progress=progress,
                    watch=exit_watch(launcher, model))
    m = measure(result.records, result.stats_before, result.stats_after, speed=speed, warmup_s=result.warmup_s,
                lag_budget_ms=settings.replay.lag_budget_ms, max_batch_size=max_batch_size,
                sla_percentile=settings.sla.percentile, load_generator_cpu=result.load_generator_cpu,
                workers=result.workers, duration_s=result.duration_s)
    return m, result
