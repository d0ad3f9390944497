"""Restart advice: the recorded traffic's quietest window of each day, and how often to restart.

A day is `period_s` seconds of the recording (86,400 by default; a compressed profile such as a day
played in ten minutes passes its own period), counted from the first request; the recording ends at
its last request, and a recording shorter than a period is one day. Each day's quiet window is the
`length_s` stretch, starting on a grid of `step_s` from the day's start and lying inside the day,
that holds the fewest requests (the earliest on a tie); windows are half-open, [start, start +
length), like `tuner.traffic.window`. The daily slot is the offset into the day whose window holds
the fewest requests on average over the days that contain it: the time a scheduler restarts at.

The restart interval is the projected breach time (hours since the server's load, in the
recording's time: a soak replayed faster must give its trend in hours of traffic) less a margin,
rounded down to whole days when it is a day or more (every restart then falls in the daily slot),
else to whole hours, else to whole minutes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pandas as pd

from tuner.errors import TrafficError
from tuner.formats import hms
from tuner.soak.analysis._common import SoakDataError, json_number
from tuner.soak.analysis._projection import Crossing
from tuner.traffic import TIMESTAMP

DAY_S = 86400.0
_MAX_STARTS = 20_000_000  # window starts scanned per day: beyond it, the step is too fine
_EPOCH_2001 = 1e9         # timestamps from here on read as Unix time (ISO input becomes that)


@dataclass(frozen=True, kw_only=True)
class QuietWindow:
    """The quietest `length_s` stretch of one day of the recording."""

    day: int
    start_s: float           # seconds from the recording's first request
    length_s: float
    requests: float          # requests (or the weight column's sum) in the window
    day_rps: float           # the day's mean rate, to compare with the window's
    start_timestamp: float   # as recorded
    offset_s: float          # where it starts within its day

    @property
    def rps(self) -> float:
        """The window's mean rate."""
        return self.requests / self.length_s


@dataclass(frozen=True, kw_only=True)
class QuietWindows:
    """Each day's quietest window, and the daily slot a scheduler would restart in."""

    windows: tuple[QuietWindow, ...]
    period_s: float
    length_s: float
    step_s: float
    slot_offset_s: float     # the daily slot: offset into the day
    slot_requests: float     # requests in the slot, averaged over the days that contain it
    slot_days: int           # how many days contain the slot
    weight: str | None = None
    notes: tuple[str, ...] = ()

    def table(self) -> pd.DataFrame:
        """One row per day: its quiet window's start (in the day and as recorded), requests, rates."""
        what = self.weight or "requests"
        rows = [{
            "day": w.day + 1,
            "start in day": hms(w.offset_s),
            "start s": w.start_s,
            "clock (UTC)": _clock(w.start_timestamp),
            what: w.requests,
            "rate /s": w.rps,
            "day mean /s": w.day_rps,
        } for w in self.windows]
        rows.append({"day": "daily slot", "start in day": hms(self.slot_offset_s), "start s": self.slot_offset_s,
                     "clock (UTC)": "", what: self.slot_requests, "rate /s": self.slot_requests / self.length_s,
                     "day mean /s": float("nan")})
        return pd.DataFrame(rows)

    def as_dict(self) -> dict:
        """The quiet windows as JSON-ready values."""
        return {
            "period_s": self.period_s, "length_s": self.length_s, "step_s": self.step_s, "weight": self.weight,
            "days": [{"day": w.day, "start_s": w.start_s, "offset_in_day_s": w.offset_s,
                      "start_timestamp": w.start_timestamp, "requests": json_number(w.requests),
                      "rps": json_number(w.rps), "day_rps": json_number(w.day_rps)} for w in self.windows],
            "slot": {"offset_in_day_s": self.slot_offset_s, "requests": json_number(self.slot_requests),
                     "days": self.slot_days},
            "notes": list(self.notes),
        }


