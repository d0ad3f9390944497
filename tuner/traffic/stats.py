"""What a traffic table looks like: counts, rates, burstiness, sizes, the busiest window; a plot."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tuner.errors import TrafficError
from tuner.traffic.io import (
    BATCH_SIZE,
    MODEL,
    TIMESTAMP,
    TOKEN_COLUMNS,
    check_writable,
    replacing,
    shape_columns,
)
from tuner.traffic.windows import busiest_window, offsets

PERCENTILES = (50, 90, 99)


def describe(df: pd.DataFrame, busiest_s: float = 60.0) -> dict[str, Any]:
    """Summary statistics of a validated traffic table (plain floats and ints, JSON-ready).

    Rates: mean = (requests - 1) / duration (one over the mean inter-arrival time); peaks are the
    most requests in any sliding 1 s and 60 s window. The busiest window is `busiest_s` long.
    """
    off = offsets(df)
    n = len(off)
    duration = float(off[-1]) if n else 0.0
    gaps = np.diff(off)
    mean_gap = float(gaps.mean()) if len(gaps) else float("nan")
    stats: dict[str, Any] = {
        "requests": n,
        "items": int(df[BATCH_SIZE].sum()) if BATCH_SIZE in df else n,
        "start": float(df[TIMESTAMP].iloc[0]) if n else float("nan"),
        "duration_s": duration,
        "mean_rps": (n - 1) / duration if duration > 0 else float("nan"),
        "peak_rps": busiest_window(df, 1.0)[1],
        "peak_rpm": busiest_window(df, 60.0)[1],
        "interarrival_cv": float(gaps.std() / mean_gap) if len(gaps) > 1 and mean_gap > 0 else float("nan"),
    }
    stats["mean_rpm"] = stats["mean_rps"] * 60
    start, count = busiest_window(df, busiest_s)
    stats["busiest"] = {
        "duration_s": float(busiest_s),
        "start_s": start,
        "requests": count,
        "rps": count / float(busiest_s),
    }
    stats["sizes"] = {
        col: _percentiles(df[col].to_numpy()) for col in [BATCH_SIZE, *shape_columns(df)] if col in df
    }
    if MODEL in df:
        stats["models"] = {str(k): int(v) for k, v in df[MODEL].value_counts(sort=True).items()}
    add_tokens(stats)
    return stats


def add_tokens(stats: dict[str, Any]) -> None:
    """A generative table's tokens (`stats["tokens"]`): per column, the total and the mean per second
    over the table's duration ((requests - 1) / duration, as the mean rate), from the size percentiles."""
    sizes = stats["sizes"]
    if not all(c in sizes for c in TOKEN_COLUMNS):
        return
    n, duration = stats["requests"], stats["duration_s"]
    tokens: dict[str, dict[str, float]] = {}
    for col in TOKEN_COLUMNS:
        total = float(round(sizes[col]["mean"] * n))
        per_s = total * (n - 1) / n / duration if duration > 0 else float("nan")
        tokens[col] = {**sizes[col], "total": total, "per_s": per_s}
    tokens["all"] = {"total": sum(t["total"] for t in tokens.values()),
                     "per_s": sum(t["per_s"] for t in tokens.values())}
    stats["tokens"] = tokens


def _percentiles(values: np.ndarray) -> dict[str, float]:
    out = {f"p{p}": float(v) for p, v in zip(PERCENTILES, np.percentile(values, PERCENTILES), strict=True)}
    out["mean"] = float(values.mean())
    out["max"] = float(values.max())
    return out


def _num(value: float, digits: int = 2) -> str:
    if isinstance(value, float) and np.isnan(value):
        return "-"
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:,.{digits}f}"


