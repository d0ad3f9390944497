"""When a drifting figure meets its limit if the trend continues, and what drift does to capacity.

The crossing is where the fitted line `level + slope * t` reaches the limit: `t = (limit - level) /
slope` hours since the server's load. Its interval is the one the slope's interval implies (the
steeper end of the slope's interval gives the early end, the flatter end the late end, infinite
when the slope's interval reaches zero); the level's own uncertainty is left out. A figure beyond
its limit at 0 h is reported as crossed at 0 h whatever its trend.

Capacity from compute time: at full load the server is busy all the time, so the requests it serves
per second are 1 / (compute time per request). Assumed here: drift multiplies compute time per
request by the same factor at full load as at the soak's loads, so the capacity measured on a fresh
server scales as `capacity(t) = capacity(0) * level / compute(t)`, and it drops below a rate `r`
when compute time per request reaches `level * capacity(0) / r`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tuner.soak.analysis._common import OneRow, SoakDataError, json_number
from tuner.soak.analysis._trend import Trend

ABOVE = "above"  # the limit is broken when the figure rises past it (p99 over the SLA)
BELOW = "below"  # ... when it falls past it (capacity under the peak rate)


@dataclass(frozen=True)
class Limit:
    """A figure's limit; `bad` says which side breaks it (None: the side the figure is not on at 0 h)."""

    value: float
    bad: str | None = None
    load: float | None = None  # the offered load to read the figure at (default: the trend's reference)


@dataclass(frozen=True, kw_only=True)
class Crossing(OneRow):
    """When a figure reaches its limit if its trend continues, in hours since the server's load."""

    figure: str
    limit: float
    bad: str                 # ABOVE or BELOW
    level: float             # the figure at 0 h
    hours: float             # the estimate
    low_hours: float         # early end of the interval
    high_hours: float        # late end (inf when the slope's interval reaches zero)
    confidence: float
    already: bool = False    # beyond the limit at 0 h
    note: str = ""

    def row(self) -> dict:
        """One row of a breach table, as a person reads it."""
        return {
            "figure": self.figure,
            "limit": f"{'>' if self.bad == ABOVE else '<'} {self.limit:.6g}",
            "level at 0 h": self.level,
            "breach h": self.hours,
            f"{self.confidence:.0%} low h": self.low_hours,
            f"{self.confidence:.0%} high h": self.high_hours,
            "note": self.note,
        }

    def as_dict(self) -> dict:
        """The crossing as JSON-ready values (an infinite late end becomes null)."""
        return {
            "figure": self.figure,
            "limit": json_number(self.limit),
            "bad": self.bad,
            "level": json_number(self.level),
            "hours": json_number(self.hours),
            "interval_hours": [json_number(self.low_hours), json_number(self.high_hours)],
            "confidence": self.confidence,
            "already": self.already,
            "note": self.note,
        }


def crossing_time(trend: Trend, limit: float | Limit, *, bad: str | None = None,
                  load: float | None = None) -> Crossing | None:
    """When `trend`'s figure reaches `limit` if the trend continues; None when there is no drift or the
    trend moves away from the limit. A figure already beyond the limit at 0 h crosses at 0 h."""
    if isinstance(limit, Limit):
        bad = limit.bad if bad is None else bad
        load = limit.load if load is None else load
        value = float(limit.value)
    else:
        value = float(limit)
    if not math.isfinite(value):
        raise SoakDataError(f"limit of {trend.figure!r} must be a finite number, got {value}")
    level = float(trend.level_at(0.0, load))
    if bad is None:
        bad = ABOVE if level < value else BELOW
    if bad not in (ABOVE, BELOW):
        raise SoakDataError(f"limit of {trend.figure!r}: bad must be {ABOVE!r} or {BELOW!r}, got {bad!r}")
    gap = value - level  # > 0: the figure must rise to break an ABOVE limit
    beyond = gap <= 0 if bad == ABOVE else gap >= 0
    if beyond:
        return Crossing(figure=trend.figure, limit=value, bad=bad, level=level, hours=0.0, low_hours=0.0, high_hours=0.0, confidence=trend.confidence, already=True,
                        note="beyond the limit from the start")
    toward = 1.0 if bad == ABOVE else -1.0  # the sign a slope needs to move toward the limit
    if not trend.drifting or trend.slope_per_hour * toward <= 0:
        return None
    near, far = sorted((trend.slope_low * toward, trend.slope_high * toward))  # both as rates toward it
    distance = abs(gap)
    hours = distance / (trend.slope_per_hour * toward)
    low = distance / far if far > 0 else math.inf
    high = distance / near if near > 0 else math.inf
    return Crossing(figure=trend.figure, limit=value, bad=bad, level=level, hours=hours, low_hours=low, high_hours=high, confidence=trend.confidence)


