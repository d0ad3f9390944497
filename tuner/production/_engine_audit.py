"""The production audit of a generative model (vLLM serves it): Prometheus's history of vLLM's own
series over a window, judged against the study's token SLA (TTFT, TPOT at its percentile, errors),
output tokens per dollar, preemptions and the KV cache, and with a baseline the peak's ratio to one
tuned server's capacity. Nothing is replayed, no server touched."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pandas as pd

from tuner.cost import price_for
from tuner.production._audit import HOUR_S, _utc, check_prometheus, window_bounds
from tuner.production._client import Prometheus
from tuner.production._engine_figures import EngineSeries, engine_steps, engine_totals, over_sla
from tuner.production._engine_result import EngineAudit, EngineBaseline, engine_findings
from tuner.production._engine_series import E2E, TPOT, TTFT, read_engine_series
from tuner.production._errors import NoSeriesError
from tuner.production._figures import SECONDS, recoverable_per_month
from tuner.settings import SlaSettings, StudySettings, check_generative

__all__ = ["judge_engine", "production_engine_audit"]


def production_engine_audit(
    settings: StudySettings,
    prometheus: Prometheus,
    *,
    window_s: float,
    end: float | None = None,
    step_s: float = HOUR_S,
    baseline: EngineBaseline | None = None,
    on_query: Callable[[str], None] | None = None,
) -> EngineAudit:
    """Audit the study's vLLM-served model from Prometheus's history: the `window_s` seconds before
    `end` (default: the last whole step), in steps of `step_s` (an hour)."""
    check_generative(settings, generative=True)  # the token SLA it is judged by
    start, end = window_bounds(window_s, step_s=step_s, end=end)
    check_prometheus(prometheus, window_s=window_s)
    series = read_engine_series(prometheus, model=settings.model, quantile=settings.sla.percentile / 100,
                                start=start, end=end, step_s=step_s, on_query=on_query)
    sla = settings.sla
    for name, limit, column, names in (("TTFT", sla.ttft_ms, "ttft_s", TTFT), ("TPOT", sla.tpot_ms, "tpot_s", TPOT),
                                       ("end-to-end", sla.e2e_ms, "e2e_s", E2E)):
        # a limit with no histogram behind it cannot be judged: said, not counted as every hour broken
        if limit is not None and len(series.counters) and series.quantiles[column].isna().all() and math.isnan(
                series.window[column]):
            key = {"TTFT": "ttft_ms", "TPOT": "tpot_ms"}.get(name, "e2e_ms")
            raise NoSeriesError(f"Prometheus {prometheus.url}: model {settings.model!r} has no {name} "
                                f"histogram ({' or '.join(names)}) in the window: sla.{key} cannot be judged")
    return judge_engine(series, model=settings.model, prometheus=prometheus.url, start=start, end=end,
                        step_s=step_s, price_per_hour=price_for(settings.cost, source=settings.source).price_per_hour, sla=sla,
                        baseline=baseline)


def judge_engine(
    series: EngineSeries,
    *,
    model: str,
    prometheus: str,
    start: float,
    end: float,
    step_s: float,
    price_per_hour: float,
    sla: SlaSettings,
    baseline: EngineBaseline | None = None,
) -> EngineAudit:
    """The audit of vLLM's series read from Prometheus: figures, SLA by step, ratio, findings."""
    steps = engine_steps(series, step_s=step_s)
    steps["over_sla"] = over_sla(steps, sla).reindex(steps.index)
    totals = engine_totals(series, steps, price_per_hour=price_per_hour)
    ratio = recoverable = None
    if baseline is not None and totals.peak_output_tokens_per_s is not None:
        ratio = totals.peak_output_tokens_per_s / baseline.capacity_tokens_per_s
        recoverable = recoverable_per_month(ratio, replicas=totals.replicas, price_per_hour=price_per_hour)
    by_instance = series.counters.groupby(level="instance")
    instances = pd.DataFrame({"seconds": by_instance[SECONDS].sum(),
                              "generation_tokens": by_instance["generation_tokens"].sum(),
                              "preemptions": by_instance["preemptions"].sum(),
                              "steps": by_instance.size()})  # a row per step with samples, as by_instance counts
    instances["output_tokens_per_s"] = instances["generation_tokens"] / instances["seconds"]
    out = EngineAudit(
        model=model, prometheus=prometheus, start=_utc(start), end=_utc(end), step_s=step_s,
        price_per_hour=price_per_hour, sla=sla, tpot_metric=series.tpot_metric, figures=totals, steps=steps,
        instances=instances, gaps=list(series.gaps - pd.Timedelta(seconds=step_s)), restarts=series.resets,
        baseline=baseline, ratio=ratio, recoverable_per_month=recoverable,
    )
    return dataclasses.replace(out, findings=engine_findings(out))
