"""The production figures from Triton's counter increases: pure arithmetic, no HTTP.

The input is a frame of increases, one row per (step's end, instance) with the columns of COLUMNS
(requests succeeded and failed, inferences, executions, queue and compute microseconds), as
Prometheus's increase() gives them (counter resets handled there), and SECONDS: the seconds of the step
the instance served (all of it, or the part after it started or before it stopped). From a set of rows:

    throughput        = succeeded / the seconds the rows cover (a step's: its longest-serving instance's)
    mean batch        = inferences / executions          (Triton's dispatched batch)
    fill rate         = mean batch / max_batch_size
    queue, compute    = queue or compute microseconds / succeeded  (per request)
    error rate        = failed / (succeeded + failed)
    per replica       = succeeded / the replica-seconds (each instance's served seconds summed)
    ratio             = per replica / the baseline's capacity (one server, as `tuner tune` measures)
    recoverable       = (1 - ratio) x replicas x price per hour x hours per month
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from tuner.cost import HOURS_PER_MONTH

__all__ = [
    "COLUMNS",
    "SECONDS",
    "ProductionFigures",
    "by_instance",
    "by_step",
    "hours_under",
    "recoverable_per_month",
    "throughput_ratio",
    "total",
]

COLUMNS = ("succeeded", "failed", "inferences", "executions", "queue_us", "compute_us")
SECONDS = "seconds"  # the seconds of its step a row's instance served


@dataclass(frozen=True, kw_only=True)
class ProductionFigures:
    """The production figures of a stretch of time (None: no requests to divide by)."""

    seconds: float  # the time covered: the steps with samples
    replicas: float  # instances serving, on average over `seconds`
    requests: float  # succeeded + failed
    throughput_rps: float  # all instances together
    per_replica_rps: float
    mean_batch: float | None
    fill_rate: float | None
    queue_ms: float | None
    compute_ms: float | None
    error_rate: float | None

    def as_dict(self) -> dict:
        """The figures as a plain dict (what --json writes)."""
        return dict(self.__dict__)


def _frame(
    sums: pd.DataFrame, seconds: pd.Series, replica_seconds: pd.Series, *, max_batch_size: int
) -> pd.DataFrame:
    """The figures of each row of `sums` (vectorised: one row per step, per instance, or the total)."""
    ok, failed = sums["succeeded"], sums["failed"]
    requests = ok + failed
    per_ok = ok.where(ok > 0)
    mean_batch = sums["inferences"] / sums["executions"].where(sums["executions"] > 0)
    fill = mean_batch / max_batch_size if max_batch_size > 0 else mean_batch * np.nan
    return pd.DataFrame(
        {
            "seconds": seconds,
            "replicas": replica_seconds / seconds,
            "requests": requests,
            "throughput_rps": ok / seconds,
            "per_replica_rps": ok / replica_seconds,
            "mean_batch": mean_batch,
            "fill_rate": fill,
            "queue_ms": sums["queue_us"] / per_ok / 1000,
            "compute_ms": sums["compute_us"] / per_ok / 1000,
            "error_rate": failed / requests.where(requests > 0),
        }
    )


def by_step(
    increases: pd.DataFrame, *, step_s: float, max_batch_size: int, capacity_rps: float | None = None
) -> pd.DataFrame:
    """The figures of each step (all instances summed), indexed by the step's start; `ratio` against
    the baseline's `capacity_rps` (NaN without one)."""
    steps = increases.groupby(level="end")
    sums = steps[list(COLUMNS)].sum()
    out = _frame(sums, steps[SECONDS].max(), steps[SECONDS].sum(), max_batch_size=max_batch_size)
    out["ratio"] = throughput_ratio(out["per_replica_rps"], capacity_rps) if capacity_rps else np.nan
    out.index = (out.index - pd.Timedelta(seconds=step_s)).rename("start")
    return out


def by_instance(increases: pd.DataFrame, *, max_batch_size: int) -> pd.DataFrame:
    """The figures of each instance over the steps it has samples in (`steps`: how many), indexed by
    instance."""
    instances = increases.groupby(level="instance")
    seconds = instances[SECONDS].sum()
    out = _frame(instances[list(COLUMNS)].sum(), seconds, seconds, max_batch_size=max_batch_size)
    out["steps"] = instances.size()  # a row per step with samples: an instance that started late serves part of one
    return out


def total(increases: pd.DataFrame, *, max_batch_size: int) -> ProductionFigures:
    """The figures of the whole window: the steps with samples, every instance."""
    steps = increases.index.get_level_values("end").nunique()
    if not steps:
        return ProductionFigures(seconds=0.0, replicas=0.0, requests=0.0, throughput_rps=0.0, per_replica_rps=0.0, mean_batch=None, fill_rate=None, queue_ms=None, compute_ms=None, error_rate=None)
    sums = increases[list(COLUMNS)].sum().to_frame().T
    seconds = increases.groupby(level="end")[SECONDS].max().sum()
    row = _frame(
        sums, pd.Series([seconds]), pd.Series([increases[SECONDS].sum()]), max_batch_size=max_batch_size
    ).iloc[0]
    return ProductionFigures(**{k: None if pd.isna(v) else float(v) for k, v in row.items()})


def hours_under(values: pd.Series, threshold: float) -> list:
    """The index entries (steps) whose value is under `threshold` (steps without a value: not counted)."""
    return list(values.index[values.lt(threshold).to_numpy() & values.notna().to_numpy()])


def throughput_ratio(per_replica_rps, capacity_rps: float):
    """What a replica serves / what one server of the baseline can (its capacity under the SLA)."""
    return per_replica_rps / capacity_rps


def recoverable_per_month(ratio: float, *, replicas: float, price_per_hour: float) -> float:
    """The throughput gap x what the replicas cost per month: (1 - ratio) x replicas x price x 730 h."""
    return max(0.0, 1.0 - ratio) * replicas * price_per_hour * HOURS_PER_MONTH
