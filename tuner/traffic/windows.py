"""Time arithmetic on a traffic table: due times at a replay speed, windows, the busiest window.

All offsets are seconds from the table's first request. Replay at speed `s` sends request `i` at
`t0 + (timestamp_i - timestamp_0) / s`.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from tuner.errors import TrafficError
from tuner.traffic.io import TIMESTAMP

# The longest traffic a scaling may make: 2**63 ns (292 years), what pandas' times, Python's
# time.sleep and a replay's due times hold
MAX_SPAN_S = 2**63 / 1e9
_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-z]*)\s*$")


def parse_duration(text: str | float, what: str = "duration") -> float:
    """Seconds from `90`, `90s`, `1.5m`, `2h`, `1d`, `250ms`."""
    if isinstance(text, int | float):
        return float(text)
    match = _DURATION.match(str(text).lower())
    if not match or match.group(2) not in _UNITS:
        raise TrafficError(f"{what}: cannot read {text!r} as a duration (e.g. 90, 90s, 1.5m, 2h, 1d)")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _check_speed(speed: float) -> float:
    speed = float(speed)
    if not np.isfinite(speed) or speed <= 0:
        raise TrafficError(f"speed must be a positive number, got {speed}")
    return speed


def offsets(df: pd.DataFrame) -> np.ndarray:
    """Seconds from the first request, as recorded (speed 1)."""
    ts = df[TIMESTAMP].to_numpy(dtype=np.float64)
    return ts - ts[0] if len(ts) else ts


def due_offsets(df: pd.DataFrame, speed: float = 1.0) -> np.ndarray:
    """When each request is due, in seconds from the first, replayed at `speed`."""
    return offsets(df) / _check_speed(speed)


def scale_time(df: pd.DataFrame, speed: float) -> pd.DataFrame:
    """The same requests compressed (speed > 1) or stretched (< 1) in time around the first one."""
    speed = _check_speed(speed)
    out = df.copy()
    if len(out):
        t0 = float(out[TIMESTAMP].iloc[0])
        span = float(np.abs(offsets(df)).max())
        with np.errstate(over="ignore"):
            stretched = span / speed
        # stretched to infinity, or past what a clock of nanoseconds holds (a span already past it is
        # the recording's own: compressing it is fine)
        if stretched > max(MAX_SPAN_S, span):
            raise TrafficError(f"speed {speed:g}: the traffic's {span:g} s would last {stretched:g} s, past the "
                               "292 years a time in nanoseconds can hold: a higher speed")
        out[TIMESTAMP] = t0 + offsets(df) / speed
        before, after = np.diff(df[TIMESTAMP].to_numpy(dtype=float)), np.diff(out[TIMESTAMP].to_numpy(dtype=float))
        if ((before > 0) & (after <= 0)).any():  # below the float resolution at t0: requests made simultaneous
            raise TrafficError(f"speed {speed:g}: requests apart in the recording fall on one timestamp (their "
                               f"gaps shrink below what a timestamp near {t0:g} s can hold): a lower speed")
    return out


def window_start(start_s: float | None, duration_s: float | None) -> float:
    """A window's start as a number of seconds (0 when omitted), once both bounds are sane: the start
    >= 0 and finite, the duration (None: to the end) > 0 and finite; TrafficError otherwise."""
    start = 0.0 if start_s is None else float(start_s)
    if start < 0 or not np.isfinite(start):
        raise TrafficError(f"window start must be >= 0 s from the first request, got {start_s}")
    if duration_s is not None and not (float(duration_s) > 0 and np.isfinite(float(duration_s))):
        raise TrafficError(f"window duration must be a positive number of seconds, got {duration_s}")
    return start


def window(df: pd.DataFrame, start_s: float | None = None, duration_s: float | None = None) -> pd.DataFrame:
    """The requests with `start_s <= offset < start_s + duration_s` (offsets from the first request).

    Either bound may be omitted. Timestamps are kept as recorded. An empty result is an error.
    """
    start = window_start(start_s, duration_s)
    off = offsets(df)
    lo = int(np.searchsorted(off, start, side="left"))
    hi = len(off) if duration_s is None else int(np.searchsorted(off, start + float(duration_s), side="left"))
    if hi <= lo:
        span = float(off[-1]) if len(off) else 0.0
        end = "the end" if duration_s is None else f"{start + float(duration_s):g} s"
        raise TrafficError(
            f"window {start:g} s to {end} holds no requests (the traffic spans 0 to {span:g} s)"
        )
    return df.iloc[lo:hi].reset_index(drop=True)


def window_counts(off: np.ndarray, duration_s: float) -> np.ndarray:
    """For each request i, how many requests fall in [offset_i, offset_i + duration_s)."""
    ends = np.searchsorted(off, off + duration_s, side="left")
    return ends - np.arange(len(off))


def busiest_window(df: pd.DataFrame, duration_s: float) -> tuple[float, int]:
    """Start (seconds from the first request) and request count of the busiest `duration_s` window.

    A busiest window can always be slid right until it starts on a request, so only starts at
    request times are tried; ties go to the earliest.
    """
    duration_s = float(duration_s)
    if not (duration_s > 0 and np.isfinite(duration_s)):
        raise TrafficError(f"window duration must be a positive number of seconds, got {duration_s}")
    off = offsets(df)
    if len(off) == 0:
        return 0.0, 0
    counts = window_counts(off, duration_s)
    best = int(np.argmax(counts))
    return float(off[best]), int(counts[best])


def peak_rps(traffic: pd.DataFrame, speed: float) -> float:
    """Requests in the busiest second, replayed at `speed`."""
    return float(busiest_window(traffic, speed)[1]) if len(traffic) else 0.0


def step_window(traffic: pd.DataFrame, speed: float, warmup_s: float, *, measured_s: float
                ) -> tuple[pd.DataFrame, float]:
    """What one step of the search replays at `speed`: the busiest stretch of the profile that lasts
    `measured_s` (every step is short, and judged on the profile's hardest stretch: servers are sized
    for it), after up to `warmup_s` of the traffic that came before it. Returns the window and its
    warm-up in wall seconds, so that the measured part is exactly the busiest stretch.

    The measured stretch at a higher speed holds at least as many requests in the same wall time,
    so the offered load only grows with the speed and the capacity search can bisect on it."""
    span = measured_s * speed
    lead = warmup_s * speed
    first = float(traffic["timestamp"].iloc[0]) if len(traffic) else 0.0
    if fits_one_step(traffic, speed, warmup_s, measured_s=measured_s):
        return traffic, warmup_s
    start, _ = busiest_window(traffic, span)
    lead = min(lead, start)
    part = window(traffic, start - lead, lead + span)
    # the window's first request may come after `start - lead` (a quiet gap): the replay starts there
    warmup_wall = (start - (float(part["timestamp"].iloc[0]) - first)) / speed
    return part, warmup_wall


def fits_one_step(traffic: pd.DataFrame, speed: float, warmup_s: float, *, measured_s: float) -> bool:
    """Whether the traffic at `speed` lasts no longer than a step's warm-up and measured stretch: then a
    step replays all of it (`step_window`), not a busiest stretch of it."""
    if len(traffic) == 0:
        return True
    stamps = traffic["timestamp"]
    return float(stamps.iloc[-1]) - float(stamps.iloc[0]) <= (measured_s + warmup_s) * speed


def mean_rps(traffic: pd.DataFrame) -> float:
    """The profile's mean rate at speed 1: capacity is expressed as this rate times the speed."""
    span = float(traffic["timestamp"].iloc[-1] - traffic["timestamp"].iloc[0]) if len(traffic) > 1 else 0.0
    return len(traffic) / span if span > 0 else float(len(traffic))


def mean_output_tps(traffic: pd.DataFrame) -> float:
    """A generative profile's mean rate of output tokens at speed 1 (its output_tokens over the same
    span as `mean_rps`): what an engine must stream, on average, to keep up with it."""
    return mean_rps(traffic) * float(traffic["output_tokens"].mean()) if len(traffic) else 0.0
