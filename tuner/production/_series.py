"""Triton's counters read from Prometheus as increases per step and instance (a pandas frame).

One range query per counter: `sum by (instance) (increase(METRIC{model="m"}[STEP]))` at the end of
every step of the window; increase() handles counter resets (a restarted server starts its counters
at zero) and extrapolates to the step's edges. Versions of the model are summed; instances are kept
apart (Prometheus's `instance` label: one per scraped Triton). A step where an instance has fewer than
two samples has no point: a scrape gap, said by the audit, not counted as zero traffic.

Each point also says how many seconds of its step the instance served (the SECONDS column): a replica that
started or stopped inside the step (a scale-up, a scale-down) served only part of it, and its increase
is what it served in that part. The seconds are those increase() counts: from the step's start, or
from its first sample when that lies more than 1.1 average scrape intervals after the start (then half
an interval before it, as increase() extrapolates), to the step's end, or likewise its last sample.
The first and last sample times and the count come from the samples themselves, read a day of steps
at a time (`series[1d]`): PromQL has no function for a range's sample times, and a subquery of
`timestamp()` at a 120th of the step took Prometheus 2.42 20 s a query over a week of two replicas, past
the client's 30-s timeout on a loaded machine, where the raw week took 0.15 s.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tuner.production._client import Prometheus
from tuner.production._errors import NoSeriesError
from tuner.production._figures import COLUMNS, SECONDS
from tuner.production._window import promql_range

__all__ = ["METRICS", "Counters", "covered_queries", "counter_queries", "read_counters", "read_covered"]

# the frame's columns and Triton's counters they come from (Triton's metrics port, /metrics)
METRICS = dict(
    zip(
        COLUMNS,
        (
            "nv_inference_request_success",
            "nv_inference_request_failure",
            "nv_inference_count",
            "nv_inference_exec_count",
            "nv_inference_queue_duration_us",
            "nv_inference_compute_infer_duration_us",
        ),
        strict=True,
    )
)
CHUNK_STEPS = 24  # steps of samples per query of read_covered: a day of hours, ~5,800 samples a series at 15 s
EDGE = 1.1  # increase() extrapolates to a range's edge within 1.1 average sample intervals of it


@dataclass(frozen=True)
class Counters:
    """The increases of Triton's counters over a window, per step and instance."""

    increases: pd.DataFrame  # index (end, instance): the step's end (UTC) and the instance; COLUMNS
    ends: pd.DatetimeIndex  # every step's end in the window, with samples or not
    resets: dict[str, int]  # instance -> its counter resets (server restarts) in the window

    @property
    def gaps(self) -> pd.DatetimeIndex:
        """The steps in which no instance has two samples (scrape gaps, or the server down)."""
        return self.ends.difference(self.increases.index.get_level_values("end").unique())


def read_counters(
    prometheus: Prometheus,
    *,
    model: str,
    start: float,
    end: float,
    step_s: float,
    on_query: Callable[[str], None] | None = None,
) -> Counters:
    """The counters of `model` from `start` to `end` (Unix seconds) in steps of `step_s`: NoSeriesError
    when Prometheus has no Triton metrics, none of this model, or misses one of the counters."""
    say = on_query or (lambda _label: None)
    say("models with Triton metrics")
    models = prometheus.label_values("model", match=METRICS["succeeded"], start=start, end=end)
    where = f"Prometheus {prometheus.url}"
    if not models:
        raise NoSeriesError(
            f"{where}: no Triton metrics ({METRICS['succeeded']}) in the window: is Triton's "
            "metrics port scraped, and the server started with --allow-metrics true?"
        )
    if model not in models:
        raise NoSeriesError(
            f"{where}: model {model!r} has no series in the window (models with Triton "
            f"metrics: {', '.join(sorted(models))})"
        )
    selector = f'{{model="{_escape(model)}"}}'
    range_ = promql_range(step_s)
    frames = []
    for column, metric in METRICS.items():
        say(metric)
        result = prometheus.query_range(
            f"sum by (instance) (increase({metric}{selector}{range_}))",
            start=start + step_s,
            end=end,
            step_s=step_s,
        )
        if not result and not frames:  # the model is there, but no step has two samples: all gaps
            frames = [_long([], c) for c in METRICS]
            break
        if not result:
            raise NoSeriesError(
                f"{where}: Triton metrics missing: no {metric} of model {model!r} in the window"
            )
        frames.append(_long(result, column))
    increases = pd.concat(frames, axis=1, join="inner").sort_index()
    covered = read_covered(prometheus, series=f"{METRICS['succeeded']}{selector}", start=start, end=end,
                           step_s=step_s, on_query=say)
    increases[SECONDS] = covered.reindex(increases.index).fillna(step_s).clip(0.0, step_s)
    say("restarts")
    resets = prometheus.query(
        f"sum by (instance) (resets({METRICS['succeeded']}{selector}{promql_range(end - start)}))", at=end
    )
    ends = _times(np.arange(start + step_s, end + 1e-6, step_s))
    return Counters(
        increases,
        pd.DatetimeIndex(ends, name="end"),
        {r["metric"].get("instance", ""): int(float(r["value"][1])) for r in resets},
    )


