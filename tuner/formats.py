"""How a figure is written in a line a person reads (a leaf: imports nothing of tuner's).

The formatters more than one module prints with, each once, so that the same figure reads the same
wherever it is printed:

    number(value, spec)   a number in a format spec, or a mark ("-") where there is none
    gain(g)               a relative gain as a signed percentage (+5.0%), "inf" past any ratio
    hms(seconds)          a time of day, or a duration under a day, as HH:MM:SS
"""

from __future__ import annotations

import math

__all__ = ["gain", "hms", "number"]


def number(value: float | None, spec: str = ".3g", *, missing: str = "-") -> str:
    """`value` written with the format `spec` (default three significant digits); `missing` when
    there is no value (None): a figure that was not measured is said, not guessed."""
    return missing if value is None else format(float(value), spec)


def gain(g: float | None) -> str:
    """A gain over a reference (0.05: 5% better) as `+5.0%`; `inf` where the reference was nothing,
    `-` where there is no gain."""
    if g is None:
        return "-"
    return "inf" if math.isinf(g) else f"{g:+.1%}"


def hms(seconds: float) -> str:
    """`seconds` rounded to the second, as HH:MM:SS."""
    whole = int(round(seconds))
    return f"{whole // 3600:02d}:{whole % 3600 // 60:02d}:{whole % 60:02d}"
