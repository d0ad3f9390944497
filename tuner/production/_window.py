"""Durations in Prometheus's notation (`7d`, `12h`, `1h30m`), read for --window and the retention."""

from __future__ import annotations

import re

from tuner.production._errors import WindowError

__all__ = ["format_duration", "parse_duration", "promql_range", "retention_s"]

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
_PART = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")


def parse_duration(text: str, *, where: str = "--window") -> float:
    """Seconds in a duration like `7d`, `36h` or `1h30m`; WindowError naming `where` otherwise."""
    s = str(text).strip()
    if not _is_duration(s):
        raise WindowError(f"{where} {text!r}: not a duration (write it like 7d, 36h or 1h30m)")
    seconds = sum(int(n) * _UNITS[u] for n, u in _PART.findall(s))
    if seconds <= 0:
        raise WindowError(f"{where} {text!r}: the duration must be longer than zero")
    return float(seconds)


def retention_s(text: str | None) -> float | None:
    """The time limit of Prometheus's `storageRetention` (`15d`, `15d or 10GiB`), or None when it
    has none (a size limit alone, or an API that does not say)."""
    for part in (text or "").split(" or "):
        if _is_duration(part.strip()):
            return parse_duration(part.strip(), where="retention")
    return None


def _is_duration(s: str) -> bool:
    return bool(s) and "".join(n + u for n, u in _PART.findall(s)) == s


def promql_range(seconds: float) -> str:
    """A range selector for PromQL, `[33814ms]`: whole milliseconds, since Prometheus refuses a fractional
    duration (`33.8s`) and `:g` writes two weeks as `1.2096e+06s`."""
    return f"[{round(seconds * 1000)}ms]"


def format_duration(seconds: float) -> str:
    """`7d`, `36h`, `90s`: the largest whole unit (what the findings and --json say)."""
    for unit in ("w", "d", "h", "m", "s"):
        if seconds >= _UNITS[unit] and seconds % _UNITS[unit] == 0:
            return f"{int(seconds // _UNITS[unit])}{unit}"
    return f"{seconds:g}s"
