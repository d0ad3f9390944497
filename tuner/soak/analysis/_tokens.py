"""A generative soak's window (pure): a vLLM-served model, measured in tokens, and what its findings
read.

vLLM batches inside its engine (continuous batching): Triton sees one streamed request at a time, so
the encoder's window figures that come from Triton's batcher (batch sizes, compute time per execution
and per request, fill rate, the largest batch still succeeding, the capacity projected from compute
time) are not measured for it (`NOT_MEASURED`). A window is one streamed replay
(`tuner.trial.generate.replay_generate`), measured by the replay from each request's due time
(`tuner.measurement_tokens`: TTFT and TPOT percentiles, output tokens per second, errors, the token
SLA) and by the engine over the same replay, from vLLM's own series on Triton's `/metrics`
(`tuner.llm.engine_metrics`): the requests, prompt and generated tokens and preemptions it counted
between the snapshots before and after the window, and its gauges (KV-cache use, sequences running
and waiting) sampled during the window: their peak, their mean over the samples, their value at the
window's end (an engine that finished every request reads 0 there: the peak is the figure that moves).

The `latency_*` columns are end to end (due time to the last token), as a generative trial's figures
keep them. The load covariate of the trend test is the offered tokens per second (prompt + output of
the requests due in the measured window): a window of long prompts fills the KV cache that a window
of as many short ones does not. Preemptions are trended per request the engine finished, not per
window (the last window takes the remainder of the soak and may be longer).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from tuner.llm.engine_metrics import EngineFigures
from tuner.measurement import PERCENTILES
from tuner.measurement_tokens import TokenMeasurement
from tuner.soak.analysis._windows import latency_column
from tuner.traffic import due_offsets

UNIT = "tokens"          # soak.json's `unit` for a generative soak (an encoder's soak has none: requests)
LOAD = "offered_tokens_per_s"
NOT_MEASURED = ("Triton's batch sizes, compute time per execution and per request, fill rate and the largest "
                "batch still succeeding are not measured for a vLLM-served model (vLLM batches inside its "
                "engine; Triton sees one request at a time): no batch table, no capacity projection from "
                "compute time")
GAUGES = ("kv_cache_usage", "running", "waiting")  # EngineFigures' gauge fields, sampled in each window


def is_tokens(meta: Mapping | None) -> bool:
    """True for the soak.json of a generative soak (a vLLM-served model, measured in tokens)."""
    return (meta or {}).get("unit") == UNIT


def ttft_column(percentile: float) -> str:
    """The windows.csv column of TTFT at a percentile (`ttft_p99_ms`; 100: `ttft_max_ms`)."""
    return "ttft_max_ms" if percentile >= 100 else f"ttft_p{percentile:g}_ms"


def tpot_column(percentile: float) -> str:
    """The windows.csv column of TPOT at a percentile (`tpot_p99_ms`; 100: `tpot_max_ms`)."""
    return "tpot_max_ms" if percentile >= 100 else f"tpot_p{percentile:g}_ms"


def trend_figures(sla: Mapping) -> tuple[str, ...]:
    """The figures a generative soak's trend test runs on: TTFT and TPOT (the SLA's percentile and the
    median), end to end where the SLA limits it, errors, the engine's KV-cache use (peak and mean over
    each window), its preemptions per finished request, and the server's memory."""
    pct = float(sla.get("percentile", 99))
    e2e = (latency_column(pct),) if sla.get("e2e_ms") is not None else ()
    return tuple(dict.fromkeys((ttft_column(pct), "ttft_p50_ms", tpot_column(pct), "tpot_p50_ms", *e2e, "error_rate",
                                "kv_cache_usage_peak", "kv_cache_usage_mean", "preemptions_per_request",
                                "memory_mb")))


