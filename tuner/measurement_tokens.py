"""One generative replay's measurement, from its per-request records (pure).

A generative replay (`tuner.replay.replay` against a model that takes `text_input`) streams each
traffic row as one request: a prompt of exactly its `prompt_tokens`, exactly its `output_tokens`
generated (`ignore_eos`). Its records give, per request, the due, send and end times, the first and
last token times, the tokens received and the gaps between token responses. Definitions:
- the measured window runs from `warmup_s` to the schedule's end (`duration_s`: the length the replay
  was asked to run, else the last due time), as `tuner.measurement` defines it; requests due in it are
  measured;
- TTFT (time to first token) = first streamed token - due time;
- TPOT (time per output token) = (last token - first token) / (output tokens - 1), for requests of
  two tokens or more;
- ITL (inter-token latency) = the gaps between successive streamed responses that carried tokens;
- end to end = last token - due time;
- percentiles are over the measured requests that succeeded (errors count in the error rate);
- output tokens per second = tokens streamed by the successful measured requests / (the last of their
  completions - window start), as `tuner.measurement` defines throughput; total tokens per second
  counts their prompt tokens too;
- goodput = successful measured requests whose own TTFT and TPOT meet every limit given
  (`ttft_ms`, `tpot_ms`; a one-token request has no TPOT and meets that limit, and so the SLA check,
  `tuner.score.check_tokens`, holds a window with no request of 2+ tokens to meet it), per second over
  the same span;
- offered tokens per second = the output tokens the measured requests asked for, per second of the
  window (their `output_tokens`, as `offered_rps` counts them);
- streamed tokens per second = the output tokens streamed during the measured window (its start to the
  schedule's end) by every request of the replay, the warm-up's included, per second of the window:
  the engine's output rate while the window's load was offered. The load runs from the replay's start
  to the window's end, so an engine that keeps up streams about what was offered over the window
  (lagged by a request's life, drawn partly from the warm-up's traffic); one that falls behind streams
  its own rate whatever was offered, while its queue grows. Each response carries its request's tokens
  / its responses; a request's responses arrive at its first token and then after each gap of `itl_ms`.
  Over a window shorter than WINDOW_LIVES requests' lives it reads low (`short_window`);
- busy seconds = the union of the measured requests' spans (due time to last response): the seconds
  the engine held at least one of them. A continuous-batching engine steps exactly while it holds a
  request, and vLLM reports no busy-time counter of its own, so this is the engine's busy time at the
  recorded load (what tokens per dollar by utilization divides by);
- a replay cut at its window's end (the engine had fallen behind it: `tuner.replay.replay`'s
  `cut_below_tokens_per_s`) leaves the requests still open there without an end: they count as offered,
  not as errors, and their latencies (unfinished) are in no percentile (`cut_requests`); the streamed
  rate counts only the window's own seconds, which the cut leaves whole;
- valid unless the send lag p99 exceeded its budget (the load generator was the bottleneck) or no
  request was due in the window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tuner.measurement import Served, percentile_key, percentiles, send_lag_figures

__all__ = ["PER_REQUEST", "RECORD_COLUMNS", "WINDOW_LIVES", "TokenMeasurement", "measure_tokens", "short_window"]

# what measure_tokens reads of a generative replay's records (tuner.replay.ReplayResult.records)
PER_REQUEST = ("ttfts_ms", "tpots_ms", "itls_ms", "e2es_ms")  # TokenMeasurement's arrays: not figures
RECORD_COLUMNS = ("due_s", "end_s", "send_lag_ms", "ok", "prompt_tokens", "tokens", "first_token_s",
                  "last_token_s", "itl_ms")


# the streamed rate lags its window by a request's life (a request's tokens arrive until it ends): over a
# window shorter than this many lives it counts what the lighter traffic before the window asked for. The
# LLM quick start's engine, keeping up at 0.8x the recording, streamed 735 output tokens/s over 5-s
# windows of requests living 5-9 s, below the 854 the traffic offers on average; over 20-s windows
# 890-963 (docs/llm-tune.md)
WINDOW_LIVES = 2.0


def short_window(window_s: float, *, life_s: float | None) -> bool:
    """Whether a window of `window_s` seconds is too short for its streamed rate: under WINDOW_LIVES
    times a request's mean life end to end (`life_s`; unknown or 0: not short)."""
    return bool(life_s) and window_s < WINDOW_LIVES * life_s


