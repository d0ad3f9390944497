"""tuner.traffic.stats: the numbers `tuner traffic stats` prints, and its plot."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tuner.cli import main
from tuner.traffic import describe, format_stats, plot_stats, write_traffic


def _frame() -> pd.DataFrame:
    # 10 requests: 0.0 .. 0.9 s, then a burst of 5 at 5.0 s
    times = np.concatenate([np.arange(10) * 0.1, np.full(5, 5.0)])
    return pd.DataFrame(
        {
            "timestamp": times,
            "batch_size": np.arange(1, 16, dtype=np.int64),
            "seq_len": np.full(15, 64, dtype=np.int64),
            "model": ["a"] * 10 + ["b"] * 5,
        }
    )


def test_describe_numbers():
    stats = describe(_frame(), busiest_s=1.0)
    assert stats["requests"] == 15 and stats["items"] == 120
    assert stats["duration_s"] == 5.0
    assert stats["mean_rps"] == pytest.approx(14 / 5.0)
    assert stats["mean_rpm"] == pytest.approx(14 / 5.0 * 60)
    assert stats["peak_rps"] == 10 and stats["peak_rpm"] == 15
    gaps = np.diff(_frame()["timestamp"].to_numpy())
    assert stats["interarrival_cv"] == pytest.approx(gaps.std() / gaps.mean())
    assert stats["busiest"] == {"duration_s": 1.0, "start_s": 0.0, "requests": 10, "rps": 10.0}
    assert stats["sizes"]["batch_size"]["p50"] == 8 and stats["sizes"]["batch_size"]["max"] == 15
    assert stats["sizes"]["seq_len"]["p99"] == 64
    assert stats["models"] == {"a": 10, "b": 5}


def test_format_stats_is_an_aligned_table():
    text = format_stats(describe(_frame()), "x.csv")
    lines = text.splitlines()
    assert lines[0] == "x.csv"
    assert any(line.startswith("requests") and line.rstrip().endswith("15") for line in lines)
    assert "inter-arrival CV" in text and "busiest 60 s window" in text and "model a" in text
    header = next(line for line in lines if "p50" in line)
    assert header.split() == ["p50", "p90", "p99", "mean", "max"]


def test_single_request_profile_describes_without_error():
    df = pd.DataFrame({"timestamp": [3.0], "batch_size": [1]})
    stats = describe(df)
    assert stats["requests"] == 1 and np.isnan(stats["mean_rps"]) and np.isnan(stats["interarrival_cv"])
    assert "-" in format_stats(stats)


def test_stats_cli_prints_the_table_and_draws_a_png(tmp_path, capsys):
    path = write_traffic(_frame(), tmp_path / "p.csv")
    png = tmp_path / "p.png"
    assert main(["traffic", "stats", str(path), "--busiest", "1s", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "busiest 1 s window" in out and "peak rate" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_plot_of_a_long_profile_uses_coarser_bins(tmp_path):
    df = pd.DataFrame({"timestamp": np.linspace(0, 7 * 86400, 20_000), "batch_size": 1})
    plot_stats(df, tmp_path / "week.png")
    assert (tmp_path / "week.png").stat().st_size > 5000


def _generative() -> pd.DataFrame:
    # 5 requests over 4 s: prompts 10..50 tokens, outputs 1..5
    return pd.DataFrame({"timestamp": np.arange(5.0), "prompt_tokens": np.arange(1, 6) * 10,
                         "output_tokens": np.arange(1, 6), "prefix_id": ["a", "a", "b", "c", "c"]})


def test_tokens_are_described_with_percentiles_and_rates(tmp_path, capsys):
    stats = describe(_generative())
    tokens = stats["tokens"]
    assert tokens["prompt_tokens"]["p50"] == 30 and tokens["prompt_tokens"]["max"] == 50
    assert tokens["output_tokens"]["p90"] == pytest.approx(4.6) and tokens["output_tokens"]["total"] == 15
    # per second as the mean rate is: (requests - 1) / duration requests a second, of the mean size
    assert tokens["prompt_tokens"]["per_s"] == pytest.approx(150 * 4 / 5 / 4.0)
    assert tokens["all"] == {"total": 165, "per_s": pytest.approx(165 * 4 / 5 / 4.0)}
    assert "prefix_id" not in stats["sizes"] and "tokens" not in describe(_frame())
    path = write_traffic(_generative(), tmp_path / "g.parquet")
    assert main(["traffic", "stats", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    header = next(line for line in out if line.startswith("tokens") or "per s" in line)
    assert header.split() == ["p50", "p90", "p99", "mean", "max", "total", "per", "s"]
    rows = {line.split()[0]: line.split() for line in out if line.startswith(("prompt ", "output "))
            and "+" not in line}
    assert rows["prompt"] == ["prompt", "30", "46", "49.60", "30", "50", "150", "30"]
    assert rows["output"] == ["output", "3", "4.60", "4.96", "3", "5", "15", "3"]
    assert next(line for line in out if line.startswith("prompt + output")).split()[-2:] == ["165", "33"]