def sla_limits(sla: Mapping) -> dict[str, float]:
    """{column: limit} of the token SLA: TTFT, TPOT and/or end to end (the `latency_*` column) at its
    percentile."""
    pct = float(sla.get("percentile", 99))
    out = {}
    for column, key in ((ttft_column(pct), "ttft_ms"), (tpot_column(pct), "tpot_ms"), (latency_column(pct), "e2e_ms")):
        if sla.get(key) is not None:
            out[column] = float(sla[key])
    return out


def broken_figure(row: Mapping, sla: Mapping) -> tuple[str, float]:
    """The figure (and its limit) by which a window broke the token SLA: the error rate, else the first
    figure over its limit, else the first one none of which was measured (no token came back); the first
    limited one when none reads over. A TPOT missing beside a measured TTFT is a window of one-token
    requests, which meets the TPOT limit (`tuner.score.check_token_sla`): never the one named."""
    max_errors = float(sla.get("max_error_rate", 0.0))
    if float(row.get("error_rate", 0.0)) > max_errors:
        return "error_rate", max_errors
    limits = sla_limits(sla)
    values = {column: _figure(row, column) for column in limits}
    over = [(column, limit) for column, limit in limits.items() if values[column] > limit]  # NaN is never over
    if over:
        return over[0]
    pct = float(sla.get("percentile", 99))
    tokens_came = math.isfinite(_figure(row, ttft_column(pct)))
    missing = [(column, limit) for column, limit in limits.items() if not math.isfinite(values[column])
               and not (column == tpot_column(pct) and tokens_came)]
    return next(iter(missing or limits.items()), ("error_rate", max_errors))


def _figure(row: Mapping, column: str) -> float:
    try:
        return float(row.get(column))
    except (TypeError, ValueError):
        return math.nan


def gauge_figures(samples: Sequence[Mapping[str, float]], end: EngineFigures | None) -> dict[str, float]:
    """The engine's gauges over a window: peak and mean of the samples taken during it (the value at
    the window's end counted as one more sample), and the value at the end."""
    out: dict[str, float] = {}
    for gauge in GAUGES:
        values = [float(s[gauge]) for s in samples if math.isfinite(float(s.get(gauge, math.nan)))]
        last = float(getattr(end, gauge)) if end is not None else math.nan
        if math.isfinite(last):
            values.append(last)
        out[f"{gauge}_peak"] = max(values) if values else math.nan
        out[f"{gauge}_mean"] = float(np.mean(values)) if values else math.nan
        out[f"{gauge}_end"] = last
    out["engine_samples"] = len(samples)
    return out


def offered_tokens_per_s(part: pd.DataFrame, *, speed: float, warmup_s: float, duration_s: float) -> float:
    """Prompt + output tokens of the requests due in the measured window (from `warmup_s`, replayed at
    `speed`) per second of it; NaN when the window has no length."""
    if duration_s <= 0 or part.empty:
        return math.nan
    due = due_offsets(part, speed)
    keep = due >= warmup_s
    tokens = part["prompt_tokens"].to_numpy(dtype=np.int64)[keep].sum() + \
        part["output_tokens"].to_numpy(dtype=np.int64)[keep].sum()
    return float(tokens) / duration_s


