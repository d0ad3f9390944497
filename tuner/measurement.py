"""One replay's measurement, from per-request records and Triton's statistics deltas (pure).

The dataclass is the contract the score, the capacity search and the trial read; `measure()` fills it
from a replay's records (`tuner.replay.ReplayResult.records`) and two snapshots of the model's Triton
statistics, through `assemble`, the one construction the simulation's replays go through too.

Definitions used here:
- the measured window runs from `warmup_s` to the schedule's end: the length the replay was asked to
  run (`ReplayResult.duration_s`: a step's length at its speed, a `--duration`), else the last due
  time; requests due in it are measured, and the offered rate is theirs per second of it (a sparse
  window's last request may be due well before its end);
- latency percentiles are over the measured requests that succeeded, from their due times (errors
  are counted in the error rate, not in the latency);
- throughput = successful measured requests / (last of their completions - window start), so a server
  that falls behind shows a throughput below the offered rate;
- busy seconds and compute time per execution come from `batch_stats` (one entry per execution):
  `inference_stats.compute_*` charges every request of a batch the whole batch's time, so summing it
  would count a batch of 8 eight times;
- the mean batch size (and the fill rate) is the `batch_stats` histogram's own mean, rows executed /
  executions (`rows_executed`): Triton's `execution_count` counts every execution, the failed ones too,
  while its `inference_count` counts only the rows that succeeded, so their ratio falls below 1 on a
  model that fails some of its executions, and disagrees with the histogram printed beside it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tuner.formats import first_line


@dataclass(frozen=True, kw_only=True)
class Served:
    """The load a replay offered over its measured window (warm-up excluded) and what came back: the
    figures every measurement begins with, a generative replay's (`TokenMeasurement`) too."""

    speed: float                    # replay speed s
    offered_rps: float              # requests due per second in the measured window
    duration_s: float               # length of the measured window
    requests: int                   # requests due in the measured window
    errors: int
    error_rate: float
    throughput_rps: float           # successful responses per second


@dataclass(frozen=True, kw_only=True)
class Measurement(Served):
    """One replay's figures over its measured window, with Triton's statistics deltas over it."""

    latency_ms: dict[str, float]    # p50, p90, p95, p99, max: from the due time
    send_lag_ms: dict[str, float]   # p50, p99
    valid: bool                     # False when send lag p99 exceeded the budget
    invalid_reason: str = ""
    # Triton's statistics deltas over the same window
    inference_count: int = 0
    execution_count: int = 0
    fill_rate: float = 0.0          # mean_batch_size / max_batch_size
    mean_batch_size: float = 0.0    # the histogram's: rows executed / executions (failed ones included)
    batch_histogram: dict[int, int] = field(default_factory=dict)  # batch size -> executions
    queue_ms_mean: float = 0.0
    compute_ms_mean: float = 0.0    # per execution: input + infer + output
    busy_s: float = 0.0             # model execution time (compute_input + compute_infer + compute_output), at most the replay's
    max_batch_size: int = 0
    load_generator_cpu: float = 0.0  # CPU seconds used by the load generator per wall second
    workers: int = 1                 # Locust processes used
    attempts: int = 1                # replays run for this measurement (retries after a broken lag budget)
    repeats: int = 1                 # valid replays it took near the SLA's limit (the median one is this)
    first_error: str = ""            # the first failed request's error in the window, as the replay recorded it
    # every successful request's latency in the measured window (for CDFs); not part of the figures
    latencies_ms: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False, compare=False)

    def latency(self, percentile: float) -> float:
        """The latency at a percentile the SLA names (p50/p90/p95/p99/max are kept)."""
        key = percentile_key(percentile)
        if key not in self.latency_ms:
            raise KeyError(f"latency percentile {key} was not measured")
        return self.latency_ms[key]


__all__ = ["PERCENTILES", "Measurement", "Served", "assemble", "error_line", "measure", "percentile_key", "percentiles",
           "rows_executed", "send_lag_figures", "stat_deltas"]

PERCENTILES = (50, 90, 95, 99)
_COMPUTE = ("compute_input", "compute_infer", "compute_output")


