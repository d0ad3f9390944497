"""A generative model's production figures from vLLM's series (_engine_series): pure arithmetic.

    output tokens/s     = generation tokens / the seconds the steps cover (a step's: its longest-serving
                          engine's seconds in it)
    per replica         = generation tokens / the replica-seconds (each engine's served seconds summed:
                          an engine that started or stopped inside a step served part of it)
    tokens per dollar   = generation tokens / (replica-seconds / 3600 x price per hour)
    peak                = the step with the most output tokens/s per replica
    ratio               = that peak / the baseline's capacity (output tokens/s of one tuned server)
    TTFT, TPOT          = Prometheus's histogram_quantile at the SLA's percentile, in ms
    error rate          = Triton's failed / (succeeded + failed) of the model (None: not scraped)
    a step over the SLA = tuner.score.check_token_sla of its TTFT, TPOT and error rate (a step
                          without a finished request is not judged)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from tuner.production._figures import SECONDS
from tuner.score import check_token_sla
from tuner.settings import SlaSettings

__all__ = ["EngineSeries", "EngineTotals", "engine_steps", "engine_totals", "over_sla"]


@dataclass(frozen=True, kw_only=True)
class EngineSeries:
    """vLLM's figures of one model over a window, per step (index `end`: the step's end, UTC)."""

    counters: pd.DataFrame  # index (end, instance); ENGINE_COUNTERS' columns (increases) and SECONDS served
    gauges: pd.DataFrame  # index (end, instance); kv_cache/running/waiting _max and _mean
    errors: pd.DataFrame  # index (end, instance); succeeded, failed (Triton's); empty when not scraped
    quantiles: pd.DataFrame  # index end; ttft_s, tpot_s, e2e_s at the percentile (NaN: no observation)
    window: dict[str, float]  # ttft_s, tpot_s, e2e_s at the percentile over the whole window
    tpot_metric: str | None  # the histogram TPOT was read from (None: none of TPOT's)
    ends: pd.DatetimeIndex  # every step's end in the window, with samples or not
    resets: dict[str, int]  # instance -> resets of vllm:generation_tokens (engine restarts)

    @property
    def gaps(self) -> pd.DatetimeIndex:
        """The steps in which no instance has two samples of the engine's counters."""
        return self.ends.difference(self.counters.index.get_level_values("end").unique())


@dataclass(frozen=True, kw_only=True)
class EngineTotals:
    """The figures of the whole window (None: nothing to divide by, or not reported)."""

    seconds: float  # the steps with samples
    replicas: float  # engines serving, on average over `seconds`
    generation_tokens: float
    prompt_tokens: float
    requests: float  # finished (vLLM's request_success)
    preemptions: float
    output_tokens_per_s: float  # all replicas together
    per_replica_output_tokens_per_s: float
    peak_output_tokens_per_s: float | None  # per replica, in the busiest step
    peak_step: pd.Timestamp | None  # that step's start
    tokens_per_dollar: float | None  # output tokens per dollar of the replicas' time
    ttft_ms: float | None  # at the SLA's percentile over the window
    tpot_ms: float | None
    e2e_ms: float | None = None
    error_rate: float | None
    kv_cache_peak: float | None  # the highest use of any engine's KV cache (0-1)
    kv_cache_mean: float | None
    running_max: float | None  # requests in one engine's batch, at most
    waiting_max: float | None  # requests waiting in one engine, at most
    waiting_mean: float | None

    def as_dict(self) -> dict:
        """The figures as a plain dict (what --json writes)."""
        out = dict(self.__dict__)
        out["peak_step"] = None if self.peak_step is None else self.peak_step.strftime("%Y-%m-%dT%H:%M:%SZ")
        return out


def _value(x) -> float | None:
    return None if x is None or pd.isna(x) else float(x)


