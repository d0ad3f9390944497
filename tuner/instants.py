"""Points in a recording's time: read from what a person writes, written as a person reads them (a
leaf: imports nothing of tuner's but its errors).

    parse_instant(value, what)   seconds, from a number or an ISO-8601 date and time (naive: UTC)
    instant_text(seconds)        its UTC date when it looks like Unix seconds, else its seconds
"""

from __future__ import annotations

import datetime
import math

from tuner.errors import TrafficError

__all__ = ["instant_text", "parse_instant"]

_UNIX_2001, _UNIX_2100 = 978_307_200, 4_102_444_800


def parse_instant(value: str | float, what: str = "time") -> float:
    """A point in the recording's time, in its own seconds: a number as it is (Unix seconds, or the
    clock a Triton trace was recorded on), or an ISO-8601 date and time (`2026-11-25`,
    `2026-11-25T06:00`, `2026-11-25 06:00:00+01:00`, `...Z`; naive times are UTC, as the traffic
    table reads them) as Unix seconds. Anything else: one TrafficError line."""
    if isinstance(value, bool):
        raise TrafficError(f"{what}: expected a date and time or a number of seconds, got {value!r}")
    if isinstance(value, datetime.datetime | datetime.date):
        value = value.isoformat()
    if isinstance(value, int | float):
        number = float(value)
    else:
        text = str(value).strip()
        try:
            number = float(text)
        except ValueError:
            try:
                moment = datetime.datetime.fromisoformat(text)
            except ValueError:
                raise TrafficError(f"{what}: cannot read {value!r} as a date and time (e.g. 2026-11-25T06:00, "
                                   "naive times are UTC) or a number of seconds") from None
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=datetime.UTC)
            number = moment.timestamp()
    if not math.isfinite(number):
        raise TrafficError(f"{what}: expected a finite time, got {value!r}")
    return number


def instant_text(seconds: float) -> str:
    """A time of the recording as a person reads it: its UTC date when it looks like Unix seconds
    (2001 to 2100), else its seconds."""
    if _UNIX_2001 <= seconds < _UNIX_2100:
        moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
        return moment.strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{seconds:g} s"