def measure(
    records: pd.DataFrame,
    stats_before: dict | None,
    stats_after: dict | None,
    *,
    speed: float,
    warmup_s: float,
    lag_budget_ms: float,
    max_batch_size: int,
    sla_percentile: float = 99.0,
    load_generator_cpu: float = 0.0,
    workers: int = 1,
    duration_s: float | None = None,
) -> Measurement:
    """One trial's figures. `records` needs columns due_s, end_s, latency_ms, send_lag_ms and ok (one
    row per request of the whole schedule, warm-up included); `duration_s` is the schedule's length,
    where the measured window ends (`ReplayResult.duration_s`; default: the last due time).
    Statistics are Triton's model entry (or the whole stats response)."""
    end = float(records["due_s"].max()) if duration_s is None and len(records) else float(duration_s or 0.0)
    window = records[records["due_s"] >= warmup_s]
    ok = window["ok"].to_numpy(dtype=bool)
    good = window[ok]
    failed = window.loc[~ok, "error"] if "error" in window else ()
    send_lag, lag_reason = send_lag_figures(window["send_lag_ms"].to_numpy(dtype=float), lag_budget_ms)
    if lag_reason and len(window) and not ok.any() and not any(str(e).startswith("not sent") for e in failed):
        # the server failed every request it was sent (a hung or broken server also slows the sending):
        # a miss of the SLA, whatever the lag, not a load generator's bottleneck to measure again
        lag_reason = ""
    deltas = stat_deltas(stats_before, stats_after)
    m = assemble(
        speed=speed, warmup_s=warmup_s, end_s=end, requests=len(window),
        latencies_ms=good["latency_ms"].to_numpy(dtype=float),
        last_done_s=float(good["end_s"].max()) if len(good) else warmup_s,
        send_lag_ms=send_lag, lag_reason=lag_reason,
        executions=deltas["execution_count"], inferences=deltas["inference_count"], histogram=deltas["histogram"],
        queue_ms_mean=deltas["queue_ns"] / deltas["queue_count"] / 1e6 if deltas["queue_count"] else 0.0,
        busy_s=deltas["busy_ns"] / 1e9, max_batch_size=max_batch_size, sla_percentile=sla_percentile,
        load_generator_cpu=load_generator_cpu, workers=workers,
        first_error=str(failed.iloc[0]) if len(failed) else "",
    )
    # the device's busy time: Triton sums the executions of every instance, which overlap where several
    # run at once, so the sum can pass the wall time they ran in; the time the device was busy cannot
    # (without each execution's start and end, which the statistics lack, the sum capped there)
    span = float(records["end_s"].max()) if len(records) else end
    return dataclasses.replace(m, busy_s=min(m.busy_s, span)) if span > 0 else m


def assemble(*, speed: float, warmup_s: float, end_s: float, requests: int, latencies_ms: np.ndarray,
             last_done_s: float, send_lag_ms: dict[str, float], executions: int, inferences: int,
             histogram: dict[int, int], queue_ms_mean: float, busy_s: float, max_batch_size: int,
             sla_percentile: float, lag_reason: str = "", load_generator_cpu: float = 0.0,
             workers: int = 1, first_error: str = "") -> Measurement:
    """The one construction of a Measurement from its counts over the measured window (`warmup_s` to
    `end_s`): `measure` fills it from a real replay, the simulation (`tuner.simulate`) from a
    simulated one, so both define every figure alike. `latencies_ms`: the successful requests', from
    their due times; `last_done_s`: when the last of them completed."""
    span = max(end_s - warmup_s, 0.0)
    served = len(latencies_ms)
    errors = requests - served
    reasons = [f"no requests due in the measured window (after the {warmup_s:g} s warm-up)"] if requests == 0 else []
    if lag_reason:
        reasons.append(lag_reason)
    served_span = last_done_s - warmup_s if served else 0.0
    batches = sum(histogram.values())
    mean_batch = rows_executed(histogram) / batches if batches else 0.0
    return Measurement(
        speed=speed,
        offered_rps=requests / span if span > 0 else 0.0,
        duration_s=span,
        requests=requests,
        errors=errors,
        error_rate=errors / requests if requests else 0.0,
        throughput_rps=served / served_span if served_span > 0 else 0.0,
        latency_ms=percentiles(latencies_ms, sla_percentile=sla_percentile),
        send_lag_ms=send_lag_ms,
        valid=not reasons,
        invalid_reason="; ".join(reasons),
        inference_count=inferences,
        execution_count=executions,
        fill_rate=mean_batch / max_batch_size if max_batch_size > 0 else (1.0 if executions else 0.0),
        mean_batch_size=mean_batch,
        batch_histogram=dict(histogram),
        queue_ms_mean=queue_ms_mean,
        compute_ms_mean=busy_s / executions * 1e3 if executions else 0.0,
        busy_s=busy_s,
        max_batch_size=max_batch_size,
        load_generator_cpu=load_generator_cpu,
        workers=workers,
        first_error=first_error,
        latencies_ms=latencies_ms,
    )