def quiet_windows(traffic: pd.DataFrame, *, length_s: float = 300.0, period_s: float = DAY_S,
                  step_s: float = 1.0, weight: str | None = None) -> QuietWindows:
    """The quietest `length_s` window of each `period_s` day of a traffic table, and the daily slot
    (see the module). `weight` counts a column's sum (e.g. `batch_size`) instead of requests."""
    for name, value in (("length_s", length_s), ("period_s", period_s), ("step_s", step_s)):
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise TrafficError(f"quiet windows: {name} must be a positive number of seconds, got {value!r}")
    if length_s > period_s:
        raise TrafficError(f"quiet windows: length_s <= period_s must hold, but got (length_s={length_s:g}, "
                           f"period_s={period_s:g})")
    if TIMESTAMP not in traffic.columns or len(traffic) == 0:
        raise TrafficError("quiet windows: the traffic table needs a 'timestamp' column and at least one request")
    if weight is not None and weight not in traffic.columns:
        raise TrafficError(f"quiet windows: no column {weight!r} to weigh requests by")
    raw = traffic[TIMESTAMP].to_numpy(dtype=np.float64)
    order = np.argsort(raw, kind="stable")
    stamps = raw[order]
    weights = np.ones(len(stamps)) if weight is None else traffic[weight].to_numpy(dtype=np.float64)[order]
    off = stamps - stamps[0]
    end = float(off[-1])
    if end < length_s:
        raise TrafficError(f"quiet windows: the recording spans {end:g} s, shorter than the window of "
                           f"{length_s:g} s")
    cum = np.concatenate([[0.0], np.cumsum(weights)])

    def counts(starts: np.ndarray) -> np.ndarray:
        lo = np.searchsorted(off, starts, side="left")
        hi = np.searchsorted(off, starts + length_s, side="left")
        return cum[hi] - cum[lo]

    n_days = max(1, math.ceil(end / period_s))
    slots = _grid(period_s - length_s, step_s)
    slot_sum = np.zeros(len(slots))
    slot_days = np.zeros(len(slots), dtype=np.int64)
    found, notes = [], []
    for day in range(n_days):
        a, b = day * period_s, min((day + 1) * period_s, end)
        if b - a < length_s:
            notes.append(f"day {day + 1} holds only {b - a:g} s of the recording, less than the window: left out")
            continue
        starts = a + _grid(b - a - length_s, step_s)
        c = counts(starts)
        best = int(np.argmin(c))  # argmin takes the first: the earliest on a tie
        hi = len(off) if b >= end else int(np.searchsorted(off, b, side="left"))
        in_day = float(cum[hi] - cum[int(np.searchsorted(off, a, side="left"))])
        found.append(QuietWindow(day=day, start_s=float(starts[best]), length_s=float(length_s),
                                 requests=float(c[best]), day_rps=in_day / (b - a),
                                 start_timestamp=float(stamps[0] + starts[best]),
                                 offset_s=float(starts[best] - a)))
        slot_sum[: len(c)] += c
        slot_days[: len(c)] += 1
    covered = slot_days > 0
    mean = np.where(covered, slot_sum / np.maximum(slot_days, 1), np.inf)
    slot = int(np.argmin(mean))
    return QuietWindows(
        windows=tuple(found), period_s=float(period_s), length_s=float(length_s), step_s=float(step_s),
        slot_offset_s=float(slots[slot]), slot_requests=float(mean[slot]), slot_days=int(slot_days[slot]),
        weight=weight, notes=tuple(notes),
    )


def _grid(span: float, step: float) -> np.ndarray:
    """Starts 0, step, 2 step, ... up to `span` (within float rounding)."""
    n = int(math.floor(span / step + 1e-9)) + 1
    if n > _MAX_STARTS:
        raise TrafficError(f"quiet windows: step_s={step:g} s gives {n:,} window starts per day; use a coarser step")
    return np.arange(n, dtype=np.float64) * step