@dataclass(frozen=True)
class CapacityTrend:
    """Capacity over the server's age, from the compute-time-per-request trend (see the module)."""

    capacity_rps: float  # on a fresh server (0 h)
    compute: Trend

    @property
    def relative_per_hour(self) -> float:
        """The capacity's relative change per hour at 0 h (the compute drift with its sign turned)."""
        return -self.compute.relative_per_hour

    def at(self, t_hours: float | np.ndarray) -> float | np.ndarray:
        """The capacity (requests/s) after `t_hours`; infinite where the fitted compute time is not positive."""
        compute = np.asarray(self.compute.level_at(t_hours), dtype=np.float64)
        with np.errstate(divide="ignore"):
            cap = np.where(compute > 0, self.capacity_rps * self.compute.level / compute, np.inf)
        return float(cap) if np.ndim(cap) == 0 else cap

    def crossing(self, rate_rps: float) -> Crossing | None:
        """When the capacity drops below `rate_rps`; None when it does not (no drift, or improving)."""
        return capacity_crossing(self.compute, capacity_rps=self.capacity_rps, rate_rps=rate_rps)

    def table(self, hours: tuple[float, ...] = (0, 6, 12, 24, 48, 168)) -> pd.DataFrame:
        """The capacity at a few ages of the server."""
        return pd.DataFrame({"hours since load": list(hours),
                             "capacity rps": [self.at(float(h)) for h in hours]})

    def as_dict(self) -> dict:
        """The capacity trend as JSON-ready values."""
        return {
            "capacity_rps": json_number(self.capacity_rps),
            "relative_per_hour": json_number(self.relative_per_hour),
            "from": self.compute.figure,
            "assumption": "capacity is proportional to 1 / compute time per request at full load",
        }


def capacity_trend(compute: Trend, capacity_rps: float) -> CapacityTrend:
    """The capacity trend implied by a compute-time-per-request trend and the capacity at 0 h."""
    _positive(capacity_rps, "capacity_rps")
    if not compute.level > 0:
        raise SoakDataError(f"capacity from {compute.figure!r}: its level at 0 h must be > 0, got {compute.level:.6g}")
    return CapacityTrend(float(capacity_rps), compute)


def capacity_crossing(compute: Trend, *, capacity_rps: float, rate_rps: float) -> Crossing | None:
    """When a server whose capacity was `capacity_rps` at 0 h can no longer serve `rate_rps`, as
    compute time per request drifts; None when it does not drift up."""
    _positive(capacity_rps, "capacity_rps")
    _positive(rate_rps, "rate_rps")
    if not compute.level > 0:
        raise SoakDataError(f"capacity from {compute.figure!r}: its level at 0 h must be > 0, got {compute.level:.6g}")
    ceiling = compute.level * capacity_rps / rate_rps
    note = f"{compute.figure} reaches {ceiling:.4g} ({capacity_rps / rate_rps:.3g}x its level at 0 h)"
    if capacity_rps < rate_rps:
        return Crossing(figure="capacity_rps", limit=float(rate_rps), bad=BELOW, level=float(capacity_rps), hours=0.0, low_hours=0.0, high_hours=0.0,
                        confidence=compute.confidence, already=True, note="below the rate from the start")
    via = crossing_time(compute, ceiling, bad=ABOVE)
    if via is None:
        return None
    return Crossing(figure="capacity_rps", limit=float(rate_rps), bad=BELOW, level=float(capacity_rps), hours=via.hours, low_hours=via.low_hours,
                    high_hours=via.high_hours, confidence=via.confidence, already=via.already, note=note)


def _positive(value: float, name: str) -> None:
    if not (isinstance(value, int | float | np.number) and math.isfinite(float(value)) and float(value) > 0):
        raise SoakDataError(f"{name} must be a positive number of requests/s, got {value!r}")
