"""How a figure is written in a line a person reads (a leaf: imports nothing of tuner's).

The formatters more than one module prints with, each once, so that the same figure reads the same
wherever it is printed:

    number(value, spec)   a number in a format spec, or a mark ("-") where there is none
    figure(value)         a figure of a table: three significant digits, whole thousands, "-" for none
    gain(g)               a relative gain as a signed percentage (+5.0%), "inf" past any ratio
    hms(seconds)          a time of day, or a duration under a day, as HH:MM:SS
    first_line(error)     an error (or a text) as one line: its first non-blank line
"""

from __future__ import annotations

import math

__all__ = ["figure", "first_line", "gain", "hms", "number"]


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


def figure(value) -> str:
    """A figure of a table or a closing line: three significant digits under 100, whole numbers with
    thousands separators above; "-" where there is none (None, NaN, inf); anything else as it is."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def first_line(error: BaseException | str) -> str:
    """An error as one line of a message: its first non-blank line, stripped (a library's message often
    carries a traceback or a dump after it); an exception with no message gives its type's name."""
    line = next((part.strip() for part in str(error).splitlines() if part.strip()), "")
    if not line and isinstance(error, BaseException):
        return type(error).__name__
    return line
