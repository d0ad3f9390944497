"""How tonight's traffic differs from the previous run's: rate, burstiness, request sizes (pure).

Burstiness is read two ways: the coefficient of variation of inter-arrival gaps (1 for Poisson
arrivals, above for bursts) and the peak-to-mean ratio of requests per second. Sizes are
`batch_size` and every shape column (e.g. `seq_len`): mean and p90, plus the Kolmogorov-Smirnov
distance between the two nights' distributions (0 identical, 1 disjoint). Traffic to a generative model
(`prompt_tokens`, `output_tokens`) also gives each token column's p50 and p99 and its tokens per second,
what a vLLM engine's batching answers to as much as the request rate.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tuner.traffic import BATCH_SIZE, describe, shape_columns
from tuner.traffic.io import TOKEN_COLUMNS


def profile(df: pd.DataFrame) -> dict[str, float]:
    """Summary figures of one validated traffic table, from `tuner.traffic.describe`."""
    d = describe(df)
    rate = d["mean_rps"]
    out: dict[str, float] = {
        "requests": float(d["requests"]),
        "duration_s": float(d["duration_s"]),
        "rate_rps": float(rate),
        "peak_rps_1s": float(d["peak_rps"]),
        "peak_to_mean": float(d["peak_rps"] / rate) if rate == rate and rate > 0 else float("nan"),
        "interarrival_cv": float(d["interarrival_cv"]),
    }
    for col, pct in d["sizes"].items():
        out[f"{col}_mean"] = float(pct["mean"])
        for q in ("p50", "p90", "p99") if col in TOKEN_COLUMNS else ("p90",):
            out[f"{col}_{q}"] = float(pct[q])
    for col, tokens in d.get("tokens", {}).items():  # a generative table's: prompt and output tokens
        if col in TOKEN_COLUMNS:
            out[f"{col}_per_s"] = float(tokens["per_s"])
    return out


def size_columns(df: pd.DataFrame) -> list[str]:
    """The traffic's size columns: `batch_size` and every shape column."""
    return [BATCH_SIZE, *shape_columns(df)]


def ks_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the two empirical CDFs."""
    a, b = np.sort(np.asarray(a, dtype=np.float64)), np.sort(np.asarray(b, dtype=np.float64))
    if len(a) == 0 or len(b) == 0:
        return float("nan")
    grid = np.concatenate([a, b])
    cdf_a = np.searchsorted(a, grid, side="right") / len(a)
    cdf_b = np.searchsorted(b, grid, side="right") / len(b)
    return float(np.abs(cdf_a - cdf_b).max())


# which figures can drift (requests and duration follow from the window asked for)
_COMPARED = ("rate_rps", "peak_rps_1s", "peak_to_mean", "interarrival_cv")
_COMPARED_SUFFIXES = ("_mean", "_p50", "_p90", "_p99", "_per_s")


def drift_table(previous: pd.DataFrame | None, current: pd.DataFrame, threshold: float = 0.2) -> pd.DataFrame:
    """One row per figure: previous, current, relative change, and whether it drifted.

    With no previous traffic (the first night) the previous column is empty and nothing drifts.
    """
    cur = profile(current)
    prev = profile(previous) if previous is not None else {}
    rows = []
    for name, value in cur.items():
        before = prev.get(name, float("nan"))
        compared = name in _COMPARED or name.endswith(_COMPARED_SUFFIXES)
        change = value / before - 1.0 if before == before and before not in (0.0,) else float("nan")
        rows.append({"metric": name, "previous": before, "current": value, "change": change,
                     "drift": bool(compared and change == change and abs(change) > threshold)})
    if previous is not None:
        for col in size_columns(current):
            if col in previous.columns:
                d = ks_distance(previous[col].to_numpy(), current[col].to_numpy())
                rows.append({"metric": f"{col}_ks", "previous": float("nan"), "current": d,
                             "change": float("nan"), "drift": bool(d > threshold)})
    return pd.DataFrame(rows, columns=["metric", "previous", "current", "change", "drift"])


def drifted(table: pd.DataFrame) -> list[str]:
    """The names of the figures the drift table flags as drifted."""
    return [str(m) for m in table.loc[table["drift"], "metric"]]


def format_drift(table: pd.DataFrame) -> str:
    """Aligned text (also valid inside a Markdown code block)."""
    shown = table.copy()
    shown["previous"] = shown["previous"].map(_num)
    shown["current"] = shown["current"].map(_num)
    shown["change"] = shown["change"].map(lambda c: "" if c != c else f"{c:+.0%}")
    shown["drift"] = shown["drift"].map(lambda d: "DRIFT" if d else "")
    return shown.to_string(index=False)


def to_markdown(table: pd.DataFrame) -> str:
    """The drift table as a Markdown table, drifted figures in bold."""
    lines = ["| metric | previous | current | change | drift |", "|---|---:|---:|---:|---|"]
    for r in table.itertuples(index=False):
        change = "" if r.change != r.change else f"{r.change:+.0%}"
        lines.append(f"| {r.metric} | {_num(r.previous)} | {_num(r.current)} | {change} | "
                     f"{'**drift**' if r.drift else ''} |")
    return "\n".join(lines)


def _num(value: float) -> str:
    if value != value:
        return "-"
    if float(value).is_integer() and abs(value) >= 10:
        return f"{value:,.0f}"
    return f"{value:.3g}"
