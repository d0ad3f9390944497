"""Does the warm-up measure the steady state? Capacity of three configurations, each freshly loaded, by:

  (a) the old way: measured right after the load, no warm-up, one measurement per step;
  (b) tuner's way: the warm-up to steady state after the load, and repeats near the SLA's limit;
  (c) the steady-state truth: after a long warm-up, a bisection whose every step is a long replay
      at a constant speed (`--truth-step`, at least 60 s), started around (b)'s bracket, of the same
      traffic a step of (b) judges: the profile's busiest stretch of `search.capacity.step_duration_s`,
      played again and again back to back (a 60-s stretch of the profile instead would judge a
      calmer stretch than (b) does: a different capacity, not a truer one).

    python benchmarks/steady_state.py [examples/quickstart.yaml] [--configs 16:2000,8:0,32:4000]
                                      [--truth-step 60] [--tolerance 0.05]

Goal: (b) within 5 % of (c) for all three; (a)'s error is printed beside it. encoder_sim emulates a
GPU's cold start (on by default in its config.pbtxt): the first executions after a load are ~11x slower.
With a GPU and PyTorch, the same comparison on a real model: `steady_state.py examples/encoder_torch.yaml`.
Every load is made cold: another configuration is loaded first, so Triton starts new instances.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from pathlib import Path

import pandas as pd

from tuner import space
from tuner.server import make_launcher
from tuner.settings import StudySettings, read_study
from tuner.study import base_config, study_traffic
from tuner.traffic import mean_rps, step_window
from tuner.trial import Hints, find_capacity
from tuner.trial.run import INFORMED_GROWTH, make_measure
from tuner.trial.step import Windows, make_probe
from tuner.trial.warmup import warm_up

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study", nargs="?", default=str(ROOT / "examples" / "quickstart.yaml"))
    parser.add_argument("--configs", default="16:2000,8:0,32:4000", help="max_batch_size:delay_us, ...")
    parser.add_argument("--truth-step", type=float, default=60.0, help="seconds per step of the truth (c)")
    parser.add_argument("--tolerance", type=float, default=0.05,
                        help="the capacity bisection's tolerance, for (a), (b) and (c) alike (default 0.05)")
    args = parser.parse_args()

    # One resolution for the three: the comparison is of what a step measures (cold or warm, short or
    # long), not of how finely the bisection brackets it (the study's own tolerance, 15 % in the quick
    # start, would leave (b) up to 15 % under (c) by construction: its capacity is the last passing speed).
    settings = read_study(args.study)
    settings = dataclasses.replace(settings, search=dataclasses.replace(settings.search, capacity=dataclasses.replace(
        settings.search.capacity, tolerance=args.tolerance)))
    configs = [dict(zip(("max_batch_size", "max_queue_delay_microseconds"), map(int, c.split(":")), strict=True))
               for c in args.configs.split(",")]
    base = base_config(settings)
    traffic = study_traffic(settings)
    old_way = dataclasses.replace(settings, measurement=dataclasses.replace(
        settings.measurement, warmup=False, max_repeats=1))
    print(f"study {args.study}: {settings.model}, traffic {Path(settings.traffic.path).name} at speed "
          f"{settings.traffic.speed:g}, SLA p{settings.sla.percentile:g} <= {settings.sla.latency_ms:g} ms, "
          f"capacity tolerance {args.tolerance:g}; "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    rows = []
    with make_launcher(settings) as launcher:
        def cold(params: dict) -> None:
            other = {**params, "max_queue_delay_microseconds": params["max_queue_delay_microseconds"] + 1}
            launcher.apply_config(settings.model, space.apply(base, other, settings.search))
            launcher.apply_config(settings.model, space.apply(base, params, settings.search))

        for params in configs:
            label = space.describe(params)
            t0 = time.monotonic()
            cold(params)
            a = make_measure(launcher, old_way, traffic)(params, Hints())
            ta = time.monotonic() - t0
            t0 = time.monotonic()
            cold(params)
            b = make_measure(launcher, settings, traffic)(params, Hints())
            tb = time.monotonic() - t0
            # (c): warm for long, then bisect with long steps of the same stretch from around (b)'s bracket
            t0 = time.monotonic()
            cold(params)
            start = (b.capacity_speed or settings.search.capacity.start_speed) * 0.9
            c = _truth(launcher, settings, traffic, params, start_speed=start, step_s=args.truth_step,
                       tolerance=args.tolerance)
            tc = time.monotonic() - t0
            truth = c.capacity_rps
            row = {
                "config": label,
                "(a) old way": a.capacity_rps, "(a) error": _err(a.capacity_rps, truth),
                "(b) warm-up": b.capacity_rps,
                "(b) bracket": f"{b.capacity_rps:.1f}-{b.capacity.upper_rps:.1f}" if b.capacity and b.capacity.upper_rps
                else "-",
                "(b) error": _err(b.capacity_rps, truth), "(b) warm-up s": b.warmup.seconds if b.warmup else None,
                "(c) truth": truth,
                "(c) bracket": f"{c.capacity_rps:.1f}-{c.upper_rps:.1f}" if c.upper_rps else "-",
                "wall (a/b/c) s": f"{ta:.0f}/{tb:.0f}/{tc:.0f}",
            }
            rows.append(row)
            print(pd.DataFrame([row]).to_string(index=False), flush=True)
    table = pd.DataFrame(rows)
    print("\n" + table.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    within = [abs(r["(b) error"]) <= 0.05 for r in rows if r["(b) error"] is not None]
    print(f"\n(b) within 5 % of the steady-state truth for {sum(within)} of {len(rows)} configurations; "
          f"load average {os.getloadavg()[0]:.2f}")
    return 0


def repeated_step_windows(traffic: pd.DataFrame, settings: StudySettings, total_s: float) -> Windows:
    """What a step of the capacity search replays at each speed (see `tuner.trial.step.step_windows`), its
    measured stretch played again back to back until it lasts `total_s` wall seconds."""
    measured_s = settings.search.capacity.step_duration_s
    repeats = max(1, math.ceil(total_s / measured_s))

    def windows(speed: float) -> tuple[pd.DataFrame, float, float | None]:
        part, warmup = step_window(traffic, speed, settings.replay.warmup_s, measured_s=measured_s)
        first = float(part["timestamp"].iloc[0])
        stretch_start = first + warmup * speed  # recorded seconds: where the measured stretch starts
        stretch = part[part["timestamp"] >= stretch_start]
        span = measured_s * speed
        tiles = [part] + [stretch.assign(timestamp=stretch["timestamp"] + k * span) for k in range(1, repeats)]
        return pd.concat(tiles, ignore_index=True), warmup, warmup + repeats * measured_s

    return windows


def _truth(launcher, settings: StudySettings, traffic: pd.DataFrame, params: dict, *, start_speed: float,
           step_s: float, tolerance: float):
    """The steady-state capacity: a long warm-up, then the bisection with every step `step_s` long."""
    mbs = int(params["max_batch_size"])
    long_warm = dataclasses.replace(settings, measurement=dataclasses.replace(settings.measurement,
                                                                              warmup_max_s=120.0))
    warm_up(launcher, long_warm, traffic, max_batch_size=mbs)
    probe = make_probe(launcher, settings, repeated_step_windows(traffic, settings, step_s), max_batch_size=mbs,
                       repeats=False)
    cap = dataclasses.replace(settings.search.capacity, tolerance=tolerance, max_steps=6)
    return find_capacity(probe, settings.sla, cap, start_speed=start_speed, min_speed=settings.traffic.speed,
                         growth=INFORMED_GROWTH, rate=mean_rps(traffic))


def _err(value: float, truth: float) -> float | None:
    return value / truth - 1.0 if truth else None


if __name__ == "__main__":
    sys.exit(main())
