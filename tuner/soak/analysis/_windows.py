"""One soak window's figures, from its measurement (pure): the row `windows.csv` gets, and the
window's executions by batch size, split into successes and failures.

Triton's `batch_stats` count every execution of a batch size, the failed ones included (an
execution that raised, as an out-of-memory does), while `inference_count` counts only the rows
that succeeded. The difference is the rows that failed in execution, but not which batches they
were in. They are assigned to the largest batches executed in the window, largest first: memory
grows with the batch, so an out-of-memory fails the largest batches and no smaller one (exact when
the rows of the window's batches have the same length; otherwise the failures are put on the
largest batches, where memory runs out first).

Compute time at a fixed batch mix (`compute_ms_fixed_mix`): what a request's compute would cost if
the window had run the soak's first window's batches, each size at this window's mean time per
execution of that size. Drift makes the same batch slower; this figure sees only that, not the mix of
batch sizes the load forms (bigger batches at a higher load cost less per request) nor failed
executions (an out-of-memory fails fast: counted, it would make a window look cheaper). Only sizes
that ran in both windows without a failure count:

    fixed_mix = C_ref * sum(w_s * t_s) / sum(w_s * t_ref_s)    over those sizes s

with `w_s` the first window's executions of size s, `t_s` and `t_ref_s` the mean compute time per
execution of size s in this window and in the first, and `C_ref` the first window's compute per request.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from tuner.measurement import PERCENTILES, Measurement, percentile_key, rows_executed

# an out-of-memory error as backends word it (CUDA, PyTorch's OutOfMemoryError, TensorRT, the emulation)
_OOM = re.compile(r"out of memory|outofmemory|\boom\b", re.IGNORECASE)

# the figures the trend test is run on (when measured): capacity-relevant, not driven by the load alone
TREND_FIGURES = ("compute_ms_fixed_mix", "compute_ms_per_request", "compute_ms_per_execution", "latency_p50_ms",
                 "latency_p99_ms", "error_rate", "memory_mb")
CAPACITY_FIGURE = "compute_ms_fixed_mix"  # the compute time the capacity projection scales by
_COMPUTE = ("compute_input", "compute_infer", "compute_output")


def latency_column(percentile: float) -> str:
    """The windows.csv column of a latency percentile (`latency_p99_ms`; 100: `latency_max_ms`)."""
    return f"latency_{percentile_key(percentile)}_ms"


def is_oom(error: str) -> bool:
    """True for an error text that says the device ran out of memory."""
    return bool(_OOM.search(error or ""))


def split_failures(histogram: dict[int, int], failed_rows: int) -> dict[int, tuple[int, int]]:
    """{batch size: (successes, failures)} of a window's executions, the `failed_rows` assigned to
    the largest batches first (see the module)."""
    left = max(int(failed_rows), 0)
    out = {}
    for size in sorted(histogram, reverse=True):
        count = int(histogram[size])
        failed = min(count, left // size) if size > 0 else 0
        left -= failed * size
        out[size] = (count - failed, failed)
    return dict(sorted(out.items()))


def size_times(before: dict | None, after: dict | None) -> dict[int, tuple[int, float]]:
    """{batch size: (executions, mean compute ms per execution)} between two snapshots of a model's
    Triton statistics (its `batch_stats`, failed executions included)."""
    def table(stats: dict | None) -> dict[int, tuple[int, int]]:
        out = {}
        for item in _entry(stats).get("batch_stats", []) or []:
            ns = sum(int((item.get(name) or {}).get("ns", 0)) for name in _COMPUTE)
            out[int(item["batch_size"])] = (int((item.get("compute_infer") or {}).get("count", 0)), ns)
        return out

    b, a = table(before), table(after)
    out = {}
    for size, (count, ns) in sorted(a.items()):
        c0, ns0 = b.get(size, (0, 0))
        if count - c0 > 0:
            out[size] = (count - c0, (ns - ns0) / (count - c0) / 1e6)
    return out


def _entry(stats: dict | None) -> dict:
    """The model's entry of a statistics response (or the entry itself)."""
    if not stats:
        return {}
    if "model_stats" in stats:
        return stats["model_stats"][0] if stats["model_stats"] else {}
    return stats


def fixed_mix(reference: dict[int, tuple[int, float]], current: dict[int, tuple[int, float]],
              failures: dict[int, int]) -> float:
    """Compute ms per request at the reference window's batch mix (see the module); NaN when no size
    ran in both without a failure."""
    rows = sum(size * count for size, (count, _) in reference.items())
    if not rows:
        return math.nan
    c_ref = sum(count * ms for count, ms in reference.values()) / rows
    shared = [s for s in reference if s in current and not failures.get(s)]
    den = sum(reference[s][0] * reference[s][1] for s in shared)
    if not shared or den <= 0:
        return math.nan
    return c_ref * sum(reference[s][0] * current[s][1] for s in shared) / den