def _clock(timestamp: float) -> str:
    """The UTC time of a Unix timestamp; empty for timestamps that are not Unix time."""
    if timestamp < _EPOCH_2001:
        return ""
    return datetime.fromtimestamp(timestamp, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


@dataclass(frozen=True, kw_only=True)
class RestartAdvice:
    """How often to restart the server, and when in the day, so that the projected breach never comes."""

    action: str                    # "none" | "restart" | "restart does not help"
    every: int | None = None
    unit: str | None = None        # "day" | "hour" | "minute"
    interval_hours: float | None = None
    basis_hours: float | None = None  # the breach time the margin is taken from
    margin: float = 0.2
    breach: Crossing | None = None
    slot_offset_s: float | None = None
    length_s: float | None = None
    reason: str = ""

    def table(self) -> pd.DataFrame:
        """The advice as rows of (what, value)."""
        rows = [("advice", self.reason)]
        if self.breach is not None:
            b = self.breach
            rows.append(("projected breach", f"{b.figure} {'>' if b.bad == 'above' else '<'} {b.limit:.6g} after "
                                             f"{b.hours:.3g} h ({b.confidence:.0%}: {b.low_hours:.3g} to "
                                             f"{b.high_hours:.3g} h)"))
        if self.interval_hours is not None:
            rows.append(("restart interval", f"every {self.every} {self.unit}{'s' if self.every != 1 else ''} "
                                             f"({self.interval_hours:.3g} h)"))
        if self.slot_offset_s is not None and self.length_s is not None:
            rows.append(("restart window", f"{hms(self.slot_offset_s)} into the day, {self.length_s:g} s"))
        return pd.DataFrame(rows, columns=["what", "value"])

    def as_dict(self) -> dict:
        """The advice as JSON-ready values."""
        return {
            "action": self.action,
            "every": self.every,
            "unit": self.unit,
            "interval_hours": json_number(self.interval_hours),
            "basis_hours": json_number(self.basis_hours),
            "margin": self.margin,
            "breach": None if self.breach is None else self.breach.as_dict(),
            "slot_offset_s": json_number(self.slot_offset_s),
            "length_s": json_number(self.length_s),
            "reason": self.reason,
        }


def restart_advice(breach: Crossing | None, quiet: QuietWindows | None = None, *, margin: float = 0.2,
                   basis: str = "estimate") -> RestartAdvice:
    """The restart interval before the projected `breach` less `margin` (of the estimate, or with
    `basis="early"` of the early end of its interval), in `quiet`'s daily slot when a day or more."""
    if not (isinstance(margin, int | float) and 0 <= margin < 1):
        raise SoakDataError(f"restart margin must be a fraction in [0, 1) (e.g. 0.2), got {margin!r}")
    if basis not in ("estimate", "early"):
        raise SoakDataError(f"restart basis must be 'estimate' or 'early', got {basis!r}")
    if breach is None:
        return RestartAdvice(action="none", margin=margin,
                             reason="no figure drifts toward its limit: no scheduled restart needed")
    if breach.already:
        return RestartAdvice(action="restart does not help", margin=margin, breach=breach,
                             reason=f"{breach.figure} is beyond its limit from the server's start: a restart does "
                                    "not help")
    hours = breach.hours if basis == "estimate" else breach.low_hours
    interval = (1 - margin) * hours
    day_hours = (quiet.period_s if quiet is not None else DAY_S) / 3600
    slot = (quiet.slot_offset_s, quiet.length_s) if quiet is not None else (None, None)
    if interval >= day_hours:
        every, unit, unit_hours = int(math.floor(interval / day_hours)), "day", day_hours
    elif interval >= 1:
        every, unit, unit_hours = int(math.floor(interval)), "hour", 1.0
        slot = (None, None)
    elif interval >= 1 / 60:
        every, unit, unit_hours = int(math.floor(interval * 60)), "minute", 1 / 60
        slot = (None, None)
    else:
        return RestartAdvice(action="restart does not help", margin=margin, breach=breach, basis_hours=hours,
                             reason=f"{breach.figure} is projected to break its limit {hours * 60:.2g} min after "
                                    "a start: too soon for restarts to help")
    plural = "s" if every != 1 else ""
    where = (f", in the quiet window {hms(slot[0])} into the day" if slot[0] is not None
             else ("; more often than daily, so not every restart falls in the quiet window" if quiet else ""))
    return RestartAdvice(
        action="restart", every=every, unit=unit, interval_hours=every * unit_hours, basis_hours=hours, margin=margin,
        breach=breach, slot_offset_s=slot[0], length_s=slot[1],
        reason=f"restart every {every} {unit}{plural}{where} ({margin:.0%} before the projected breach of "
               f"{breach.figure} at {hours:.3g} h)",
    )
