"""Bring a freshly loaded configuration to steady state before it is measured.

A model process that has just (re)started runs its first executions much slower (on a GPU: CUDA
context, kernel selection and allocator warm-up; the first run of each new input shape is slower again).
A trial measured in that state is measured wrong. So after every load:

1. the shape sweep (`shape_sweep`): one request of each (rows, padded length) the traffic forms, rows
   1 up to the configuration's max_batch_size, each on its own (closed loop: `replay.send_one_by_one`),
   so that every batch shape the measurement will meet has run once;
2. the traffic itself at its recorded load (`traffic.speed`): its busiest stretch lasting
   `measurement.window_s`, replayed again and again (`repeated_stretch`), each repetition one window:
   the warm-up ends when `stable_windows` windows in a row agree on Triton's compute time per
   execution within `stability_pct` (perf_analyzer's rule, with its default 10 %), or after
   `warmup_max_s`, and the configuration is then `unstable`.

The windows replay the same requests, so a warm server computes them alike; what still differs is how
the batcher happened to group them: each window is valued at one batch-size mix (`fixed_mix_ms`): its
own mean time of each batch size, weighted by how often each size ran in the windows compared. Triton's own `model_warmup` config field would
run samples inside the server at load, but a sample that fails (an out-of-memory, on a GPU whose limit
is not known in advance) fails the load, and a running deployment (audit) cannot take it: the client
side does the same work and reads the outcome.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import pandas as pd

from tuner.measurement import stat_deltas
from tuner.server import Launcher
from tuner.settings import MeasurementSettings, StudySettings
from tuner.traffic import shape_columns, step_window
from tuner.trial.record import Warmup

__all__ = ["Warmup", "fixed_mix_ms", "repeated_stretch", "shape_sweep", "steady", "warm_up"]

QUANTILES = (0.1, 0.5, 0.9)  # padded lengths a batch of b requests has (of the max of b lengths)
SAMPLES = 2000


def shape_sweep(traffic: pd.DataFrame, max_batch_size: int, *, seed: int = 0) -> pd.DataFrame:
    """One traffic row per (rows, padded length) a batch of the traffic takes, rows 1 up to
    `max_batch_size`: a batch of b requests is as long as the longest of them, so its lengths are
    quantiles of the longest of b lengths drawn from the traffic (the traffic's own length column:
    `seq_len` or an `<INPUT>:<k>` column; none: rows only)."""
    columns = [c for c in shape_columns(traffic) if c != "batch_size"]
    rng = np.random.default_rng(seed)
    rows = []
    for b in range(1, max(int(max_batch_size), 1) + 1):
        if not columns:
            rows.append({"batch_size": b})
            continue
        draws = {c: traffic[c].to_numpy(dtype=np.int64) for c in columns}
        picks = rng.integers(0, len(traffic), size=(SAMPLES, b))
        longest = {c: v[picks].max(axis=1) for c, v in draws.items()}
        seen = set()
        for q in QUANTILES:
            shape = tuple(int(np.quantile(longest[c], q, method="higher")) for c in columns)
            if shape not in seen:
                seen.add(shape)
                rows.append({"batch_size": b, **dict(zip(columns, shape, strict=True))})
    out = pd.DataFrame(rows)
    out.insert(0, "timestamp", np.arange(len(out), dtype=float))
    return out


def repeated_stretch(traffic: pd.DataFrame, speed: float, window_s: float, *, times: int) -> pd.DataFrame:
    """The busiest stretch of the traffic that lasts `window_s` at `speed`, `times` times back to
    back (timestamps in the recording's seconds), so that every window replays the same requests."""
    part, _ = step_window(traffic, speed, 0.0, measured_s=window_s)
    span = window_s * speed  # one window, in the recording's seconds
    offsets = part["timestamp"].to_numpy(dtype=float) - float(part["timestamp"].iloc[0])
    copies = []
    for k in range(max(int(times), 1)):
        copy = part.copy()
        copy["timestamp"] = offsets + k * span
        copies.append(copy)
    return pd.concat(copies, ignore_index=True)


def fixed_mix_ms(windows: list[dict[int, tuple[int, int]]]) -> list[float]:
    """Each window's compute time per execution (ms), valued at one batch-size mix: the sizes that
    ran in every window, weighted by their executions over all of them; windows with no size in
    common fall back to their plain mean."""
    common = set.intersection(*(set(w) for w in windows)) if windows else set()
    weights = {size: sum(w[size][0] for w in windows) for size in common}
    total = sum(weights.values())
    out = []
    for w in windows:
        if total:
            out.append(sum(weights[s] * w[s][1] / w[s][0] for s in common) / total / 1e6)
        else:
            count, ns = sum(c for c, _ in w.values()), sum(n for _, n in w.values())
            out.append(ns / count / 1e6 if count else float("nan"))
    return out


def steady(windows: list[dict[int, tuple[int, int]]], *, k: int, pct: float) -> bool:
    """Whether the last `k` windows agree within `pct` percent (max / min - 1) at a fixed mix."""
    if len(windows) < k or any(not w for w in windows[-k:]):
        return False
    values = fixed_mix_ms(windows[-k:])
    return bool(np.all(np.isfinite(values)) and min(values) > 0 and max(values) / min(values) - 1 <= pct / 100)


def warm_up(launcher: Launcher, settings: StudySettings, traffic: pd.DataFrame, *, max_batch_size: int,
            on_window: Callable[[float], None] | None = None) -> Warmup:
    """Warm the configuration the server runs now (see the module's docstring)."""
    from tuner.replay import check_fits, replay, send_one_by_one  # Locust runs in its own processes

    m: MeasurementSettings = settings.measurement
    model = settings.model
    started = time.monotonic()
    check_fits(launcher.endpoints.http, model, traffic)  # a row that cannot fit is named as the traffic has it
    sent = None
    if m.shape_sweep:
        sent = send_one_by_one(launcher.endpoints.http, model, shape_sweep(traffic, max_batch_size),
                               timeout_s=settings.replay.request_timeout_s)
    windows: list[dict[int, tuple[int, int]]] = []
    snapshots = [launcher.statistics(model)]

    def watch(_elapsed: float) -> bool:
        snapshots.append(launcher.statistics(model))
        d = stat_deltas(snapshots[-2], snapshots[-1])
        windows.append({size: (count, d["histogram_ns"][size]) for size, count in d["histogram"].items()})
        if on_window is not None and windows[-1]:
            on_window(fixed_mix_ms(windows[-1:])[0])
        return steady(windows, k=m.stable_windows, pct=m.stability_pct) or time.monotonic() - started >= m.warmup_max_s

    part = repeated_stretch(traffic, settings.traffic.speed, m.window_s, times=math.ceil(m.warmup_max_s / m.window_s))
    stable = False
    while time.monotonic() - started < m.warmup_max_s:
        replay(launcher.endpoints, model, part, speed=settings.traffic.speed, settings=settings.replay, warmup_s=0.0,
               duration_s=m.warmup_max_s, stats=lambda: launcher.statistics(model), watch=watch,
               watch_every_s=m.window_s)
        stable = steady(windows, k=m.stable_windows, pct=m.stability_pct)
        if stable:
            break
        snapshots.append(launcher.statistics(model))  # the stretch ran out: again, from a fresh snapshot
    values = tuple(fixed_mix_ms(windows[-m.stable_windows:])) if windows else ()
    reason = "" if stable else (
        f"compute time per execution did not settle within {m.stability_pct:g} % over {m.stable_windows} "
        f"windows of {m.window_s:g} s in {m.warmup_max_s:g} s (last windows: "
        + ", ".join(f"{v:.2f}" for v in values) + " ms)")
    return Warmup(seconds=time.monotonic() - started, sweep_requests=sent.requests if sent else 0,
                  sweep_errors=sent.errors if sent else 0, windows_ms=values, stable=stable, reason=reason)
