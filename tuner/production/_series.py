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
The first and last sample times come from a subquery of `timestamp()` at a 120th of the step (PromQL
has no function for a range's sample times); the average interval from the samples counted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tuner.production._client import Prometheus
from tuner.production._errors import NoSeriesError
from tuner.production._figures import COLUMNS, SECONDS
from tuner.production._window import promql_range

__all__ = ["METRICS", "QUERIES", "Counters", "read_counters", "read_covered"]

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
QUERIES = len(METRICS) + 5  # the models present, each counter, the covered seconds (3), the restarts
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
    range_ = promql_range(step_s)
    sub = f"[{round(step_s * 1000)}ms:{max(1000, round(step_s * 1000 / 120))}ms]"

    def steps(promql: str, column: str) -> pd.Series:
        return _long(prometheus.query_range(promql, start=start + step_s, end=end, step_s=step_s), column)

    say("first samples")
    first = steps(f"min by (instance) (min_over_time(timestamp({series}){sub}))", "first")
    say("last samples")
    last = steps(f"max by (instance) (max_over_time(timestamp({series}){sub}))", "last")
    say("samples")
    count = steps(f"max by (instance) (count_over_time({series}{range_}))", "count")
    t = pd.concat([first, last, count], axis=1, join="inner")
    if t.empty:
        return pd.Series(dtype=float, name=SECONDS, index=t.index)
    step_end = np.array([e.timestamp() for e in t.index.get_level_values("end")])
    step_start = step_end - step_s
    lo = np.maximum(t["first"].to_numpy(), step_start)  # a sample before the start: served from it
    hi = np.minimum(t["last"].to_numpy(), step_end)
    interval = (hi - lo) / np.maximum(t["count"].to_numpy() - 1, 1)
    lo = np.where(lo - step_start <= EDGE * interval, step_start, lo - interval / 2)
    hi = np.where(step_end - hi <= EDGE * interval, step_end, hi + interval / 2)
    return pd.Series(np.clip(hi - lo, 0.0, step_s), index=t.index, name=SECONDS)


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
