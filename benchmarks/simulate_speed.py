"""How long the simulator takes to rank the quick start's whole space, capacity bisection included.

    python benchmarks/simulate_speed.py [--study examples/quickstart.yaml] [--runs 2] [--grid all|half-octave]
                                        [--tolerance T]

The space: max_batch_size 1..64 (every integer: `all`, 64 values; or the half-octave grid 1, 2, 3, 4,
6, 8, 11, 16, 23, 32, 45, 64), the study's queue delays (0..8000 us step 2000: 5 values) and
instance counts 1..2: 640 (or 120) configurations, each simulated as the real search measures a
trial (the step at the recorded load, then `find_capacity` on simulated steps). The profile is the
emulated GPU of `encoder_sim` (its latency table, memory-bound knee, out-of-memory budget, host
time per row and truncation at max_sequence_length, read from the template's config.pbtxt), on a
grid of rows x lengths; measuring it on a real Triton is `tuner profile`'s job, not this script's.
Prints one line per run with the wall time and the load average, then the top of the ranking.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from encoder_sim import profile as encoder_sim_profile  # noqa: E402  (benchmarks/, this script's directory)

from tuner.settings import read_study  # noqa: E402
from tuner.simulate import Simulator  # noqa: E402
from tuner.study import study_traffic  # noqa: E402

HALF_OCTAVES = (1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64)


def space(study, grid: str) -> list[dict]:
    sizes = range(1, 65) if grid == "all" else HALF_OCTAVES
    r = study.search.max_queue_delay_microseconds
    delays = range(r.low, r.high + 1, r.step)
    return [{"max_batch_size": b, "max_queue_delay_microseconds": d, "instance_count": n}
            for b in sizes for d in delays for n in (1, 2)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", default=str(ROOT / "examples" / "quickstart.yaml"))
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--grid", choices=("all", "half-octave"), default="all")
    parser.add_argument("--tolerance", type=float, default=None,
                        help="capacity bisection tolerance (default: the study's)")
    args = parser.parse_args()

    study = read_study(args.study)
    profile = encoder_sim_profile(Path(study.model_repository) / study.model / "config.pbtxt")
    traffic = study_traffic(study)
    configs = space(study, args.grid)
    print(f"profile: {profile.describe()}")
    delays = study.search.max_queue_delay_microseconds
    tolerance = args.tolerance or study.search.capacity.tolerance
    print(f"traffic: {len(traffic)} requests; space: {len(configs)} configurations (max_batch_size "
          f"{'1..64' if args.grid == 'all' else ','.join(map(str, HALF_OCTAVES))}, delays {delays.low}..{delays.high} "
          f"step {delays.step} us, instances 1..2); capacity tolerance {tolerance:g}; {os.cpu_count()} CPUs")
    table = None
    for run in range(1, args.runs + 1):
        load_before = os.getloadavg()
        started = time.perf_counter()
        sim = Simulator.for_study(study, traffic, profile)  # a fresh one: no cache carried over
        table = sim.rank(configs, tolerance=args.tolerance)
        wall = time.perf_counter() - started
        print(f"run {run}: {wall:.2f} s for {len(configs)} configurations ({wall / len(configs) * 1e3:.1f} ms each; "
              f"{len(sim.speeds)} distinct step speeds, {sum(sim.speeds.values())} requests in them); load average "
              f"before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, after "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    cols = ["rank", "max_batch_size", "max_queue_delay_microseconds", "instance_count", "capacity_rps",
            "latency_p99_ms", "fill_rate", "busy_s", "score_capacity", "score_utilization"]
    print(table[cols].head(10).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
