"""How fast the load generator replays within the send-lag budget, with one process and with several.

Replays Poisson traffic (seq_len lognormal, median 64, at most 128) at rising rates with each process
count and prints, per step: send lag, latency, errors, the load generator's CPU per wall second and
per request, whether send lag p99 stayed under the budget, and the machine's load average. At the
start it prints this host's load-generator calibration (what `tuner` uses to choose the process
count); at the end the highest rate each process count held, and how many processes 1,000 req/s takes.

Servers, from the most to the least of the machine's own CPU in the picture:
- default: a local tritonserver serving `--model` (`echo`, a test model that sleeps 2 ms per batch and
  costs the server little: the load generator's own limit; or a template such as `encoder_sim`);
- `--pin`: the same local server pinned to the last CPU core and the load generator to the others
  (the closest stand-in for a server on another host on one machine);
- `--url HOST:PORT`: a server someone else runs (another host, or one started under `taskset`), with
  `--model` loaded.
Send lag depends on what else the machine runs: compare within a run, give the load average, and
repeat (`--repeats`). CPU per request is the figure other work disturbs least.

    .venv/bin/python benchmarks/replay_rate.py [--rates 500,1000,1600] [--duration 10] [--workers 1,2]
        [--model echo] [--pin | --url HOST:PORT [--grpc-url HOST:PORT]] [--repeats 1] [--budget-ms 2]
        [--protocol http]
"""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import ExitStack
from pathlib import Path

import pandas as pd

from tuner.measurement import measure
from tuner.replay import calibrate, replay
from tuner.server import LocalLauncher, RemoteLauncher
from tuner.settings import ReplaySettings
from tuner.traffic import SizeSpec, synth_poisson

ROOT = Path(__file__).resolve().parent.parent
REPOSITORIES = (ROOT / "tests" / "data" / "replay_models", ROOT / "model_repository_templates")
WARMUP_S = 2.0


def repository_of(model: str) -> Path:
    for repository in REPOSITORIES:
        if (repository / model / "config.pbtxt").exists():
            return repository
    sys.exit(f"replay_rate.py: no model '{model}' in {', '.join(str(r) for r in REPOSITORIES)}")


def allowed_cores(pid: int) -> str:
    with open(f"/proc/{pid}/status") as f:
        return next(line.split(":", 1)[1].strip() for line in f if line.startswith("Cpus_allowed_list"))


def start_server(args, stack: ExitStack):
    """The server to replay against, started (and stopped by `stack`) unless it was given by URL."""
    if args.url:
        return stack.enter_context(RemoteLauncher(args.url, grpc_url=args.grpc_url, models=[args.model]))
    launcher = LocalLauncher(repository_of(args.model), models=[args.model], log_path=args.server_log)
    if not args.pin:
        return stack.enter_context(launcher)
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        sys.exit("replay_rate.py: --pin needs at least 2 CPU cores")
    # The server inherits the affinity of the thread that starts it (its threads and model processes
    # too); the load generator processes started later inherit the one set after it.
    os.sched_setaffinity(0, cores[-1:])
    server = stack.enter_context(launcher)
    os.sched_setaffinity(0, cores[:-1])
    print(f"server pid {server.pid} pinned to core {allowed_cores(server.pid)}; load generator on core(s) "
          f"{allowed_cores(os.getpid())}", flush=True)
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="500,1000,1600")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per step, warm-up included")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--repeats", type=int, default=1, help="runs of every step, interleaved")
    parser.add_argument("--budget-ms", type=float, default=2.0)
    parser.add_argument("--protocol", default="http", choices=("http", "grpc"))
    parser.add_argument("--model", default="echo")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--pin", action="store_true", help="pin the local server to one core, the replay to the rest")
    target.add_argument("--url", help="HOST:PORT of a running Triton's HTTP endpoint serving --model")
    parser.add_argument("--grpc-url", help="with --url: HOST:PORT of its gRPC endpoint (default: HTTP port + 1)")
    parser.add_argument("--server-log", default=None, help="write the local server's log to this file")
    args = parser.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    worker_counts = [int(w) for w in args.workers.split(",")]
    rows = []
    with ExitStack() as stack:
        server = start_server(args, stack)
        calibration = calibrate(args.protocol)
        print(calibration.describe(), flush=True)
        max_batch = server.model_config(args.model).max_batch_size
        for run in range(1, args.repeats + 1):
            for workers in worker_counts:
                for rate in rates:
                    traffic = synth_poisson(rate, args.duration, seed=int(rate) + run,
                                            sizes={"seq_len": SizeSpec(kind="lognormal", median=64, max=128)})
                    settings = ReplaySettings(protocol=args.protocol, workers=workers, warmup_s=WARMUP_S,
                                              lag_budget_ms=args.budget_ms)
                    result = replay(server.endpoints, args.model, traffic, speed=1.0, settings=settings, progress=True)
                    m = measure(result.records, result.stats_before, result.stats_after, speed=1.0,
                                warmup_s=WARMUP_S, lag_budget_ms=args.budget_ms, max_batch_size=max_batch,
                                load_generator_cpu=result.load_generator_cpu, workers=result.workers)
                    processes = result.details["processes"]
                    rows.append({
                        "run": run, "workers": workers, "rate": rate, "offered_rps": round(m.offered_rps, 1),
                        "throughput_rps": round(m.throughput_rps, 1),
                        "lag_p50_ms": round(m.send_lag_ms["p50"], 3), "lag_p99_ms": round(m.send_lag_ms["p99"], 3),
                        "lag_max_ms": round(m.send_lag_ms["max"], 2),
                        "lat_p50_ms": round(m.latency_ms["p50"], 2), "lat_p99_ms": round(m.latency_ms["p99"], 2),
                        "errors": m.errors, "lg_cpu": round(m.load_generator_cpu, 2),
                        "lg_us_per_req": round(1e6 * sum(p["cpu_s"] for p in processes)
                                               / sum(p["requests"] for p in processes)),
                        # how long before its first due time the latest process was walking (< 0: late)
                        "slack_ms": round(min(p["slack_ms"] for p in processes)),
                        "gc_max_ms": round(max(p["gc_max_ms"] for p in processes), 1),
                        "held": m.send_lag_ms["p99"] <= args.budget_ms and m.errors == 0,
                        "load_avg": round(os.getloadavg()[0], 2),  # the machine's own noise
                    })
                    print(pd.DataFrame(rows[-1:]).to_string(index=False, header=len(rows) == 1), flush=True)
    table = pd.DataFrame(rows)
    where = (f"server at {args.url}" if args.url else
             f"local server{' pinned to one core' if args.pin else ''}")
    print(f"\n{args.model}, {where}, {args.protocol}, {args.duration:g} s steps ({WARMUP_S:g} s warm-up)")
    print(table.to_string(index=False))
    for workers, part in table.groupby("workers"):
        held = part.groupby("rate")["held"].all()
        best = held[held].index.max() if held.any() else 0
        print(f"workers={workers}: highest rate with send lag p99 <= {args.budget_ms:g} ms in every run: "
              f"{best:g} req/s")
    print(calibration.describe())
    print(f"processes per 1,000 req/s on this host: {1000.0 / calibration.per_process_rps:.2f} "
          f"(one per {calibration.per_process_rps:.0f} req/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