def engine_steps(series: EngineSeries, *, step_s: float) -> pd.DataFrame:
    """The figures of each step (all replicas), indexed by the step's start; every step of the window,
    NaN where nothing was sampled."""
    c, g, e = series.counters, series.gauges, series.errors
    sums = c.groupby(level="end").sum().reindex(series.ends)
    seconds = c.groupby(level="end")[SECONDS].max().reindex(series.ends)
    out = pd.DataFrame(index=series.ends)
    out["replicas"] = sums[SECONDS] / seconds
    out["output_tokens_per_s"] = sums["generation_tokens"] / seconds
    out["per_replica_output_tokens_per_s"] = sums["generation_tokens"] / sums[SECONDS]
    out["prompt_tokens_per_s"] = sums["prompt_tokens"] / seconds
    out["requests"] = sums["requests"]
    out["preemptions"] = sums["preemptions"]
    out["ttft_ms"] = series.quantiles["ttft_s"] * 1000
    out["tpot_ms"] = series.quantiles["tpot_s"] * 1000
    out["e2e_ms"] = series.quantiles["e2e_s"] * 1000 if "e2e_s" in series.quantiles else np.nan
    if len(e):
        errors = e.groupby(level="end").sum().reindex(series.ends)
        asked = errors["succeeded"] + errors["failed"]
        out["error_rate"] = errors["failed"] / asked.where(asked > 0)
    else:
        out["error_rate"] = np.nan
    for name in ("kv_cache", "running", "waiting"):
        for how in ("max", "mean"):
            column = f"{name}_{how}"
            values = g[column].groupby(level="end") if column in g else None
            out[column] = np.nan if values is None else getattr(values, how)().reindex(series.ends)
    out.index = (out.index - pd.Timedelta(seconds=step_s)).rename("start")
    return out


def engine_totals(
    series: EngineSeries, steps: pd.DataFrame, *, price_per_hour: float
) -> EngineTotals:
    """The figures of the whole window from its series and steps (engine_steps)."""
    c = series.counters
    seconds, replica_seconds = float(c.groupby(level="end")[SECONDS].max().sum()), float(c[SECONDS].sum())
    sums = c.sum()
    tokens = float(sums.get("generation_tokens", 0.0))
    per_replica = steps["per_replica_output_tokens_per_s"].dropna()
    errors = series.errors.sum()
    asked = float(errors.get("succeeded", 0.0) + errors.get("failed", 0.0))
    dollars = replica_seconds / 3600 * price_per_hour
    return EngineTotals(
        seconds=seconds,
        replicas=replica_seconds / seconds if seconds else 0.0,
        generation_tokens=tokens,
        prompt_tokens=float(sums.get("prompt_tokens", 0.0)),
        requests=float(sums.get("requests", 0.0)),
        preemptions=float(sums.get("preemptions", 0.0)),
        output_tokens_per_s=tokens / seconds if seconds else 0.0,
        per_replica_output_tokens_per_s=tokens / replica_seconds if replica_seconds else 0.0,
        peak_output_tokens_per_s=float(per_replica.max()) if len(per_replica) else None,
        peak_step=per_replica.idxmax() if len(per_replica) else None,
        tokens_per_dollar=tokens / dollars if dollars > 0 else None,
        ttft_ms=_value(series.window.get("ttft_s", np.nan) * 1000),
        tpot_ms=_value(series.window.get("tpot_s", np.nan) * 1000),
        e2e_ms=_value(series.window.get("e2e_s", np.nan) * 1000),
        error_rate=float(errors["failed"]) / asked if asked > 0 else None,
        kv_cache_peak=_value(steps["kv_cache_max"].max()),
        kv_cache_mean=_value(series.gauges["kv_cache_mean"].mean()) if "kv_cache_mean" in series.gauges else None,
        running_max=_value(steps["running_max"].max()),
        waiting_max=_value(steps["waiting_max"].max()),
        waiting_mean=_value(series.gauges["waiting_mean"].mean()) if "waiting_mean" in series.gauges else None,
    )


def over_sla(steps: pd.DataFrame, sla: SlaSettings) -> pd.Series:
    """Why each step broke the token SLA ('' where it held), for the steps with finished requests."""
    reasons = {}
    for start, row in steps.iterrows():
        if not row["requests"] > 0:  # idle or unsampled: nothing to judge
            continue
        check = check_token_sla(
            ttft_ms=_value(row["ttft_ms"]),
            tpot_ms=_value(row["tpot_ms"]),
            e2e_ms=_value(row["e2e_ms"]),
            error_rate=0.0 if pd.isna(row["error_rate"]) else float(row["error_rate"]),
            sla=sla,
        )
        reasons[start] = check.reason
    return pd.Series(reasons, dtype=object).rename_axis("start")