@dataclass(frozen=True, kw_only=True)
class TokenMeasurement(Served):
    """One generative replay's figures over its measured window (see the module doc); throughput_rps
    counts successful requests."""

    output_tokens: int                # streamed by the successful measured requests
    prompt_tokens: int                # their prompts
    output_tokens_per_s: float
    total_tokens_per_s: float         # prompt + output tokens per second
    ttft_ms: dict[str, float]         # p50, p90, p95, p99, max (and the SLA's percentile)
    tpot_ms: dict[str, float]
    itl_ms: dict[str, float]
    e2e_ms: dict[str, float]
    goodput_rps: float                # successful requests meeting every limit, per second
    good_requests: int
    ttft_limit_ms: float | None = None
    tpot_limit_ms: float | None = None
    e2e_limit_ms: float | None = None
    sla_percentile: float = 99.0
    send_lag_ms: dict[str, float] = field(default_factory=dict)  # p50, p99, max
    valid: bool = True
    invalid_reason: str = ""
    busy_s: float = 0.0               # seconds the engine held a measured request (see the module doc)
    offered_tokens_per_s: float = float("nan")   # output tokens asked for by the window's requests, per second
    streamed_tokens_per_s: float = float("nan")  # the engine's output rate over the window (the module doc)
    load_generator_cpu: float = 0.0   # CPU seconds used by the load generator per wall second
    workers: int = 1                  # load-generator processes used
    cut_requests: int = 0             # measured requests still open when the replay cut its streams
    attempts: int = 1                 # replays run to get a valid one (the retry policy's count)
    repeats: int = 1                  # never repeated near the SLA's limit (tuner.trial.step's repeats: latency)
    # the engine's own view of the replay, where a trial watched it (tuner.llm.engine_watch.batch_figures:
    # preemptions, peaks of running / waiting sequences and KV-cache use, an emulated GPU's overrun share)
    engine: dict[str, float] = field(default_factory=dict)
    # per successful measured request (for CDFs and means; PER_REQUEST); not part of the figures
    ttfts_ms: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False, compare=False)
    tpots_ms: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False, compare=False)
    itls_ms: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False, compare=False)  # every gap
    e2es_ms: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False, compare=False)

    def ttft(self, percentile: float) -> float:
        """TTFT at a kept percentile (p50/p90/p95/p99/max, and the SLA's)."""
        return _at(self.ttft_ms, percentile, "TTFT")

    def tpot(self, percentile: float) -> float:
        """TPOT at a kept percentile (p50/p90/p95/p99/max, and the SLA's)."""
        return _at(self.tpot_ms, percentile, "TPOT")

    def e2e(self, percentile: float) -> float:
        """End to end (due time to the last token) at a kept percentile."""
        return _at(self.e2e_ms, percentile, "end-to-end time")


