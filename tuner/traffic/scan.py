"""Statistics and windows of a Recording, one segment in memory at a time.

    describe_recording   the same dict as stats.describe, from one pass over the recording
    busiest_in           the busiest stretch of a length: a scan of the timestamp column only
    read_window          the requests of one window: only the row groups that meet it are read
    read_since           the requests from a time on (the newest hours of a growing directory)
    read_range           the requests between two times (a date range)
    read_all             the whole recording as one table (what fits in memory)

Every figure is computed as stats.describe computes it on the whole table, with the same float
arithmetic on offsets from the first request, so the two agree (tests/test_traffic_scan.py).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pandas as pd

from tuner.errors import TrafficError
from tuner.instants import instant_text
from tuner.traffic.io import BATCH_SIZE, MODEL, RESERVED, TIMESTAMP
from tuner.traffic.recording import Recording
from tuner.traffic.stats import PERCENTILES, add_tokens
from tuner.traffic.windows import window_start

__all__ = ["busiest_in", "describe_recording", "read_all", "read_range", "read_since", "read_window"]

_BINCOUNT_MAX = 1 << 24  # sizes counted in an array up to this value, else by np.unique
_BINS_MAX = float(1 << 50)  # the most fine bins a scan numbers: a float64 offset / bin is exact to 1/8 bin


class _Busiest:
    """The most requests in any [offset_i, offset_i + d) over a stream of sorted offsets; ties go to
    the earliest start, as windows.busiest_window does. Keeps only the starts not yet resolved (the
    last d seconds), so memory is a chunk plus d seconds of requests.

    Counting every start exactly is a binary search per request; instead the requests are binned
    (about 4 sqrt(n) bins a window, for a window of n requests: a few bins hold less than the noise
    of a count), each start's count is bounded below and above by whole bins, and only the starts
    whose upper bound reaches the best lower bound are counted exactly (the busiest stretches,
    a few per cent of the starts). Same counts, same float arithmetic (offset + d) as the
    whole-table search."""

    def __init__(self, duration_s: float):
        self.d = float(duration_s)
        self.pending = np.empty(0, dtype=np.float64)
        self.count = 0
        self.start = 0.0

    def feed(self, off: np.ndarray) -> None:
        buf = np.concatenate([self.pending, off]) if len(self.pending) else off
        # resolved: the starts whose window ends before the last request seen (a later chunk cannot
        # add to them)
        done = int(np.searchsorted(buf + self.d, buf[-1], side="right"))
        self._best_of(buf, done)
        self.pending = buf[done:]

    def finish(self) -> tuple[float, int]:
        if len(self.pending):
            self._best_of(self.pending, len(self.pending))
        self.pending = np.empty(0, dtype=np.float64)
        return self.start, self.count

    def _best_of(self, buf: np.ndarray, done: int) -> None:
        """Take the best of the starts buf[:done], whose windows end within buf (or at its end)."""
        if done == 0:
            return
        span = max(float(buf[-1] - buf[0]), self.d)
        fine = int(min(4096, max(8, 4 * np.sqrt(len(buf) * self.d / span))))  # bins a window
        if span / self.d * fine > _BINS_MAX:  # a bin number past float precision: no sound bounds
            self._count(buf, np.arange(done))
            return
        bins = ((buf - buf[0]) / (self.d / fine)).astype(np.int64)  # non-decreasing, as buf is
        # a count per bin of the span is the fastest where the span holds few empty bins; a span of
        # years between a few requests holds billions, so there only the occupied bins are counted
        dense = bins[-1] < 4 * len(bins)
        self._count(buf, (_reaching_dense if dense else _reaching_sparse)(bins, done, fine, floor=self.count))

    def _count(self, buf: np.ndarray, idx: np.ndarray) -> None:
        if len(idx) == 0:
            return
        counts = np.searchsorted(buf, buf[idx] + self.d, side="left") - idx
        best = int(np.argmax(counts))
        if counts[best] > self.count:
            self.count, self.start = int(counts[best]), float(buf[idx[best]])
        elif counts[best] == self.count and float(buf[idx[best]]) < self.start:
            self.start = float(buf[idx[best]])  # a tie: the earliest start, as the whole-table search


# The starts worth counting exactly: each start's count is bounded by whole bins of `fine` a window (a
# window starting in bin k ends before bin k + fine + 1, one bin more for rounding, and holds bins k + 2
# .. k + fine - 2 whole, one bin less each side); a lower bound counts only where a resolved start lies
# in the bin (not the last such bin, which may hold unresolved starts too). The starts whose upper bound
# reaches the best lower bound (and `floor`, the best count so far) are returned. Both give the same.

def _reaching_dense(bins: np.ndarray, done: int, fine: int, *, floor: int) -> np.ndarray:
    """From a count of every bin of the span."""
    per_bin = np.bincount(bins)
    edges = np.concatenate([[0], np.cumsum(per_bin)])  # requests before each bin
    k = np.arange(bins[done - 1] + 1)
    last = len(per_bin)
    upper = edges[np.minimum(k + fine + 2, last)] - edges[k]
    lower = edges[np.minimum(k + fine - 1, last)] - edges[np.minimum(k + 2, last)]
    holds = per_bin[k] > 0
    holds[-1] = False
    floor = max(floor, int(lower[holds].max()) if holds.any() else 0, 1)
    return np.flatnonzero(upper[bins[:done]] >= floor)


def _reaching_sparse(bins: np.ndarray, done: int, fine: int, *, floor: int) -> np.ndarray:
    """From the occupied bins alone: the requests before bin j are those of the occupied bins below j."""
    first = np.flatnonzero(np.diff(bins, prepend=-1))  # each occupied bin's first request
    occupied, first = bins[first], np.append(first, len(bins))

    def before(j: np.ndarray) -> np.ndarray:
        return first[np.searchsorted(occupied, j, side="left")]

    mine = int(np.searchsorted(first, done, side="left"))  # the occupied bins of bins[:done]
    k = occupied[:mine]
    upper = before(k + fine + 2) - first[:mine]
    lower = before(k[:-1] + fine - 1) - before(k[:-1] + 2)
    floor = max(floor, int(lower.max()) if len(lower) else 0, 1)
    return np.flatnonzero(np.repeat(upper >= floor, np.diff(first[: mine + 1]))[:done])


class _Gaps:
    """Mean and variance of the inter-arrival gaps, merged chunk by chunk (Chan et al.)."""

    def __init__(self):
        self.n, self.mean, self.m2 = 0, 0.0, 0.0

    def feed(self, gaps: np.ndarray) -> None:
        if not len(gaps):
            return
        n, mean = len(gaps), float(gaps.mean())
        m2 = float(((gaps - mean) ** 2).sum())
        total = self.n + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.m2 += m2 + delta * delta * self.n * n / total
        self.n = total


class _Counts:
    """How often each value of a positive integer column occurs, for exact percentiles."""

    def __init__(self):
        self.dense = np.zeros(0, dtype=np.int64)
        self.sparse: list[tuple[np.ndarray, np.ndarray]] = []

    def feed(self, values: np.ndarray) -> None:
        top = int(values.max()) if len(values) else 0
        if top < _BINCOUNT_MAX:
            counts = np.bincount(values, minlength=len(self.dense))
            counts[: len(self.dense)] += self.dense
            self.dense = counts
        else:
            self.sparse.append(np.unique(values, return_counts=True))

    def table(self) -> tuple[np.ndarray, np.ndarray]:
        vals = [np.flatnonzero(self.dense)]
        cnts = [self.dense[vals[0]]]
        for v, c in self.sparse:
            vals.append(v)
            cnts.append(c)
        v, inverse = np.unique(np.concatenate(vals), return_inverse=True)
        return v, np.bincount(inverse, weights=np.concatenate(cnts)).astype(np.int64)

    def summary(self) -> dict[str, float]:
        values, counts = self.table()
        n = int(counts.sum())
        cum = np.cumsum(counts)

        def at(k: int) -> float:  # the k-th smallest value (0-based)
            return float(values[int(np.searchsorted(cum, k, side="right"))])

        out = {}
        for p in PERCENTILES:
            # numpy's default ("linear") percentile: between the floor and ceiling order statistics
            pos = (p / 100) * (n - 1)
            lo = int(np.floor(pos))
            a, b, t = at(lo), at(min(lo + 1, n - 1)), pos - lo
            out[f"p{p}"] = float(b - (b - a) * (1 - t)) if t >= 0.5 else float(a + (b - a) * t)
        out["mean"] = float((values.astype(np.float64) * counts).sum() / n)
        out["max"] = float(values[-1])
        return out


def _progress(done: int, total: int, *, what: str, shown: list[int]) -> None:
    """A line per tenth of the rows, for a scan long enough to want one."""
    if total < 20_000_000:
        return
    tenth = done * 10 // total
    if tenth > shown[0]:
        shown[0] = tenth
        print(f"  {what}: {done:,} of {total:,} requests ({tenth * 10}%)", file=sys.stderr, flush=True)


def describe_recording(rec: Recording, busiest_s: float = 60.0) -> dict[str, Any]:
    """stats.describe of the whole recording, reading one segment at a time (only the columns the
    statistics use)."""
    busiest_s = float(busiest_s)
    if not (busiest_s > 0 and np.isfinite(busiest_s)):
        raise TrafficError(f"window duration must be a positive number of seconds, got {busiest_s}")
    t0 = rec.start
    windows = {1.0: _Busiest(1.0), 60.0: _Busiest(60.0)}
    windows.setdefault(busiest_s, _Busiest(busiest_s))
    gaps = _Gaps()
    size_cols = [BATCH_SIZE, *(c for c in rec.columns if c not in RESERVED)]
    sizes = {c: _Counts() for c in size_cols}
    models: dict[str, int] = {}
    n, items, last, total, shown = 0, 0, None, rec.rows, [0]
    for df in rec.frames():
        off = df[TIMESTAMP].to_numpy(dtype=np.float64) - t0
        for tracker in windows.values():
            tracker.feed(off)
        gaps.feed(np.diff(off) if last is None else np.diff(off, prepend=last))
        last = off[-1]
        n += len(off)
        items += int(df[BATCH_SIZE].sum())
        for col, counter in sizes.items():
            counter.feed(df[col].to_numpy(dtype=np.int64))
        if MODEL in df:
            for name, count in df[MODEL].value_counts(sort=False).items():
                models[str(name)] = models.get(str(name), 0) + int(count)
        _progress(n, total, what="statistics", shown=shown)
    found = {d: tracker.finish() for d, tracker in windows.items()}
    duration = float(last)
    mean_gap = gaps.mean if gaps.n else float("nan")
    std = float(np.sqrt(gaps.m2 / gaps.n)) if gaps.n else float("nan")
    stats: dict[str, Any] = {
        "requests": n,
        "items": items,
        "start": float(t0),
        "duration_s": duration,
        "mean_rps": (n - 1) / duration if duration > 0 else float("nan"),
        "peak_rps": found[1.0][1],
        "peak_rpm": found[60.0][1],
        "interarrival_cv": std / mean_gap if gaps.n > 1 and mean_gap > 0 else float("nan"),
    }
    stats["mean_rpm"] = stats["mean_rps"] * 60
    start, count = found[busiest_s]
    stats["busiest"] = {"duration_s": busiest_s, "start_s": start, "requests": count, "rps": count / busiest_s}
    stats["sizes"] = {col: counter.summary() for col, counter in sizes.items()}
    if MODEL in rec.columns:
        stats["models"] = dict(sorted(models.items(), key=lambda kv: -kv[1]))
    add_tokens(stats)
    return stats


def busiest_in(rec: Recording, duration_s: float) -> tuple[float, int]:
    """Start (seconds from the first request) and request count of the busiest `duration_s`
    stretch, as windows.busiest_window finds it, from a scan of the timestamp column alone."""
    duration_s = float(duration_s)
    if not (duration_s > 0 and np.isfinite(duration_s)):
        raise TrafficError(f"window duration must be a positive number of seconds, got {duration_s}")
    t0, tracker, done, shown = rec.start, _Busiest(duration_s), 0, [0]
    for ts in rec.times():
        tracker.feed(ts - t0)
        done += len(ts)
        _progress(done, rec.rows, what=f"busiest {duration_s:g} s", shown=shown)
    return tracker.finish()


def read_window(rec: Recording, start_s: float | None = None, duration_s: float | None = None) -> pd.DataFrame:
    """windows.window of the whole recording: the requests with start_s <= offset < start_s +
    duration_s, reading only the row groups whose time range meets the window."""
    start = window_start(start_s, duration_s)
    t0 = rec.start
    end = None if duration_s is None else start + float(duration_s)
    # a part is read when its range may hold an offset in the window; the exact test is on offsets,
    # as windows.window makes it, so a rounding at the edge cannot move a request in or out
    slack = 1e-6 * max(1.0, abs(t0))
    parts = []
    for df in rec.frames(since=t0 + start - slack, until=None if end is None else t0 + end + slack):
        off = df[TIMESTAMP].to_numpy(dtype=np.float64) - t0
        keep = off >= start if end is None else (off >= start) & (off < end)
        if keep.any():
            parts.append(df[keep])
    if not parts:
        span = rec.end - t0
        shown_end = "the end" if end is None else f"{end:g} s"
        raise TrafficError(
            f"window {start:g} s to {shown_end} holds no requests (the traffic spans 0 to {span:g} s)"
        )
    return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0].reset_index(drop=True)


def read_since(rec: Recording, since: float) -> pd.DataFrame:
    """The requests with timestamp >= `since` (absolute seconds), reading only the row groups that
    reach it; an empty table (the recording's columns) when none do."""
    parts = []
    for df in rec.frames(since=since):
        keep = df[TIMESTAMP].to_numpy(dtype=np.float64) >= since
        if keep.any():
            parts.append(df[keep])
    if not parts:
        return pd.DataFrame({c: [] for c in rec.columns})
    return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0].reset_index(drop=True)


def read_range(rec: Recording, since: float | None = None, until: float | None = None) -> pd.DataFrame:
    """The requests with `since <= timestamp < until` (absolute seconds, either open), reading only
    the row groups that meet the range; a range that holds none is refused, with the recording's span."""
    if since is not None and until is not None and not since < until:
        raise TrafficError(f"the range's end ({instant_text(until)}) must come after its start "
                           f"({instant_text(since)})")
    parts = []
    for df in rec.frames(since=since, until=until):
        ts = df[TIMESTAMP].to_numpy(dtype=np.float64)
        keep = np.ones(len(ts), dtype=bool)
        if since is not None:
            keep &= ts >= since
        if until is not None:
            keep &= ts < until
        if keep.any():
            parts.append(df[keep])
    if not parts:
        shown = (f"{'the start' if since is None else instant_text(since)} to "
                 f"{'the end' if until is None else instant_text(until)}")
        raise TrafficError(f"{shown} holds no requests (the traffic spans {instant_text(rec.start)} "
                           f"to {instant_text(rec.end)})")
    return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0].reset_index(drop=True)


def read_all(rec: Recording) -> pd.DataFrame:
    """The whole recording as one validated table, in time order (what fits in memory)."""
    frames = list(rec.frames())
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]

