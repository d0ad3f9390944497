"""What a soak replays (pure): the recorded traffic, repeated end to end as long as the soak needs,
cut into windows that are each replayed once at the soak's speed.

The soak's clock is **hours of recorded traffic**: a window of `window_s` wall seconds replayed at
speed `s` covers `window_s * s` seconds of the recording, so a soak of `hours` takes
`hours * 3600 / s` seconds of wall time (plus the load generator's start per window). A recording
shorter than the soak is repeated: one cycle is its span plus one mean gap between requests, so
the last request of a cycle and the first of the next are as far apart as two requests on average.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tuner.errors import SettingsError, TrafficError
from tuner.traffic import TIMESTAMP

TIME_AXIS = "hours of recorded traffic"  # the soak's clock (see the module)
MIN_WINDOWS = 6  # the trend test fits three coefficients (level, slope, load) and needs three more windows
# The longest soak planned, in wall time: a month watches a server longer than releases and reboots
# usually leave it up; a longer --hours is a typo (1e9) sooner than a plan, and would start anyway.
MAX_WALL_DAYS = 31


@dataclass(frozen=True)
class SoakPlan:
    """How long the soak runs and how it is cut: all durations in seconds of the recording unless
    they say wall."""

    hours: float                # the soak's length in hours of recorded traffic
    speed: float                # replay speed: wall time = traffic time / speed
    window_wall_s: float        # one window's replay, in wall seconds
    cycle_s: float              # the recording's length when repeated
    restart_at_hours: float | None = None

    @property
    def window_s(self) -> float:
        """One window, in seconds of the recording."""
        return self.window_wall_s * self.speed

    @property
    def windows(self) -> int:
        """How many windows the soak replays (the last one takes the remainder: up to half a window
        longer or shorter than the others)."""
        return max(1, round(self.hours * 3600.0 / self.window_s))

    @property
    def wall_s(self) -> float:
        """The replays' wall time, without the load generator's start per window."""
        return self.hours * 3600.0 / self.speed

    def bounds(self, k: int) -> tuple[float, float]:
        """Window `k`'s stretch of the soak's traffic: [start, end) in seconds since the soak's start."""
        start = k * self.window_s
        return start, (self.hours * 3600.0 if k == self.windows - 1 else start + self.window_s)

    def place(self, k: int, *, warmup_wall_s: float) -> dict:
        """Where window `k` sits in the soak (windows.csv's place columns but `started_utc`): its
        segment (restarts before it), whether a restart came just before it, its stretch in hours of the
        soak's traffic (`start_hours`, `end_hours`) and the midpoint of its measured part (after the first
        `warmup_wall_s` wall seconds) in hours since the soak's start (`t_hours`) and since the server's
        start (`age_hours`)."""
        restarts = [j for j in range(1, k + 1) if self.restart_before(j)]
        segment_start_s = self.bounds(restarts[-1])[0] if restarts else 0.0
        start_s, end_s = self.bounds(k)
        middle_s = (start_s + warmup_wall_s * self.speed + end_s) / 2
        return {"window": k, "segment": len(restarts), "restarted": self.restart_before(k),
                "t_hours": middle_s / 3600.0, "age_hours": (middle_s - segment_start_s) / 3600.0,
                "start_hours": start_s / 3600.0, "end_hours": end_s / 3600.0}

    def restart_before(self, k: int) -> bool:
        """True when the server restarts just before window `k` (the first window starting at or after
        `restart_at_hours`)."""
        if self.restart_at_hours is None or k == 0:
            return False
        at = self.restart_at_hours * 3600.0
        return self.bounds(k - 1)[0] < at <= self.bounds(k)[0]


def cycle_length(traffic: pd.DataFrame) -> float:
    """The recording's length when repeated: its span plus one mean gap between requests."""
    ts = traffic[TIMESTAMP].to_numpy(dtype=np.float64)
    if len(ts) < 2:
        raise TrafficError("soak: the traffic needs at least two requests to be repeated")
    span = float(ts.max() - ts.min())
    if span <= 0:
        raise TrafficError("soak: every request of the traffic has the same timestamp: nothing to repeat")
    return span * len(ts) / (len(ts) - 1)


def make_plan(traffic: pd.DataFrame, *, hours: float, speed: float, window_minutes: float,
              restart_at_hours: float | None = None) -> SoakPlan:
    """The soak's plan; SettingsError naming the flag when a value cannot work."""
    for flag, value in (("--hours", hours), ("--speed", speed), ("--window", window_minutes)):
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise SettingsError(f"{flag}: must be a positive number, got {value!r}")
    _check_length(hours, speed)
    plan = SoakPlan(hours=float(hours), speed=float(speed), window_wall_s=float(window_minutes) * 60.0,
                    cycle_s=cycle_length(traffic), restart_at_hours=restart_at_hours)
    if plan.windows < MIN_WINDOWS:
        raise SettingsError(
            f"--hours {hours:g} at --speed {speed:g} in windows of --window {window_minutes:g} min gives "
            f"{plan.windows} window(s); the trend test needs at least {MIN_WINDOWS}: a longer soak, a higher "
            f"speed or shorter windows")
    if restart_at_hours is not None:
        if not (math.isfinite(restart_at_hours) and 0 < restart_at_hours < hours):
            raise SettingsError(f"--restart-at: 0 < restart_at < hours must hold, but got "
                                f"(restart_at={restart_at_hours:g}, hours={hours:g})")
        if not any(plan.restart_before(k) for k in range(1, plan.windows)):
            raise SettingsError(f"--restart-at {restart_at_hours:g}: falls in the last window (windows of "
                                f"{plan.window_s / 3600:.3g} h of traffic): no window would show the recovery")
    return plan


def _check_length(hours: float, speed: float) -> None:
    """SettingsError when the soak would replay for longer than MAX_WALL_DAYS of wall time."""
    wall_days = hours / speed / 24.0
    if wall_days > MAX_WALL_DAYS:
        raise SettingsError(
            f"--hours {hours:g} at --speed {speed:g} is {wall_days:.4g} days of replay; a soak is at most "
            f"{MAX_WALL_DAYS} days of wall time (--hours {MAX_WALL_DAYS * 24 * speed:g} at this speed)")


def window_traffic(traffic: pd.DataFrame, start_s: float, end_s: float, *, cycle_s: float) -> pd.DataFrame:
    """The requests of the repeated recording due in [start_s, end_s) of the soak's traffic, with
    timestamps in seconds since the soak's start (other columns as recorded)."""
    if end_s <= start_s:
        return traffic.iloc[:0].assign(**{TIMESTAMP: np.empty(0)})
    ts = traffic[TIMESTAMP].to_numpy(dtype=np.float64)
    off = ts - ts.min()
    parts = []
    for cycle in range(int(math.floor(start_s / cycle_s)), int(math.floor(end_s / cycle_s)) + 1):
        shifted = off + cycle * cycle_s
        keep = (shifted >= start_s) & (shifted < end_s)
        if keep.any():
            parts.append(traffic[keep].assign(**{TIMESTAMP: shifted[keep]}))
    if not parts:
        return traffic.iloc[:0].assign(**{TIMESTAMP: np.empty(0)})
    return pd.concat(parts, ignore_index=True).sort_values(TIMESTAMP, kind="stable").reset_index(drop=True)
