"""The largest batch that still succeeds, from per-window histograms of executions (pure).

Input: for each window (ordered by its key: an index or the window's start in hours), for each
batch size (rows, or padded tokens), how many executions of that size succeeded and how many failed
(out of memory). Either a table with columns `window`, `size`, `successes`, `failures`, or a mapping
`{window: {size: (successes, failures)}}`.

Read from it: the largest size that succeeded in the last `last` windows, or in the windows given
(`recent`: a soak with a restart reads those before it, where the server was oldest; large batches come
only when the traffic forms them, so one window without a size proves nothing; a few windows do), the
largest that succeeded in any window, and for every size that failed, the window of its first failure
and of its last success.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tuner.soak.analysis._common import SoakDataError, json_number

COLUMNS = ("window", "size", "successes", "failures")
NO_WINDOW = "-"  # in the table: a size that never failed (or never succeeded), as a person reads it


@dataclass(frozen=True)
class SizeHistory:
    """One batch size over the soak: its counts and the windows where it last worked and first failed."""

    size: int
    successes: int
    failures: int
    last_success_window: object | None
    first_failure_window: object | None


@dataclass(frozen=True)
class BatchLimits:
    """The largest batch size still succeeding, and when each larger one began to fail."""

    largest_recent: int | None      # the largest size that succeeded in `recent_windows`
    largest_ever: int | None        # the largest size that succeeded in any window
    smallest_failing: int | None    # the smallest size above `largest_recent` that failed (the first to stop)
    last: int
    recent_windows: tuple           # the last `last` windows, or those given
    sizes: tuple[SizeHistory, ...]  # every size that was executed, ascending

    @property
    def first_failures(self) -> dict[int, object]:
        """Window of the first failure of each size larger than `largest_recent` that failed."""
        floor = -1 if self.largest_recent is None else self.largest_recent
        return {s.size: s.first_failure_window for s in self.sizes
                if s.size > floor and s.first_failure_window is not None}

    def table(self, *, label: Callable[[object], object] | None = None) -> pd.DataFrame:
        """One row per size that failed at least once, plus the largest still succeeding and the
        largest that ever succeeded; `label`: a window key as a person reads it (default: as is).
        A window there is none of (never failed, never succeeded) reads NO_WINDOW, text and HTML alike."""
        label = label or (lambda window: window)

        def window(key: object) -> object:
            # NO_WINDOW, not None: pandas would turn None into NaN, which the terminal prints as such
            return NO_WINDOW if key is None else label(key)

        rows = []
        for s in self.sizes:
            if s.failures == 0 and s.size not in (self.largest_recent, self.largest_ever):
                continue
            rows.append({"size": s.size, "successes": s.successes, "failures": s.failures,
                         "last success window": window(s.last_success_window),
                         "first failure window": window(s.first_failure_window), "status": self._status(s)})
        return pd.DataFrame(rows, columns=["size", "successes", "failures", "last success window",
                                           "first failure window", "status"])

    def _status(self, s: SizeHistory) -> str:
        if self.largest_recent is not None and s.size <= self.largest_recent:
            return "succeeds" if s.failures == 0 else "succeeds, some failures"
        if not s.successes:
            return "never succeeded"
        later = bool(self.recent_windows) and s.last_success_window > max(self.recent_windows)
        if s.failures == 0:  # the largest ever, not formed in the windows read
            return "succeeded, not in the windows read" + (" (after them)" if later else "")
        return "failed, then succeeded after the windows read" if later else "stopped succeeding"

    def as_dict(self) -> dict:
        """The limits as JSON-ready values."""
        return {
            "largest_recent": self.largest_recent, "largest_ever": self.largest_ever,
            "smallest_failing": self.smallest_failing, "last_windows": self.last,
            "recent_windows": [_plain(w) for w in self.recent_windows],
            "first_failures": {str(k): _plain(v) for k, v in self.first_failures.items()},
            "sizes": [{"size": s.size, "successes": s.successes, "failures": s.failures,
                       "last_success_window": _plain(s.last_success_window),
                       "first_failure_window": _plain(s.first_failure_window)} for s in self.sizes],
        }


def batch_limits(executions: pd.DataFrame | Mapping, *, last: int = 3,
                 recent: Sequence | None = None) -> BatchLimits:
    """The largest size that still succeeds in the last `last` windows (or in the `recent` windows
    given), and each larger size's first failure, from per-window counts of successful and failed
    executions by size, every window's."""
    if not (isinstance(last, int) and last >= 1):
        raise SoakDataError(f"batch limits: last must be a whole number of windows >= 1, got {last!r}")
    table = _as_table(executions)
    windows = sorted(table["window"].unique().tolist())
    recent = tuple(sorted(recent)) if recent else tuple(windows[-last:])
    sizes = []
    for size, rows in table.groupby("size", sort=True):
        ok = rows[rows["successes"] > 0]
        bad = rows[rows["failures"] > 0]
        sizes.append(SizeHistory(
            size=int(size),
            successes=int(rows["successes"].sum()),
            failures=int(rows["failures"].sum()),
            last_success_window=max(ok["window"].tolist()) if len(ok) else None,
            first_failure_window=min(bad["window"].tolist()) if len(bad) else None,
        ))
    in_recent = table[table["window"].isin(recent)]
    recent_ok = in_recent.loc[in_recent["successes"] > 0, "size"]
    ever_ok = table.loc[table["successes"] > 0, "size"]
    largest_recent = int(recent_ok.max()) if len(recent_ok) else None
    floor = -1 if largest_recent is None else largest_recent
    failing = [s.size for s in sizes if s.size > floor and s.failures > 0]
    return BatchLimits(
        largest_recent=largest_recent,
        largest_ever=int(ever_ok.max()) if len(ever_ok) else None,
        smallest_failing=min(failing) if failing else None,
        last=last,
        recent_windows=recent,
        sizes=tuple(sizes),
    )


