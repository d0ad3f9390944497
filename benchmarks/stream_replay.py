"""The generative (streaming) replay against known token times: does it measure what the server did,
and how many concurrent streams does one load-generator process hold within the send-lag budget?

Serves `stream_echo` (tests/data/replay_models: the vLLM backend's interface, exactly max_tokens
tokens, the first 20 ms + 1 ms per prompt token after a request arrives, then one every 10 ms; each
request on its own, so the true TTFT and TPOT of every request are known) on a local tritonserver and
replays Poisson traffic at each rate: prompts 20 .. 2,000 tokens (uniform), outputs 4 .. 24 tokens.
Past ~3,500 token responses a second the test model itself (one Python-backend process) falls behind
on this 2-core machine: TTFT and TPOT then grow with the load, which is the server, not the replay.
Prints, per rate: streams open at once (most), token responses per second, TTFT p50/p99 minus the
model's own (the overhead HTTP, Triton and the load generator add), TPOT p50/p99 against 10 ms, send
lag p50/p99/max, the load generator's CPU per wall second, and the machine's load average.

    .venv/bin/python benchmarks/stream_replay.py [--rates 50,100,200] [--duration 10] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import pandas as pd

from tuner.measurement_tokens import measure_tokens
from tuner.replay import replay
from tuner.server import LocalLauncher
from tuner.settings import ReplaySettings

MODELS = Path(__file__).resolve().parent.parent / "tests" / "data" / "replay_models"
FIRST_MS, PROMPT_MS, TOKEN_MS = 20.0, 1.0, 10.0


def traffic(rate: float, duration_s: float, seed: int) -> pd.DataFrame:
    """Poisson arrivals at `rate`; prompts 20 .. 2,000 tokens, outputs 4 .. 24 tokens."""
    rng = np.random.default_rng(seed)
    n = int(rate * duration_s)
    return pd.DataFrame({"timestamp": np.cumsum(rng.exponential(1 / rate, n)),
                         "prompt_tokens": rng.integers(20, 2001, n), "output_tokens": rng.integers(4, 25, n)})


def open_at_once(recs: pd.DataFrame) -> int:
    """The most requests sent and not yet ended at any moment."""
    starts, ends = recs["send_s"].to_numpy(), recs["end_s"].to_numpy()
    times = np.concatenate([starts, ends])
    steps = np.concatenate([np.ones(len(starts)), -np.ones(len(ends))])
    return int(np.cumsum(steps[np.argsort(times, kind="stable")]).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="50,100,200")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows = []
    with LocalLauncher(MODELS, models=["stream_echo"]) as server:
        for rate in (float(r) for r in args.rates.split(",")):
            df = traffic(rate, args.duration, args.seed)
            result = replay(server.endpoints, "stream_echo", df, speed=1.0,
                            settings=ReplaySettings(workers=1, warmup_s=1.0))
            recs = result.records
            m = measure_tokens(recs, speed=1.0, warmup_s=1.0, lag_budget_ms=5.0)
            ok = recs[recs["ok"] & (recs["due_s"] >= 1.0)]
            over = (ok["first_token_s"] - ok["due_s"]) * 1000 - (FIRST_MS + PROMPT_MS * ok["prompt_tokens"])
            events = sum(len(x) + 1 for x in ok["itl_ms"]) / max(float(recs["end_s"].max()), 1e-9)
            rows.append({
                "rate /s": rate, "requests": m.requests, "errors": m.errors, "open at once": open_at_once(recs),
                "token responses /s": round(events),
                "TTFT over model p50 ms": over.median(), "p99": over.quantile(0.99),
                "TPOT p50 ms (10)": m.tpot_ms["p50"], "TPOT p99": m.tpot_ms["p99"],
                "send lag p50 ms": m.send_lag_ms["p50"], "lag p99": m.send_lag_ms["p99"],
                "lag max": m.send_lag_ms["max"], "valid": m.valid,
                "loadgen CPU s/s": result.load_generator_cpu, "load avg": os.getloadavg()[0],
            })
    table = pd.DataFrame(rows)
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))


if __name__ == "__main__":
    main()