def window_row(m: TokenMeasurement, *, sla_ok: bool, sla_reason: str, engine: EngineFigures | None,
               gauges: Mapping[str, float], sent_output_tokens: int, offered_tokens: float,
               memory: Mapping[str, float | str], first_error: str = "") -> dict:
    """The figures of one generative window (without its place in the soak: the caller adds window,
    hours, ...). `engine`: vLLM's counters over the window (None: the server reports none);
    `sent_output_tokens`: the tokens the replay received over the whole window, warm-up included (what
    the engine's generated-token counter counts too)."""
    row: dict = {
        "requests": m.requests,
        "offered_rps": m.offered_rps,
        LOAD: offered_tokens,
        "throughput_rps": m.throughput_rps,
        "errors": m.errors,
        "error_rate": m.error_rate,
        "output_tokens": m.output_tokens,
        "prompt_tokens": m.prompt_tokens,
        "output_tokens_per_s": m.output_tokens_per_s,
        "total_tokens_per_s": m.total_tokens_per_s,
        "goodput_rps": m.goodput_rps,
    }
    for name, figures in (("ttft", m.ttft_ms), ("tpot", m.tpot_ms), ("latency", m.e2e_ms)):
        for key, value in figures.items():
            row[f"{name}_{key}_ms"] = value
    row.update({
        "send_lag_p99_ms": m.send_lag_ms.get("p99", math.nan),
        "valid": bool(m.valid),
        "sla_ok": bool(sla_ok),
        "sla_reason": sla_reason,
        "sent_output_tokens": int(sent_output_tokens),
    })
    counted = {"engine_requests": math.nan, "engine_prompt_tokens": math.nan, "engine_generation_tokens": math.nan,
               "preemptions": math.nan}
    if engine is not None:
        counted = {"engine_requests": int(round(engine.requests)), "engine_prompt_tokens": int(round(engine.prompt_tokens)),
                   "engine_generation_tokens": int(round(engine.generation_tokens)),
                   "preemptions": int(round(engine.preemptions))}
    row.update(counted)
    finished = counted["engine_requests"]
    row["preemptions_per_request"] = (counted["preemptions"] / finished
                                      if isinstance(finished, int) and finished > 0 else math.nan)
    # an emulated GPU's (llm_sim) steps the CPU ran past their time, as a share (NaN: a real engine)
    row["emulated_overrun_share"] = engine.overrun_share if engine is not None else math.nan
    row.update(gauges)
    row.update(memory)
    row["first_error"] = first_error
    return row


def window_columns(sla_percentile: float, place: Sequence[str], memory: Mapping[str, float | str]) -> list[str]:
    """Every column of a generative soak's windows.csv, in order (`place`: where a window sits;
    `memory`: the memory columns, empty)."""
    pcts = dict.fromkeys([*(f"p{q}" for q in PERCENTILES),
                          *([] if sla_percentile >= 100 else [f"p{sla_percentile:g}"]), "max"])
    empty = TokenMeasurement(speed=1.0, offered_rps=0.0, duration_s=0.0, requests=0, errors=0, error_rate=0.0,
                             throughput_rps=0.0, output_tokens=0, prompt_tokens=0, output_tokens_per_s=0.0,
                             total_tokens_per_s=0.0, ttft_ms=dict.fromkeys(pcts, math.nan),
                             tpot_ms=dict.fromkeys(pcts, math.nan), itl_ms={}, e2e_ms=dict.fromkeys(pcts, math.nan),
                             goodput_rps=0.0, good_requests=0)
    figures = window_row(empty, sla_ok=True, sla_reason="", engine=None, gauges=gauge_figures([], None),
                         sent_output_tokens=0, offered_tokens=math.nan, memory=memory)
    return [*place, *figures, "wall_s"]


def engine_table(windows: pd.DataFrame) -> pd.DataFrame:
    """What the engine's own statistics did over the soak, one row per figure: the first and the last
    window's value, the largest, and the total where it is a count."""
    rows = []
    for column, what, total in (("preemptions", "preemptions in the window", True),
                                ("kv_cache_usage_peak", "KV-cache use, peak in the window (1 = full)", False),
                                ("kv_cache_usage_mean", "KV-cache use, mean in the window", False),
                                ("running_peak", "sequences running, peak", False),
                                ("waiting_peak", "sequences waiting, peak", False),
                                ("emulated_overrun_share", "emulated GPU: steps run late, share", False)):
        if column not in windows.columns:
            continue
        values = pd.to_numeric(windows[column], errors="coerce")
        if not np.isfinite(values).any():
            continue
        rows.append({"figure": column, "what": what, "first window": float(values.iloc[0]),
                     "last window": float(values.iloc[-1]), "largest": float(values.max()),
                     "total": float(values.sum()) if total else math.nan})
    return pd.DataFrame(rows)