def window_row(m: Measurement, errors: pd.Series, *, sla_percentile: float, sla_ok: bool,
               executions_since_load: int | None, memory: dict[str, float | str],
               fixed_mix_ms: float = math.nan) -> dict:
    """The figures of one window (without its place in the soak: the caller adds window, hours, ...).
    `errors` is the error text of every measured request ('' when it succeeded)."""
    rows_run = rows_executed(m.batch_histogram)
    failed_rows = max(rows_run - m.inference_count, 0)
    split = split_failures(m.batch_histogram, failed_rows)
    ok_sizes = [size for size, (ok, _) in split.items() if ok > 0]
    oom = int(errors.map(is_oom).sum()) if len(errors) else 0
    row = {
        "requests": m.requests,
        "offered_rps": m.offered_rps,
        "throughput_rps": m.throughput_rps,
        "errors": m.errors,
        "error_rate": m.error_rate,
        "oom_errors": oom,
        "oom_error_rate": oom / m.requests if m.requests else 0.0,
    }
    for q in (*PERCENTILES, 100):
        row[latency_column(q)] = m.latency_ms.get(percentile_key(q), math.nan)
    if latency_column(sla_percentile) not in row:
        row[latency_column(sla_percentile)] = m.latency_ms.get(percentile_key(sla_percentile), math.nan)
    row.update({
        "send_lag_p99_ms": m.send_lag_ms.get("p99", math.nan),
        "valid": bool(m.valid),
        "sla_ok": bool(sla_ok),
        "executions": m.execution_count,
        "rows_executed": rows_run,
        "failed_rows": failed_rows,
        "mean_batch_size": rows_run / m.execution_count if m.execution_count else math.nan,
        "fill_rate": m.fill_rate,
        "largest_batch": max(m.batch_histogram) if m.batch_histogram else math.nan,
        "largest_ok_batch": max(ok_sizes) if ok_sizes else math.nan,
        "queue_ms": m.queue_ms_mean,
        "compute_ms_per_execution": m.compute_ms_mean if m.execution_count else math.nan,
        "compute_ms_per_request": m.busy_s * 1000.0 / rows_run if rows_run else math.nan,
        "compute_ms_fixed_mix": fixed_mix_ms,
        "executions_since_load": math.nan if executions_since_load is None else int(executions_since_load),
        **memory,
    })
    return row


EXECUTION_COLUMNS = ["window", "size", "successes", "failures", "compute_ms"]


def execution_rows(window: int, histogram: dict[int, int], failed_rows: int,
                   *,
                   times: dict[int, tuple[int, float]] | None = None) -> list[dict]:
    """executions.csv rows of one window: one per batch size executed, with its mean compute time
    per execution (failed executions included)."""
    times = times or {}
    return [{"window": window, "size": size, "successes": ok, "failures": bad,
             "compute_ms": times.get(size, (0, math.nan))[1]}
            for size, (ok, bad) in split_failures(histogram, failed_rows).items()]


def memory_figures(*, rss_bytes: float | None, gpu_bytes: float | None) -> dict[str, float | str]:
    """The memory columns: `memory_mb` is the GPU memory used where there is a GPU, else the server
    processes' resident memory; `memory_source` says which."""
    rss = math.nan if rss_bytes is None else rss_bytes / 2**20
    gpu = math.nan if gpu_bytes is None else gpu_bytes / 2**20
    if np.isfinite(gpu):
        return {"memory_mb": gpu, "memory_source": "gpu", "rss_mb": rss, "gpu_memory_mb": gpu}
    if np.isfinite(rss):
        return {"memory_mb": rss, "memory_source": "rss", "rss_mb": rss, "gpu_memory_mb": gpu}
    return {"memory_mb": math.nan, "memory_source": "", "rss_mb": rss, "gpu_memory_mb": gpu}


# where a window sits in the soak (written before its figures)
PLACE_COLUMNS = ("window", "segment", "restarted", "t_hours", "age_hours", "start_hours", "end_hours",
                 "started_utc")


def window_columns(sla_percentile: float) -> list[str]:
    """Every column of windows.csv, in order (a window with nothing to replay leaves its figures empty)."""
    empty = Measurement(speed=1.0, offered_rps=0.0, duration_s=0.0, requests=0, errors=0, error_rate=0.0,
                        throughput_rps=0.0, latency_ms={}, send_lag_ms={}, valid=False)
    figures = window_row(empty, pd.Series(dtype=str), sla_percentile=sla_percentile, sla_ok=True,
                         executions_since_load=None, memory=memory_figures(rss_bytes=None, gpu_bytes=None))
    return [*PLACE_COLUMNS, *figures, "wall_s"]
