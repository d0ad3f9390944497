"""The production audit: Prometheus's history of the model's Triton counters over a window, judged
against a baseline as the replay audit judges a deployment. Nothing is replayed, no server touched."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

import pandas as pd

from tuner.audit import Baseline
from tuner.cost import price_for
from tuner.production import _figures as fig
from tuner.production._client import Prometheus
from tuner.production._errors import WindowError
from tuner.production._result import ProductionAudit, findings
from tuner.production._series import Counters, read_counters
from tuner.production._window import format_duration, retention_s
from tuner.settings import StudySettings
from tuner.study import base_config

__all__ = ["HOUR_S", "check_prometheus", "judge", "production_audit", "window_bounds"]

HOUR_S = 3600.0


def window_bounds(
    window_s: float, *, step_s: float = HOUR_S, end: float | None = None
) -> tuple[float, float]:
    """The window's start and end (Unix seconds): ending at `end` (default: the last whole step
    before now, so that every step is complete), `window_s` long, a whole number of steps."""
    if window_s < step_s or window_s % step_s:
        raise WindowError(
            f"--window {format_duration(window_s)}: a whole number of {format_duration(step_s)} "
            f"steps (the audit's figures are per {format_duration(step_s)})"
        )
    if end is None:
        end = math.floor(time.time() / step_s) * step_s
    return end - window_s, end


def check_prometheus(prometheus: Prometheus, *, window_s: float) -> None:
    """PrometheusError unless a Prometheus API answers; WindowError when the window is longer than its
    retention (the start of the window would read as a gap)."""
    prometheus.check()
    limit = retention_s(prometheus.retention())
    if limit is not None and window_s > limit:
        raise WindowError(
            f"--window {format_duration(window_s)}: longer than Prometheus's retention "
            f"({format_duration(limit)}) at {prometheus.url}"
        )


def production_audit(
    settings: StudySettings,
    prometheus: Prometheus,
    *,
    window_s: float,
    end: float | None = None,
    step_s: float = HOUR_S,
    baseline: Baseline | None = None,
    on_query: Callable[[str], None] | None = None,
) -> ProductionAudit:
    """Audit the study's model from Prometheus's history: the `window_s` seconds before `end`, in
    steps of `step_s` (an hour). max_batch_size is the study's base config's (tuner.study.base_config)."""
    start, end = window_bounds(window_s, step_s=step_s, end=end)
    check_prometheus(prometheus, window_s=window_s)
    max_batch_size = base_config(settings).max_batch_size
    counters = read_counters(
        prometheus, model=settings.model, start=start, end=end, step_s=step_s, on_query=on_query
    )
    return judge(
        counters,
        model=settings.model,
        prometheus=prometheus.url,
        start=start,
        end=end,
        step_s=step_s,
        max_batch_size=max_batch_size,
        price_per_hour=price_for(settings.cost, source=settings.source).price_per_hour,
        max_error_rate=settings.sla.max_error_rate,
        baseline=baseline,
    )


def judge(
    counters: Counters,
    *,
    model: str,
    prometheus: str,
    start: float,
    end: float,
    step_s: float,
    max_batch_size: int,
    price_per_hour: float,
    max_error_rate: float,
    baseline: Baseline | None = None,
) -> ProductionAudit:
    """The audit of counters read from Prometheus: figures, ratio, budget and findings."""
    inc = counters.increases
    total = fig.total(inc, max_batch_size=max_batch_size)
    capacity = baseline.capacity_rps if baseline is not None else None
    ratio = recoverable = None
    if capacity and total.seconds:
        ratio = fig.throughput_ratio(total.per_replica_rps, capacity)
        recoverable = fig.recoverable_per_month(ratio, replicas=total.replicas, price_per_hour=price_per_hour)
    out = ProductionAudit(
        model=model,
        prometheus=prometheus,
        start=_utc(start),
        end=_utc(end),
        step_s=step_s,
        max_batch_size=max_batch_size,
        price_per_hour=price_per_hour,
        max_error_rate=max_error_rate,
        figures=total,
        steps=fig.by_step(inc, step_s=step_s, max_batch_size=max_batch_size, capacity_rps=capacity),
        instances=fig.by_instance(inc, max_batch_size=max_batch_size),
        gaps=list(counters.gaps - pd.Timedelta(seconds=step_s)),
        restarts=counters.resets,
        baseline=baseline,
        ratio=ratio,
        recoverable_per_month=recoverable,
    )
    return dataclasses.replace(out, findings=findings(out))


def _utc(seconds: float) -> pd.Timestamp:
    return pd.Timestamp(seconds, unit="s", tz="UTC")