def measure_tokens(records: pd.DataFrame, *, speed: float, warmup_s: float, lag_budget_ms: float,
                   sla_percentile: float = 99.0, ttft_ms: float | None = None, tpot_ms: float | None = None,
                   e2e_ms: float | None = None, load_generator_cpu: float = 0.0, workers: int = 1,
                   duration_s: float | None = None) -> TokenMeasurement:
    """The figures of a generative replay's `records` (RECORD_COLUMNS, one row per request of the
    whole schedule, warm-up included). `ttft_ms` / `tpot_ms` / `e2e_ms`: the SLA's limits goodput counts
    against (None: no such limit); `duration_s`: the schedule's length, where the measured window ends
    (`ReplayResult.duration_s`; default: the last due time)."""
    missing = [c for c in RECORD_COLUMNS if c not in records.columns]
    if missing:
        raise ValueError(f"not the records of a generative replay: no {', '.join(missing)}")
    end = float(records["due_s"].max()) if duration_s is None and len(records) else float(duration_s or 0.0)
    window = records[records["due_s"].to_numpy(dtype=float) >= warmup_s]
    cut = window["cut"].to_numpy(dtype=bool) if "cut" in window.columns else np.zeros(len(window), dtype=bool)
    good = window[window["ok"].to_numpy(dtype=bool)]
    due = good["due_s"].to_numpy(dtype=float)
    first = good["first_token_s"].to_numpy(dtype=float)
    last = good["last_token_s"].to_numpy(dtype=float)
    tokens = good["tokens"].to_numpy(dtype=np.int64)
    ttft = (first - due) * 1000.0
    several = tokens >= 2
    tpot_all = np.full(len(good), np.nan)
    tpot_all[several] = (last[several] - first[several]) / (tokens[several] - 1) * 1000.0
    itl = [np.asarray(v, dtype=float) for v in good["itl_ms"]]
    itl = np.concatenate(itl) if itl else np.empty(0)

    meets = np.ones(len(good), dtype=bool)
    if ttft_ms is not None:
        meets &= ttft <= ttft_ms
    if tpot_ms is not None:
        meets &= ~several | (tpot_all <= tpot_ms)
    if e2e_ms is not None:
        meets &= (last - due) * 1000.0 <= e2e_ms

    span = max(end - warmup_s, 0.0)
    served_span = float(good["end_s"].max()) - warmup_s if len(good) else 0.0
    per_s = 1.0 / served_span if served_span > 0 else 0.0
    requests = len(window)
    out_tokens = int(tokens.sum())
    in_tokens = int(good["prompt_tokens"].to_numpy(dtype=np.int64).sum())

    send_lag, lag_reason = send_lag_figures(window["send_lag_ms"].to_numpy(dtype=float), lag_budget_ms)
    reasons = [f"no requests due in the measured window (after the {warmup_s:g} s warm-up)"] if not requests else []
    if lag_reason:
        reasons.append(lag_reason)
    tpots = tpot_all[several]
    e2e = (last - due) * 1000.0
    return TokenMeasurement(
        speed=speed, offered_rps=requests / span if span > 0 else 0.0, duration_s=span, requests=requests,
        errors=requests - len(good) - int(cut.sum()),
        error_rate=(requests - len(good) - int(cut.sum())) / requests if requests else 0.0,
        throughput_rps=len(good) * per_s, output_tokens=out_tokens, prompt_tokens=in_tokens,
        output_tokens_per_s=out_tokens * per_s, total_tokens_per_s=(out_tokens + in_tokens) * per_s,
        ttft_ms=percentiles(ttft, sla_percentile=sla_percentile),
        tpot_ms=percentiles(tpots, sla_percentile=sla_percentile),
        itl_ms=percentiles(itl, sla_percentile=sla_percentile),
        e2e_ms=percentiles(e2e, sla_percentile=sla_percentile),
        goodput_rps=int(meets.sum()) * per_s, good_requests=int(meets.sum()),
        ttft_limit_ms=ttft_ms, tpot_limit_ms=tpot_ms, e2e_limit_ms=e2e_ms, sla_percentile=sla_percentile,
        send_lag_ms=send_lag, streamed_tokens_per_s=_streamed_per_s(records, warmup_s, end),
        offered_tokens_per_s=_asked(window) / span if span > 0 else float("nan"),
        busy_s=_busy_s(window["due_s"].to_numpy(dtype=float), window["end_s"].to_numpy(dtype=float)),
        valid=not reasons, invalid_reason="; ".join(reasons),
        load_generator_cpu=load_generator_cpu, workers=workers, cut_requests=int(cut.sum()), ttfts_ms=ttft, tpots_ms=tpots, itls_ms=itl,
        e2es_ms=e2e,
    )


def _asked(window: pd.DataFrame) -> float:
    # the output tokens asked for (`output_tokens`); records without them: what was received
    column = "output_tokens" if "output_tokens" in window.columns else "tokens"
    return float(window[column].to_numpy(dtype=float).sum())


def _streamed_per_s(records: pd.DataFrame, start: float, end: float) -> float:
    """Output tokens streamed between `start` and `end` (seconds of the schedule) by every request of
    `records`, per second; NaN for an empty window."""
    if end <= start:
        return float("nan")
    first = records["first_token_s"].to_numpy(dtype=float)
    tokens = records["tokens"].to_numpy(dtype=float)
    streamed = 0.0
    for k in np.flatnonzero(np.isfinite(first) & (tokens > 0)):
        # a response's arrival: the first token's, then after each gap between token responses
        times = first[k] + np.concatenate(([0.0], np.cumsum(np.asarray(records["itl_ms"].iloc[k], dtype=float)) / 1000.0))
        streamed += tokens[k] / len(times) * np.count_nonzero((times >= start) & (times < end))
    return streamed / (end - start)


def _busy_s(starts: np.ndarray, ends: np.ndarray) -> float:
    """The length of the union of the spans [starts, ends] (seconds)."""
    keep = np.isfinite(starts) & np.isfinite(ends) & (ends > starts)
    if not keep.any():
        return 0.0
    order = np.argsort(starts[keep], kind="stable")
    start, end = starts[keep][order], ends[keep][order]
    reach = np.maximum.accumulate(end)  # the furthest end so far: a span starting past it opens a new run
    new_run = np.concatenate([[True], start[1:] > reach[:-1]])
    run_end = np.maximum.reduceat(end, np.flatnonzero(new_run))
    return float((run_end - start[new_run]).sum())


def _at(figures: dict[str, float], percentile: float, what: str) -> float:
    key = percentile_key(percentile)
    if key not in figures:
        raise KeyError(f"{what} percentile {key} was not measured")
    return figures[key]
