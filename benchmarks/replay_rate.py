"""How fast one Locust process replays within the send-lag budget, and what distributed mode adds.

Starts a local tritonserver with the `encoder_sim` template (the emulated GPU encoder), replays Poisson
traffic (seq_len lognormal, median 64, at most 128) at rising rates with 1 process and with N worker processes,
and prints send lag, latency and load-generator CPU per step, then the highest rate each mode held
with send lag p99 under the budget. Noisy on a shared 2-core machine (the load_avg column shows how busy it was): repeat and compare
within a run.

    .venv/bin/python benchmarks/replay_rate.py [--rates 200,500,800,1200] [--duration 10]
        [--workers 1,2] [--budget-ms 2] [--protocol http]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pandas as pd

from tuner.measure import measure
from tuner.replay import replay
from tuner.server import LocalLauncher
from tuner.settings import ReplaySettings
from tuner.traffic import SizeSpec, synth_poisson

TEMPLATES = Path(__file__).resolve().parent.parent / "model_repository_templates"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="200,500,800,1200,1600")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--budget-ms", type=float, default=2.0)
    parser.add_argument("--protocol", default="http", choices=("http", "grpc"))
    parser.add_argument("--model", default="encoder_sim")
    parser.add_argument("--server-log", default=None)
    args = parser.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    worker_counts = [int(w) for w in args.workers.split(",")]
    rows = []
    with LocalLauncher(TEMPLATES, models=[args.model], log_path=args.server_log) as server:
        max_batch = server.model_config(args.model).max_batch_size
        for workers in worker_counts:
            for rate in rates:
                traffic = synth_poisson(rate, args.duration, seed=int(rate),
                                        sizes={"seq_len": SizeSpec("lognormal", median=64, max=128)})
                settings = ReplaySettings(protocol=args.protocol, workers=workers, warmup_s=2.0,
                                          lag_budget_ms=args.budget_ms)
                result = replay(server.endpoints, args.model, traffic, 1.0, settings, progress=True)
                m = measure(result.records, result.stats_before, result.stats_after, speed=1.0,
                            warmup_s=2.0, lag_budget_ms=args.budget_ms, max_batch_size=max_batch,
                            load_generator_cpu=result.load_generator_cpu, workers=result.workers)
                rows.append({
                    "workers": workers, "rate": rate, "offered_rps": round(m.offered_rps, 1),
                    "throughput_rps": round(m.throughput_rps, 1),
                    "lag_p50_ms": round(m.send_lag_ms["p50"], 3), "lag_p99_ms": round(m.send_lag_ms["p99"], 3),
                    "lag_max_ms": round(m.send_lag_ms["max"], 2),
                    "lat_p50_ms": round(m.latency_ms["p50"], 2), "lat_p99_ms": round(m.latency_ms["p99"], 2),
                    "errors": m.errors, "lg_cpu": round(m.load_generator_cpu, 2),
                    "held": m.send_lag_ms["p99"] < args.budget_ms,
                    "load_avg": round(os.getloadavg()[0], 1),  # the machine's own noise
                })
                print(pd.DataFrame(rows[-1:]).to_string(index=False, header=len(rows) == 1), flush=True)
    table = pd.DataFrame(rows)
    print("\n" + table.to_string(index=False))
    for workers, part in table.groupby("workers"):
        held = part[part["held"]]
        best = held["rate"].max() if len(held) else 0
        print(f"workers={workers}: highest rate with send lag p99 < {args.budget_ms:g} ms: {best:g} req/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