def format_stats(stats: dict[str, Any], source: str | None = None) -> str:
    """The `describe` dict as an aligned two-column table, then a size-percentile table."""
    b = stats["busiest"]
    rows = [
        ("requests", _num(stats["requests"])),
        ("items (sum of batch_size)", _num(stats["items"])),
        ("duration", f"{stats['duration_s']:,.3f} s"),
        ("mean rate", f"{_num(stats['mean_rps'])} /s   {_num(stats['mean_rpm'], 1)} /min"),
        ("peak rate (sliding 1 s / 60 s)", f"{_num(stats['peak_rps'])} /s   {_num(stats['peak_rpm'])} /min"),
        ("inter-arrival CV", _num(stats["interarrival_cv"], 3)),
        (
            f"busiest {b['duration_s']:g} s window",
            f"starts at {b['start_s']:,.3f} s, {_num(b['requests'])} requests ({_num(b['rps'])} /s)",
        ),
    ]
    for name, count in stats.get("models", {}).items():
        rows.append((f"model {name}", f"{_num(count)} requests"))
    width = max(len(k) for k, _ in rows)
    lines = [source] if source else []
    lines += [f"{k.ljust(width)}  {v}" for k, v in rows]
    tokens = stats.get("tokens")
    sizes = pd.DataFrame({k: v for k, v in stats["sizes"].items() if not tokens or k not in tokens}).T
    if len(sizes):
        lines += ["", sizes.map(_num).to_string()]
    if tokens:
        table = pd.DataFrame({"prompt": tokens["prompt_tokens"], "output": tokens["output_tokens"],
                              "prompt + output": tokens["all"]}).T
        table = table.rename(columns={"per_s": "per s"}).map(_num).replace("-", "")
        table.index.name = "tokens"
        lines += ["", table.to_string()]
    return "\n".join(lines)


def check_plot_path(path: str | os.PathLike) -> Path:
    """The path of a plot to write, once its suffix names an image type and a file can be made there."""
    from matplotlib.backend_bases import FigureCanvasBase

    path = Path(path)
    types = sorted(FigureCanvasBase.get_supported_filetypes())
    if path.suffix[1:].lower() not in types:
        raise TrafficError(f"{path}: unknown image type {path.suffix or '(no suffix)'!r} "
                           f"(expected one of: {', '.join('.' + t for t in types)})")
    return check_writable(path)


def plot_stats(df: pd.DataFrame, path: str | os.PathLike, title: str | None = None) -> None:
    """Rate over time and the inter-arrival histogram, as an image of the type the suffix names
    (.png, .svg, .pdf, ...; matplotlib's Agg, no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = check_plot_path(path)

    off = offsets(df)
    duration = float(off[-1]) if len(off) else 0.0
    # about a few hundred bins whatever the length: seconds, minutes or hours
    bin_s = next((b for b in (1.0, 10.0, 60.0, 600.0, 3600.0) if duration / b <= 1000), 3600.0)
    edges = np.arange(0.0, duration + bin_s, bin_s)
    if len(edges) < 2:
        edges = np.array([0.0, bin_s])
    counts, _ = np.histogram(off, bins=edges)
    fig = Figure(figsize=(10, 6.5), layout="constrained")
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1)
    top.step(edges[:-1], counts / bin_s, where="post", linewidth=0.8)
    top.set_xlabel("seconds from the first request")
    top.set_ylabel(f"requests/s (mean over {bin_s:g} s)")
    top.set_title(title or "request rate")
    gaps = np.diff(off)
    positive = gaps[gaps > 0]
    if len(positive):
        bins = np.logspace(np.log10(positive.min()), np.log10(positive.max()) + 1e-9, 60)
        bottom.hist(positive * 1000, bins=bins * 1000)
        bottom.set_xscale("log")
    bottom.set_xlabel(f"inter-arrival time (ms, log scale; {len(gaps) - len(positive):,} zero gaps left out)")
    bottom.set_ylabel("requests")
    with replacing(path) as tmp:
        fig.savefig(tmp, dpi=100, format=path.suffix[1:].lower())
