"""Bring a freshly loaded configuration to steady state before it is measured.

A model process that has just (re)started runs its first executions much slower (on a GPU: CUDA
context, kernel selection and allocator warm-up; the first run of each new input shape is slower again).
A trial measured in that state is measured wrong. So after every load:

1. the shape sweep (`shape_sweep`): one request of each (rows, padded length) the traffic forms, rows
   1 up to the configuration's max_batch_size, each on its own (closed loop: `replay.send_one_by_one`),
   so that every batch shape the measurement will meet has run once;
2. the traffic itself at its recorded load (`traffic.speed`): its busiest stretch lasting
   `measurement.window_s`, replayed again and again (`repeated_stretch`), Triton's statistics read every
   `window_s` (a tick), until the configuration is at steady state, or `warmup_max_s` after the sweep
   has passed and it is `unstable`.

A warm-up that failed more of its requests (the shape sweep's and the windows') than it served did not
settle because the model fails (a model that raises, a stub process that died), not because it is slow: it is `failing`, and its
reason says so with the first error, so that the trial is judged as a model that fails its requests
(`tuner.trial.run`), not as one that never settled.

The steady-state rule (`steady`) judges a window by the noise its executions carry, so that a model
serving a few requests per second, where a tick holds a handful of executions of mixed batch sizes and
lengths, is judged as fairly as one serving thousands:

- a window is sized by executions, not seconds: it closes at the first tick at which it holds at least
  `MIN_EXECUTIONS` (12) executions (at a high rate one tick, as before);
- each window is valued at one batch-size mix (`fixed_mix_ms`): its compute time against what its own
  mix of sizes takes over the windows compared (each size's median over the windows' means), times
  the mean at the pooled mix, so a window that happened to form larger batches is not slower for it;
- its standard error (`uncertainty_ms`) comes from how its ticks stray from its pace (each tick replays
  the same requests: what varies is how the batcher grouped them), the spread taken as the median over
  the windows compared, so one disturbed window (a cold start) cannot widen its own tolerance; a window
  of one tick (a high rate) has none;
- `stable_windows` (3) windows in a row are steady when every two of them differ by at most `Z` (3)
  standard errors of their difference (at most `MAX_APART`, half the smaller: a drift widens its own
  windows' errors), or `stability_pct` (10 %, perf_analyzer's rule: the floor that
  many executions reach), or `FLOOR_MS` (0.05 ms: the backend's own jitter on a very fast model),
  whichever is largest. A window with no execution says nothing.

A real drift still shows: a cold start several times slower for the first executions puts its window
many standard errors off the next ones, and a slowdown that goes on moves the windows apart faster
than their noise. The message of an `unstable` configuration lists the windows it saw, each with its
standard error and executions ("no execution in the window" when none ran).

Triton's own `model_warmup` config field would run samples inside the server at load, but a sample
that fails (an out-of-memory, on a GPU whose limit is not known in advance) fails the load, and a running deployment (audit) cannot take it: the client
side does the same work and reads the outcome.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import pandas as pd

from tuner.measurement import error_line, stat_deltas
from tuner.server import Launcher, exit_watch
from tuner.settings import MeasurementSettings, StudySettings
from tuner.traffic import shape_columns, step_window
from tuner.trial.record import Warmup

__all__ = ["FLOOR_MS", "MAX_APART", "MIN_EXECUTIONS", "Z", "Tick", "Warmup", "Window", "describe_windows", "executions",
           "fixed_mix_ms", "model_failing", "repeated_stretch", "rule_text", "shape_sweep", "steady", "uncertainty_ms",
           "warm_up", "windows_of"]

QUANTILES = (0.1, 0.5, 0.9)  # padded lengths a batch of b requests has (of the max of b lengths)
SAMPLES = 2000
Tick = dict[int, tuple[int, int]]  # one poll of Triton's statistics: batch size -> (executions, compute ns)
Window = Tick | list[Tick]         # a window: its ticks (one tick alone stands for a one-tick window)

MIN_EXECUTIONS = 12  # a window closes at the first tick at which it holds this many executions
Z = 3.0              # consecutive windows agree within this many standard errors of their difference
FLOOR_MS = 0.05      # ... or this much (the Python backend's own jitter per execution): never called drift
# ... but never more than this share of the smaller: a window's standard error comes from how its ticks
# stray from its pace, and a drift within the window widens it too, so a server 3 % slower at every
# execution, on a loaded machine, had windows of 47, 57 and 86 ms per execution agree within 3 standard
# errors (13, 9 and 9 ms) (CI, four test workers). Windows half apart at one mix are not a steady state.
MAX_APART = 0.5


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


def _ticks(window: Window) -> list[Tick]:
    return [window] if isinstance(window, dict) else list(window)


def _totals(window: Window) -> Tick:
    out: dict[int, tuple[int, int]] = {}
    for tick in _ticks(window):
        for size, (count, ns) in tick.items():
            c, n = out.get(size, (0, 0))
            out[size] = (c + count, n + ns)
    return out


def executions(window: Window) -> int:
    """How many executions a window holds."""
    return sum(c for c, _ in _totals(window).values())


def _spread(window: Window, ref: dict[int, float]) -> float:
    """How far one tick's compute time strays from what its batch-size mix takes at the window's pace,
    relative (a variance per unit of expected time squared; NaN: fewer than two ticks ran). The ticks
    replay the same requests, so a tick is the unit that varies (which requests the batcher grouped)."""
    cells = [(sum(ns for s, (c, ns) in t.items() if s in ref),
              sum(c * ref[s] for s, (c, _) in t.items() if s in ref)) for t in _ticks(window)]
    cells = [(o, e) for o, e in cells if e]
    if len(cells) < 2:
        return math.nan
    pace = sum(o for o, _ in cells) / sum(e for _, e in cells)
    return sum((o - pace * e) ** 2 for o, e in cells) / sum(e * e for _, e in cells) * len(cells) / (len(cells) - 1)


def _index(windows: list[Window]) -> tuple[list[float], list[float], float]:
    """Each window's time per execution against the time its batch-size mix takes on average over the
    windows (1 = as usual), its standard error, and the mean time (ns) per execution at the pooled mix."""
    totals = [_totals(w) for w in windows]
    seen: dict[int, int] = {}
    for t in totals:
        for size, (count, _ns) in t.items():
            if count:
                seen[size] = seen.get(size, 0) + 1
    # a size that ran in one window only compares nothing (alone: every size of it)
    sizes = {s for s, k in seen.items() if k >= 2 or len(windows) == 1}
    # each size's time: the median of the windows' means, so that one disturbed window (a cold start)
    # does not shift what the others are judged against
    ref = {s: float(np.median([t[s][1] / t[s][0] for t in totals if t.get(s, (0, 0))[0]])) for s in sizes}
    pooled = sum(sum(t[s][0] for t in totals if s in t) for s in sizes)
    mean_ns = sum(ref[s] * sum(t[s][0] for t in totals if s in t) for s in sizes) / pooled if pooled else math.nan
    index, spread, weights = [], [], []
    for w in windows:
        ticks = [sum(c * ref[s] for s, (c, _) in t.items() if s in ref) for t in _ticks(w)]
        expected = sum(ticks)
        if not expected:
            index.append(math.nan)
            spread.append(math.nan)
            weights.append(math.nan)
            continue
        index.append(sum(ns for s, (_, ns) in _totals(w).items() if s in ref) / expected)
        spread.append(_spread(w, ref))
        weights.append(sum(e * e for e in ticks) / expected ** 2)
    # the noise per tick: the median of the windows' own spreads, so one disturbed window (a cold
    # start) cannot widen the tolerance it is judged by
    known = [v for v in spread if math.isfinite(v)]
    cv2 = float(np.median(known)) if known else 0.0
    errors = [math.sqrt(cv2 * wt) if math.isfinite(wt) else math.nan for wt in weights]
    return index, errors, mean_ns


def windows_of(ticks: list[Tick]) -> tuple[list[Window], list[Tick]]:
    """The ticks cut into windows of at least `MIN_EXECUTIONS` executions each, and the ticks of the
    window still filling."""
    windows: list[Window] = []
    current: list[Tick] = []
    for tick in ticks:
        current.append(tick)
        if executions(current) >= MIN_EXECUTIONS:
            windows.append(current)
            current = []
    return windows, current


def fixed_mix_ms(windows: list[Window]) -> list[float]:
    """Each window's compute time per execution (ms), valued at one batch-size mix: its time against
    what its own mix takes over the windows (each size at the median of the windows' means), times the
    mean at the pooled mix; sizes that ran in one window only are left out. A window with none of the
    compared sizes falls back to its plain mean (NaN with no execution)."""
    index, _, mean_ns = _index(windows)
    out = []
    for w, i in zip(windows, index, strict=True):
        if math.isfinite(i):
            out.append(i * mean_ns / 1e6)
        else:
            t = _totals(w)
            count, ns = sum(c for c, _ in t.values()), sum(n for _, n in t.values())
            out.append(ns / count / 1e6 if count else math.nan)
    return out


def uncertainty_ms(windows: list[Window]) -> list[float]:
    """The standard error (ms) of each window's `fixed_mix_ms`, from how far its ticks stray from its
    pace (the median of the windows' own spreads; NaN for a window of one tick)."""
    _, errors, mean_ns = _index(windows)
    return [e * mean_ns / 1e6 for e in errors]


def steady(windows: list[Window], *, k: int, pct: float) -> bool:
    """Whether the last `k` windows agree: every two of them differ by at most `Z` standard errors of
    their difference (never more than `MAX_APART` of the smaller), `pct` percent of the smaller, or
    `FLOOR_MS`, whichever is largest."""
    last = windows[-k:]
    if len(windows) < k or any(not executions(w) for w in last):
        return False
    values, errors = fixed_mix_ms(last), uncertainty_ms(last)
    if not all(math.isfinite(v) and v > 0 for v in values):
        return False
    for i in range(len(last)):
        for j in range(i + 1, len(last)):
            a, b = values[i], values[j]
            se = math.hypot(errors[i], errors[j]) if math.isfinite(errors[i] + errors[j]) else 0.0
            if abs(a - b) > max(min(Z * se, MAX_APART * min(a, b)), pct / 100 * min(a, b), FLOOR_MS):
                return False
    return True


def describe_windows(windows: list[Window], *, open_window: Window | None = None, window_s: float = 1.0) -> str:
    """The windows a warm-up saw, as its message prints them: each one's time per execution at the
    pooled mix with its standard error and executions; never an empty list."""
    parts = []
    if windows:
        values, errors = fixed_mix_ms(windows), uncertainty_ms(windows)
        for w, v, e in zip(windows, values, errors, strict=True):
            n = executions(w)
            if not n:
                parts.append(f"no execution in the window ({len(_ticks(w)) * window_s:g} s)")
                continue
            err = f" ± {e:.2f}" if math.isfinite(e) and e > 0 else ""
            parts.append(f"{v:.2f}{err} ms ({n} executions)")
    if open_window is not None and (_ticks(open_window) or not windows):
        n = executions(open_window)
        seconds = len(_ticks(open_window)) * window_s
        parts.append(f"still open: {n} executions in {seconds:g} s" if n else
                     f"no execution in the window ({seconds:g} s)")
    return ", ".join(parts)


def rule_text(m: MeasurementSettings) -> str:
    """The steady-state rule in one line, as messages name it."""
    return (f"{m.stable_windows} windows of at least {MIN_EXECUTIONS} executions in a row agreeing on the compute "
            f"time per execution within {Z:g} standard errors (never {MAX_APART * 100:g} % apart) or {m.stability_pct:g} %")


def model_failing(*, stable: bool, failed: int, answered: int, window_errors: int, served: int) -> bool:
    """Whether a warm-up shows the model failing its requests rather than being slow: one that never
    settled and failed more of all its requests (the shape sweep's and the windows') than it served, or
    one that settled (errors that come back fast look steady) with windows at the load that failed more
    than they served. A settled warm-up is not judged by its sweep: a large config's sweep may send
    shapes the model refuses (an out-of-memory) that the traffic at the load never forms."""
    return failed > answered - failed if not stable else window_errors > served


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
        # the sweep's larger rows of long requests may pass the replay's size limit, which the traffic
        # (checked above) never does: left out, those batch sizes warm up in the windows
        sent = send_one_by_one(launcher.endpoints.http, model, shape_sweep(traffic, max_batch_size),
                               timeout_s=settings.replay.request_timeout_s, drop_oversize=True)
    # the windows get their full `warmup_max_s` however long the sweep took (a large max_batch_size on
    # a slow model sweeps for longer than that)
    windows_from = time.monotonic()
    ticks: list[Tick] = []
    snapshots = [launcher.statistics(model)]

    def watch(_elapsed: float) -> bool:
        snapshots.append(launcher.statistics(model))
        d = stat_deltas(snapshots[-2], snapshots[-1])
        tick = {size: (count, d["histogram_ns"][size]) for size, count in d["histogram"].items()}
        ticks.append(tick)
        if on_window is not None and tick:
            on_window(fixed_mix_ms([tick])[0])
        done = steady(windows_of(ticks)[0], k=m.stable_windows, pct=m.stability_pct)
        return done or time.monotonic() - windows_from >= m.warmup_max_s

    part = repeated_stretch(traffic, settings.traffic.speed, m.window_s, times=math.ceil(m.warmup_max_s / m.window_s))
    stable = False
    first_error = sent.first_error if sent else ""
    while time.monotonic() - windows_from < m.warmup_max_s:
        # a server that dies raises the launcher's error at the next tick: never read as settled
        result = replay(launcher.endpoints, model, part, speed=settings.traffic.speed, settings=settings.replay,
                        warmup_s=0.0, duration_s=m.warmup_max_s, stats=lambda: launcher.statistics(model),
                        watch=exit_watch(launcher, model, then=watch), watch_every_s=m.window_s)
        failed = result.records.loc[~result.records["ok"].astype(bool), "error"] if len(result.records) else ()
        first_error = first_error or (str(failed.iloc[0]) if len(failed) else "")
        stable = steady(windows_of(ticks)[0], k=m.stable_windows, pct=m.stability_pct)
        if stable:
            break
        snapshots.append(launcher.statistics(model))  # the stretch ran out: again, from a fresh snapshot
    windows, current = windows_of(ticks)
    last = windows[-m.stable_windows:]
    values = tuple(fixed_mix_ms(last)) if last else ()
    seen = describe_windows(last, open_window=current, window_s=m.window_s)
    # a replay the watch stopped keeps no records: Triton's own counts say how many the windows failed
    deltas = stat_deltas(snapshots[0], snapshots[-1])
    window_errors, served = max(deltas["fail_count"], 0), max(deltas["success_count"], 0)
    # the sweep's too: a stub that died in it leaves windows whose requests Triton fails a second apiece
    failed = window_errors + (sent.errors if sent else 0)
    answered = failed + served + (sent.requests - sent.errors if sent else 0)
    failing = model_failing(stable=stable, failed=failed, answered=answered, window_errors=window_errors,
                            served=served)
    if failing:
        reason = (f"the model failed its requests: {failed} of the {answered} answered in the warm-up failed "
                  f"(the shape sweep and the windows after it)"
                  + (f"; the first error: {error_line(first_error)}" if first_error else ""))
    elif stable:
        reason = ""
    else:
        reason = (f"compute time per execution did not settle in {m.warmup_max_s:g} s of windows after the shape "
                  f"sweep ({rule_text(m)}; last windows: {seen})")
    return Warmup(seconds=time.monotonic() - started, sweep_requests=sent.requests if sent else 0,
                  sweep_errors=sent.errors if sent else 0, window_errors=window_errors,
                  first_error=first_error, windows_ms=values, stable=stable, failing=failing, reason=reason, seen=seen)