def _as_table(executions: pd.DataFrame | Mapping) -> pd.DataFrame:
    if isinstance(executions, Mapping):
        rows = []
        for window, by_size in executions.items():
            if not isinstance(by_size, Mapping):
                raise SoakDataError(f"batch histograms: window {window!r}: expected {{size: (successes, failures)}}, "
                                    f"got {type(by_size).__name__}")
            for size, counts in by_size.items():
                if isinstance(counts, Mapping):
                    counts = (counts.get("successes", 0), counts.get("failures", 0))
                if not (isinstance(counts, tuple | list) and len(counts) == 2):
                    raise SoakDataError(f"batch histograms: window {window!r}, size {size!r}: expected "
                                        f"(successes, failures), got {counts!r}")
                rows.append((window, size, counts[0], counts[1]))
        table = pd.DataFrame(rows, columns=list(COLUMNS))
    elif isinstance(executions, pd.DataFrame):
        missing = [c for c in COLUMNS if c not in executions.columns]
        if missing:
            found = ", ".join(map(str, executions.columns)) or "none"
            raise SoakDataError(f"batch histograms: no column {missing[0]!r} (columns found: {found})")
        table = executions[list(COLUMNS)].reset_index(drop=True)
    else:
        raise SoakDataError(f"batch histograms: expected a table or a mapping, got {type(executions).__name__}")
    if table.empty:
        raise SoakDataError("batch histograms: no executions recorded")
    for col in ("size", "successes", "failures"):
        values = pd.to_numeric(table[col], errors="coerce").to_numpy(dtype=np.float64)
        low = 1 if col == "size" else 0
        bad = np.flatnonzero(~np.isfinite(values) | (values < low) | (values != np.round(values)))
        if len(bad):
            i = int(bad[0])
            raise SoakDataError(f"batch histograms: window {_plain(table['window'].iloc[i])!r}, column {col!r}: "
                                f"must be a whole number >= {low}, got {_plain(table[col].iloc[i])!r}")
        table[col] = values.astype(np.int64)
    if table["window"].isna().any():
        raise SoakDataError("batch histograms: a row has no window")
    return table


def _plain(value: object) -> object:
    """A window key as JSON holds it."""
    if isinstance(value, np.generic):
        value = value.item()
    return json_number(value) if isinstance(value, float | int) else value