def rows_executed(histogram: dict[int, int]) -> int:
    """The rows a histogram of executions by batch size ran: sum(size x executions), the failed ones'
    included (Triton's `inference_count` counts only those that succeeded)."""
    return sum(int(size) * int(count) for size, count in histogram.items())


def error_line(error: str, limit: int = 160) -> str:
    """A request's error as a line of a table or a message shows it: its first non-blank line, cut to
    `limit` characters (a Python-backend model's exception comes with its traceback after it)."""
    line = first_line(str(error))
    return line if len(line) <= limit else line[:limit - 3] + "..."


def send_lag_figures(lag_ms: np.ndarray, budget_ms: float) -> tuple[dict[str, float], str]:
    """The send lag's p50, p99 and max over a window's requests (those never sent, NaN, left out), and
    why the measurement is invalid when its p99 broke `budget_ms` ("" when it did not)."""
    lag = lag_ms[np.isfinite(lag_ms)]
    figures = {"p50": _pct(lag, 50), "p99": _pct(lag, 99), "max": float(lag.max()) if len(lag) else math.nan}
    if len(lag) and figures["p99"] > budget_ms:
        return figures, (f"send lag p99 {figures['p99']:.2f} ms > budget {budget_ms:g} ms: "
                         "the load generator was the bottleneck")
    return figures, ""


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else math.nan


def percentile_key(percentile: float) -> str:
    """The key of a percentile among the figures `percentiles` keeps: `p99`, `p99.9`; 100 is `max`
    (the one name of the slowest request, in every table, column and JSON)."""
    return "max" if percentile >= 100 else f"p{percentile:g}"


def percentiles(values: np.ndarray, *, sla_percentile: float) -> dict[str, float]:
    """p50, p90, p95, p99 and max of `values` (and the SLA's percentile when it is another); NaN
    when there are none."""
    out = {f"p{q}": _pct(values, q) for q in PERCENTILES}
    if sla_percentile < 100 and percentile_key(sla_percentile) not in out:
        out[percentile_key(sla_percentile)] = _pct(values, sla_percentile)
    out["max"] = float(values.max()) if len(values) else math.nan
    return out


def _model_entry(stats: dict | None) -> dict:
    if not stats:
        return {}
    if "model_stats" in stats:  # the whole `v2/models/<m>/stats` response
        entries = stats["model_stats"]
        return entries[0] if entries else {}
    return stats


def stat_deltas(before: dict | None, after: dict | None) -> dict:
    """after - before of the counters `measure` uses (gRPC's JSON gives int64 as strings: int())."""
    b, a = _model_entry(before), _model_entry(after)

    def get(entry: dict, *path: str) -> int:
        node = entry
        for part in path:
            if not isinstance(node, dict) or part not in node:
                return 0
            node = node[part]
        return int(node)

    def batches(entry: dict) -> dict[int, tuple[int, int]]:
        out = {}
        for item in entry.get("batch_stats", []) or []:
            ns = sum(get(item, name, "ns") for name in _COMPUTE)
            out[int(item["batch_size"])] = (get(item, "compute_infer", "count"), ns)
        return out

    bb, ab = batches(b), batches(a)
    histogram, histogram_ns, busy_ns = {}, {}, 0
    for size, (count, ns) in sorted(ab.items()):
        count0, ns0 = bb.get(size, (0, 0))
        if count - count0 > 0:
            histogram[size] = count - count0
            histogram_ns[size] = ns - ns0
        busy_ns += ns - ns0
    return {
        "inference_count": get(a, "inference_count") - get(b, "inference_count"),
        "execution_count": get(a, "execution_count") - get(b, "execution_count"),
        "queue_ns": get(a, "inference_stats", "queue", "ns") - get(b, "inference_stats", "queue", "ns"),
        "queue_count": (get(a, "inference_stats", "queue", "count")
                        - get(b, "inference_stats", "queue", "count")),
        "busy_ns": busy_ns,
        "fail_count": (get(a, "inference_stats", "fail", "count")  # requests Triton failed
                       - get(b, "inference_stats", "fail", "count")),
        "success_count": (get(a, "inference_stats", "success", "count")  # ... and those it served
                          - get(b, "inference_stats", "success", "count")),
        "histogram": histogram,           # batch size -> executions
        "histogram_ns": histogram_ns,     # batch size -> their compute time (input + infer + output)
    }
