"""vLLM's own series of a generative model read from Prometheus, per step and over the window.

The series are those the llm_vllm template and NVIDIA's vLLM backend put on Triton's /metrics,
labelled `model` (tuner.llm.engine_metrics names them). A counter is matched with or without `_total`
(`vllm:num_preemptions` from the template, `vllm:num_preemptions_total` from prometheus_client):

    counters   sum by (instance) (increase(C[STEP]))                       at every step's end
    quantiles  histogram_quantile(q, sum by (le) (increase(H_bucket[STEP])))   every step, and the window
    gauges     max/avg by (instance) (max/avg_over_time(G[STEP]))           every step
    errors     Triton's own nv_inference_request_success / _failure of the model, when scraped

As in _series, a step where an instance has fewer than two samples has no point (a scrape gap), and
each point says the seconds of its step the engine served (`read_covered`: it started or stopped inside).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from tuner.production._client import Prometheus
from tuner.production._engine_figures import EngineSeries
from tuner.production._errors import NoSeriesError
from tuner.production._figures import SECONDS
from tuner.production._series import METRICS as TRITON
from tuner.production._series import _escape, _long, _times, covered_queries, read_covered
from tuner.production._window import promql_range

__all__ = ["ENGINE_COUNTERS", "engine_queries", "read_engine_series"]

# the frame's columns and vLLM's counters (family names: `_total` optional)
ENGINE_COUNTERS = {
    "generation_tokens": "vllm:generation_tokens",
    "prompt_tokens": "vllm:prompt_tokens",
    "requests": "vllm:request_success",
    "preemptions": "vllm:num_preemptions",
}
TTFT = ("vllm:time_to_first_token_seconds",)
# per request (last - first token) / (tokens - 1) first, as the replay's TPOT; else the gaps between tokens
TPOT = ("vllm:request_time_per_output_token_seconds", "vllm:time_per_output_token_seconds",
        "vllm:inter_token_latency_seconds")
E2E = ("vllm:e2e_request_latency_seconds",)  # arrival to the last token (sla.e2e_ms)
GAUGES = {"kv_cache": "vllm:kv_cache_usage_perc", "running": "vllm:num_requests_running",
          "waiting": "vllm:num_requests_waiting"}
ERRORS = {"succeeded": TRITON["succeeded"], "failed": TRITON["failed"]}


def engine_queries(window_s: float, *, step_s: float) -> int:
    """The queries read_engine_series asks: the models, the counters, the seconds each engine served,
    Triton's two, TTFT, TPOT and end to end (a step's and the window's), the gauges' max and mean, the
    restarts (a TPOT read from a fallback name asks two more)."""
    return (1 + len(ENGINE_COUNTERS) + covered_queries(window_s, step_s=step_s) + len(ERRORS) + 6
            + 2 * len(GAUGES) + 1)


def _name(metric: str, *, counter: bool = False) -> str:
    """A selector's name matcher: a counter with or without `_total`."""
    return f'__name__=~"{metric}(_total)?"' if counter else f'__name__="{metric}"'


def _quantile(q: float, histogram: str, *, labels: str, range_: str) -> str:
    """Prometheus's quantile of a histogram's observations in a range, every instance's together."""
    return f"histogram_quantile({q:g}, sum by (le) (increase({histogram}_bucket{{{labels}}}{range_})))"


def read_engine_series(
    prometheus: Prometheus,
    *,
    model: str,
    quantile: float,
    start: float,
    end: float,
    step_s: float,
    on_query: Callable[[str], None] | None = None,
) -> EngineSeries:
    """vLLM's series of `model` from `start` to `end` (Unix seconds) in steps of `step_s`, TTFT and
    TPOT at `quantile` (0-1): NoSeriesError when Prometheus has no vLLM series in the window, or none
    of this model."""
    say = on_query or (lambda _label: None)
    where = f"Prometheus {prometheus.url}"
    tokens = ENGINE_COUNTERS["generation_tokens"]
    say("models with vLLM metrics")
    models = prometheus.label_values("model", match=f"{{{_name(tokens, counter=True)}}}", start=start, end=end)
    if not models:
        raise NoSeriesError(
            f"{where}: no vLLM metrics ({tokens}) in the window: is Triton's metrics port scraped, and "
            "the model's engine metrics on (REPORT_CUSTOM_METRICS in its config.pbtxt)?"
        )
    if model not in models:
        raise NoSeriesError(
            f"{where}: model {model!r} has no vLLM series in the window (models with vLLM metrics: "
            f"{', '.join(sorted(models))})"
        )
    labels = f'model="{_escape(model)}"'
    range_ = promql_range(step_s)

    def steps(promql: str, column: str) -> pd.Series:
        return _long(prometheus.query_range(promql, start=start + step_s, end=end, step_s=step_s), column)

    frames = []
    for column, metric in ENGINE_COUNTERS.items():
        say(metric)
        frames.append(steps(f"sum by (instance) (increase({{{_name(metric, counter=True)},{labels}}}{range_}))",
                            column))
    counters = pd.concat(frames, axis=1).sort_index()
    counters = counters[counters["generation_tokens"].notna()].fillna(0.0)  # the steps with samples
    covered = read_covered(prometheus, series=f"{{{_name(tokens, counter=True)},{labels}}}", start=start, end=end,
                           step_s=step_s, on_query=say)
    counters[SECONDS] = covered.reindex(counters.index).fillna(step_s).clip(0.0, step_s)
    errors = []
    for column, metric in ERRORS.items():
        say(metric)
        errors.append(steps(f"sum by (instance) (increase({metric}{{{labels}}}{range_}))", column))
    gauges = []
    for column, metric in GAUGES.items():
        for how in ("max", "avg"):
            say(f"{metric} ({how})")
            gauges.append(steps(f"{how} by (instance) ({how}_over_time({metric}{{{labels}}}{range_}))",
                                f"{column}_{'mean' if how == 'avg' else how}"))
    ends = pd.DatetimeIndex(_times(np.arange(start + step_s, end + 1e-6, step_s)), name="end")
    quantiles, window, tpot_metric = {}, {}, None
    for column, names in (("ttft_s", TTFT), ("tpot_s", TPOT), ("e2e_s", E2E)):
        for name in names:
            say(name)
            per_step = prometheus.query_range(
                _quantile(quantile, name, labels=labels, range_=range_),
                start=start + step_s, end=end, step_s=step_s,
            )
            if per_step or name == names[-1]:
                break
        if column == "tpot_s" and per_step:
            tpot_metric = name
        say(f"{name} over the window")
        whole = prometheus.query(
            _quantile(quantile, name, labels=labels, range_=promql_range(end - start)), at=end
        )
        values = _long(per_step, column).droplevel("instance")
        quantiles[column] = values.groupby(level="end").first().reindex(ends)
        window[column] = float(whole[0]["value"][1]) if whole else float("nan")
    say("restarts")
    resets = prometheus.query(
        f"sum by (instance) (resets({{{_name(tokens, counter=True)},{labels}}}{promql_range(end - start)}))", at=end
    )
    return EngineSeries(
        counters=counters,
        gauges=pd.concat(gauges, axis=1).sort_index(),
        errors=pd.concat(errors, axis=1).sort_index().dropna(how="all").fillna(0.0),
        quantiles=pd.DataFrame(quantiles, index=ends),
        window=window,
        tpot_metric=tpot_metric,
        ends=ends,
        resets={r["metric"].get("instance", ""): int(float(r["value"][1])) for r in resets},
    )
