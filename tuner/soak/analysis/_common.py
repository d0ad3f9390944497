"""What every soak module shares: the error for an unusable table, JSON-safe numbers, one-row tables,
a window's number as a person reads it."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from tuner.errors import InputError


class SoakDataError(InputError):
    """A soak's windows, batch histograms or limits that cannot be analysed (said in one line)."""


class OneRow:
    """A finding a person reads as one row of a table (a trend, a crossing): `row()` gives it."""

    def row(self) -> dict:
        """The finding's row, as a person reads it."""
        raise NotImplementedError

    def table(self) -> pd.DataFrame:
        """The finding as a one-row table."""
        return pd.DataFrame([self.row()])


def json_number(value: float | int | None) -> float | int | None:
    """`value` as JSON can hold it: None for NaN and infinities, plain Python numbers otherwise."""
    if value is None:
        return None
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, int | np.integer):
        return int(value)
    value = float(value)
    return value if math.isfinite(value) else None


def window_number(window: object) -> int:
    """A window (windows.csv's `window`, counted from 0) as a person reads it: counted from 1, as the
    line printed per window is ("1/8"); the files keep their keys."""
    return int(window) + 1
