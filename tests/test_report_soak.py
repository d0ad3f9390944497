"""The soak's page (tuner/report/_soak.py): its panels follow what was soaked."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

from tuner.report._soak import SoakView, timeseries
from tuner.soak.analysis._tokens import window_columns


def _view(meta: dict, windows: pd.DataFrame) -> SoakView:
    # the figure reads the windows, the study's SLA and the fitted trends (none here)
    return SoakView(Path("."), meta, windows, pd.DataFrame(), SimpleNamespace(analysis=None))


def _titles(fig) -> list[str]:
    return [a.text for a in fig.layout.annotations if a.text != "SLA"]


def _hlines(fig) -> dict[str, float]:
    """{panel title: y} of the SLA lines, by the panel each is drawn on."""
    titles = _titles(fig)
    out = {}
    for shape in fig.layout.shapes:
        if shape.type == "line" and str(shape.xref).endswith("domain"):
            k = 0 if shape.yref == "y" else int(shape.yref[1:]) - 1
            out[titles[k]] = shape.y0
    return out


def test_a_generative_soak_is_drawn_in_tokens_ttft_tpot_and_the_engines_own_gauges():
    columns = window_columns(99, ["window", "t_hours", "age_hours", "start_hours"], {"memory_mb": ""})
    rng = np.random.default_rng(1)
    windows = pd.DataFrame({c: rng.uniform(1, 2, 6) for c in columns if c not in ("valid", "sla_ok", "sla_reason",
                                                                                   "first_error")})
    windows["t_hours"] = np.arange(6) / 2
    meta = {"unit": "tokens", "sla": {"percentile": 99, "ttft_ms": 500.0, "tpot_ms": 40.0, "max_error_rate": 0.01}}
    fig = timeseries(_view(meta, windows))
    titles = _titles(fig)
    assert titles[:3] == ["offered and served (tokens/s)", "time to first token (ms, from the due time)",
                          "time per output token (ms)"]
    assert {"vLLM KV cache (1 = full)", "vLLM sequences", "preemptions per finished request"} <= set(titles)
    assert not any("Triton compute" in t or "batch (rows)" in t for t in titles)  # the engine batches, not Triton
    names = {trace.name for trace in fig.data}
    assert {"offered, prompt + output", "served, prompt + output", "served, output", "p99", "peak", "running, mean",
            "preemptions"} <= names
    # each SLA limit on its own figure's panel
    assert _hlines(fig) == {"time to first token (ms, from the due time)": 500.0, "time per output token (ms)": 40.0,
                            "errors (fraction of requests)": 0.01}


def test_an_encoder_soak_keeps_its_latency_and_batch_panels():
    windows = pd.DataFrame({"t_hours": [0.0, 0.5], "offered_rps": [10.0, 10.0], "throughput_rps": [10.0, 10.0],
                            "latency_p50_ms": [5.0, 5.0], "latency_p99_ms": [9.0, 9.5], "error_rate": [0.0, 0.0],
                            "mean_batch_size": [2.0, 2.0], "memory_mb": [100.0, 101.0]})
    meta = {"sla": {"percentile": 99, "latency_ms": 100.0, "max_error_rate": 0.001}}
    fig = timeseries(_view(meta, windows))
    assert _titles(fig)[:2] == ["offered and served (req/s)", "latency (ms, from the due time)"]
    assert _hlines(fig) == {"latency (ms, from the due time)": 100.0, "errors (fraction of requests)": 0.001}
