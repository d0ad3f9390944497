"""What a replay costs beyond its own schedule, with the load generator forked by the fork server
(`tuner.replay._forkserver`, the default) and with each process started afresh (as before it).

    python benchmarks/replay_start.py [--runs 6] [--speed 0.5] [--step-s 1.0] [--warmup-s 0.5]

Starts a local tritonserver serving `encoder_sim`, then replays one capacity step of the tests' profile
(traffic_profiles/bursty_60s.csv: its busiest `--step-s` after `--warmup-s` of lead, as `tuner tune`'s
steps do) `--runs` times each way, alternating, one load-generator process. Prints per way the median
and range of: the time from the call to the schedule's start (planning, the process's start, its
preparation), the time from the schedule's end to the call's return, and the call's whole wall time;
the load average beside them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.replay import _forkserver, replay  # noqa: E402
from tuner.server.local import LocalLauncher  # noqa: E402
from tuner.settings import ReplaySettings  # noqa: E402
from tuner.traffic import read_traffic, step_window  # noqa: E402

PROFILE = ROOT / "traffic_profiles" / "bursty_60s.csv"


def _one(server, part, warmup_s: float, speed: float) -> tuple[float, float, float]:
    start = time.monotonic()
    result = replay(server.endpoints, "encoder_sim", part, speed=speed,
                    settings=ReplaySettings(workers=1, lag_budget_ms=100), warmup_s=warmup_s)
    end = time.monotonic()
    t0 = result.details["t0_monotonic"]
    return t0 - start, end - (t0 + result.duration_s), end - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--speed", type=float, default=0.5)
    parser.add_argument("--step-s", type=float, default=1.0)
    parser.add_argument("--warmup-s", type=float, default=0.5)
    args = parser.parse_args()
    if not PROFILE.is_file():
        sys.exit(f"no profile at {PROFILE}")
    traffic = read_traffic(PROFILE)
    part, warmup = step_window(traffic, args.speed, warmup_s=args.warmup_s, measured_s=args.step_s)
    forked = _forkserver._for  # the benchmark's one reach inside: turning the fork server off
    ways = {"forked": forked, "spawned": lambda env: None}
    times: dict[str, list[tuple[float, float, float]]] = {way: [] for way in ways}
    print(f"load average at the start: {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs", flush=True)
    with LocalLauncher(ROOT / "model_repository_templates", models=["encoder_sim"]) as server:
        _one(server, part, warmup, args.speed)  # the server's own cold start, and the fork server's
        for run in range(args.runs):
            for way, chooser in ways.items():
                _forkserver._for = chooser
                times[way].append(_one(server, part, warmup, args.speed))
            print(f"run {run + 1}/{args.runs}: " + ", ".join(
                f"{way} {times[way][-1][2]:.2f} s" for way in ways), file=sys.stderr, flush=True)
    _forkserver._for = forked
    print(f"\none step: speed {args.speed:g}, {warmup:.2f} s of lead + {args.step_s:g} s measured, "
          f"{len(part)} requests, {args.runs} runs each way")
    print(f"{'way':<8} {'call -> schedule start':>24} {'schedule end -> return':>24} {'whole call':>20}")
    for way, rows in times.items():
        cells = []
        for k in range(3):
            values = [r[k] for r in rows]
            cells.append(f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f}) s")
        print(f"{way:<8} {cells[0]:>24} {cells[1]:>24} {cells[2]:>20}")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