def covered_queries(window_s: float, *, step_s: float) -> int:
    """The queries read_covered asks for a window of `window_s` in steps of `step_s`."""
    return math.ceil(round(window_s / step_s) / CHUNK_STEPS)


def counter_queries(window_s: float, *, step_s: float) -> int:
    """The queries read_counters asks: the models present, each counter, the covered seconds, the restarts."""
    return 1 + len(METRICS) + covered_queries(window_s, step_s=step_s) + 1


def read_covered(
    prometheus: Prometheus,
    *,
    series: str,
    start: float,
    end: float,
    step_s: float,
    on_query: Callable[[str], None] | None = None,
) -> pd.Series:
    """The seconds of each step from `start` to `end` each instance's `series` (a selector) covers, as
    increase() counts them (see the module's docstring), indexed by (end, instance)."""
    say = on_query or (lambda _label: None)
    ms = round(step_s * 1000)
    first_ms, steps = round(start * 1000), round((end - start) / step_s)
    times: dict[tuple, list[np.ndarray]] = {}
    chunks = range(0, steps, CHUNK_STEPS)
    for number, chunk in enumerate(chunks, 1):
        say(f"sample times ({number} of {len(chunks)})")
        last = min(chunk + CHUNK_STEPS, steps)
        at = (first_ms + last * ms) / 1000
        for s in prometheus.query(f"{series}{promql_range((last - chunk) * step_s)}", at=at):
            points = np.asarray(s["values"], dtype=float).reshape(-1, 2)[:, 0]
            times.setdefault(tuple(sorted(s["metric"].items())), []).append(np.round(points * 1000).astype(np.int64))
    # a step's range is closed at both ends in Prometheus 2 (a sample on the boundary is in both steps)
    step_ends = first_ms + ms * np.arange(1, steps + 1, dtype=np.int64)
    rows = []
    for key, parts in times.items():
        t = np.unique(np.concatenate(parts))  # sorted; a chunk's boundary sample is read twice
        lo, hi = np.searchsorted(t, step_ends - ms, "left"), np.searchsorted(t, step_ends, "right")
        has = hi > lo
        rows.append(pd.DataFrame({"end": step_ends[has], "instance": dict(key).get("instance", ""),
                                  "first": t[lo[has]], "last": t[hi[has] - 1], "count": (hi - lo)[has]}))
    if not rows:
        return pd.Series(dtype=float, name=SECONDS, index=pd.MultiIndex.from_arrays(
            [_times(np.empty(0)), np.empty(0, dtype=object)], names=["end", "instance"]))
    # the model's versions are series of one instance: it served from the first one's first sample
    t = pd.concat(rows).groupby(["end", "instance"]).agg(first=("first", "min"), last=("last", "max"),
                                                          count=("count", "max"))
    step_end = t.index.get_level_values("end").to_numpy() / 1000
    step_start = step_end - step_s
    lo, hi = t["first"].to_numpy() / 1000, t["last"].to_numpy() / 1000
    interval = (hi - lo) / np.maximum(t["count"].to_numpy() - 1, 1)
    lo = np.where(lo - step_start <= EDGE * interval, step_start, lo - interval / 2)
    hi = np.where(step_end - hi <= EDGE * interval, step_end, hi + interval / 2)
    index = pd.MultiIndex.from_arrays([_times(step_end), t.index.get_level_values("instance")],
                                      names=["end", "instance"])
    return pd.Series(np.clip(hi - lo, 0.0, step_s), index=index, name=SECONDS)


def _long(result: list[dict], column: str) -> pd.Series:
    """A range query's series as one column indexed by (end, instance)."""
    times, instances, values = [np.empty(0)], [np.empty(0, dtype=object)], [np.empty(0)]
    for series in result:
        points = np.asarray(series["values"], dtype=float).reshape(-1, 2)
        times.append(points[:, 0])
        values.append(points[:, 1])
        instances.append(np.full(len(points), series["metric"].get("instance", ""), dtype=object))
    index = pd.MultiIndex.from_arrays(
        [_times(np.concatenate(times)), np.concatenate(instances)], names=["end", "instance"]
    )
    return pd.Series(np.concatenate(values), index=index, name=column)


def _times(seconds: np.ndarray) -> pd.DatetimeIndex:
    """Unix seconds as UTC times to the millisecond (the API's precision: steps computed here match
    the points it returns)."""
    return pd.to_datetime(
        np.round(np.asarray(seconds, dtype=float) * 1000).astype(np.int64), unit="ms", utc=True
    )


def _escape(value: str) -> str:
    """A PromQL string literal's body (backslashes and quotes escaped)."""
    return value.replace("\\", "\\\\").replace('"', '\\"')
