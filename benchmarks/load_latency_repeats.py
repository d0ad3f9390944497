"""How far apart are two measurements of one configuration's latency percentile at the recorded load?

    python benchmarks/load_latency_repeats.py STUDY --fidelity OUTPUT [OUTPUT ...] [--rounds 3]
                                              [--repeats 1] [--points N] [--output runs/load-repeats]

`simulator_fidelity.py` judges the simulated latency percentile at the recorded load against ONE measured
step per configuration: the busiest stretch of `search.capacity.step_duration_s` at `traffic.speed`, a few
hundred requests, so its p99 is the second or third slowest of them. Here every configuration of those
fidelity outputs (their fidelity.csv; both halves of a space with two) is measured again `--rounds` times
on a real server, as the grid measured it: loaded, warmed up as a trial is (`tuner.trial.run.make_measure`),
its load step replayed (and `--repeats` times back to back, without loading it again). The rounds are
interleaved and mirrored (A B C, C B A, ...), so a drift of the host falls on every configuration alike.
Per configuration: the measurements, their median, the grid's single measurement and the simulated
figure (fidelity.csv's, from that output's profile). The figures:
- one measurement's spread: per configuration the median absolute deviation of a measurement from the
  configuration's median, relative to it; the median of that over configurations (what one measurement
  carries before any simulation is compared with it);
- the simulation's median absolute error against the grid's single measurements (the figure
  docs/simulator.md quotes) and against the medians of the measurements here.
Results: OUTPUT/repeats.csv (one row a measurement, written as it goes) and OUTPUT/points.csv.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import pandas as pd
from simulator_fidelity import params_of  # one reading of a fidelity row's knobs (this script's folder)
from tqdm import tqdm

from tuner import space as knobs
from tuner.server import make_launcher
from tuner.settings import read_study
from tuner.study import base_config, study_traffic
from tuner.trial.capacity import Hints
from tuner.trial.record import UNMEASURED
from tuner.trial.run import make_measure

ROOT = Path(__file__).resolve().parent.parent
GOAL_LATENCY = 0.15  # issue 26: the simulated percentile at the load within 15 % of the measured (median)


def points(outputs: list[Path]) -> pd.DataFrame:
    """The fidelity outputs' configurations with their single measured and simulated percentiles."""
    table = pd.concat([pd.read_csv(out / "fidelity.csv") for out in outputs], ignore_index=True)
    return table[[*[k for k in knobs.NAMES if k in table], "latency_measured", "latency_simulated"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study", type=Path)
    parser.add_argument("--fidelity", type=Path, nargs="+", required=True, metavar="OUTPUT",
                        help="simulator_fidelity.py outputs (their fidelity.csv)")
    parser.add_argument("--rounds", type=int, default=3, help="fresh loads of each configuration")
    parser.add_argument("--repeats", type=int, default=1, help="load steps a load, back to back")
    parser.add_argument("--points", type=int, help="only the first N configurations")
    parser.add_argument("--output", type=Path, default=ROOT / "runs" / "load-repeats")
    args = parser.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    settings = read_study(args.study)
    pct = f"p{settings.sla.percentile:g}"
    table = points(args.fidelity)
    if args.points:
        table = table.head(args.points)
    base, traffic = base_config(settings), study_traffic(settings)
    rows: list[dict] = []
    started, load0 = time.monotonic(), os.getloadavg()
    with make_launcher(settings) as launcher:
        measure = make_measure(launcher, settings, traffic, capacity=False)
        bar = tqdm(total=len(table) * args.rounds * args.repeats, unit="step", desc="load steps")
        for round_ in range(args.rounds):
            order = table.index if round_ % 2 == 0 else table.index[::-1]
            for i in order:
                params = params_of(table.loc[i])
                launcher.apply_config(settings.model, knobs.apply(base, params, settings.search))
                for r in range(args.repeats):
                    record = measure(params, Hints(), warmed=r > 0)  # warmed up after each load, as a trial
                    load = record.at_load
                    rows.append({"point": i, **params, "round": round_, "repeat": r, "outcome": record.outcome,
                                 "latency_ms": (load.latency_ms.get(pct) if load else None),
                                 "requests": load.requests if load else 0,
                                 "send_lag_p99_ms": load.send_lag_p99_ms if load else None,
                                 "compute_ms": load.compute_ms if load else None})
                    pd.DataFrame(rows).to_csv(args.output / "repeats.csv", index=False)
                    bar.update()
        bar.close()
    repeats = pd.DataFrame(rows)
    # a replay its load generator could not keep on time measured the host, not the configuration
    valid = repeats[repeats["latency_ms"].notna() & repeats["outcome"].ne(UNMEASURED)]
    per = valid.groupby("point")["latency_ms"].agg(["median", "min", "max", "count"])
    spread = valid.join(per["median"], on="point")
    spread["deviation"] = (spread["latency_ms"] / spread["median"] - 1).abs()
    per["spread"] = spread.groupby("point")["deviation"].median()
    # back to back (the same load): how much of the spread is the load and warm-up, not the step
    first = valid[valid["repeat"] == 0].set_index(["point", "round"])["latency_ms"]
    again = valid[valid["repeat"] > 0].join(first.rename("first"), on=["point", "round"])
    back_to_back = (again["latency_ms"] / again["first"] - 1).abs().median() if len(again) else None
    out = table.join(per, how="inner")
    out["error_single"] = out["latency_simulated"] / out["latency_measured"] - 1
    out["error_median"] = out["latency_simulated"] / out["median"] - 1
    out.to_csv(args.output / "points.csv")
    shown = out.assign(**{f"{pct} repeats": [", ".join(f"{v:.0f}" for v in valid.loc[valid["point"] == i, "latency_ms"])
                                              for i in out.index]})
    cols = [k for k in knobs.NAMES if k in out] + [f"{pct} repeats", "median", "latency_measured",
                                                   "latency_simulated", "spread", "error_single", "error_median"]
    print(shown[cols].rename(columns={"latency_measured": "grid single", "latency_simulated": "simulated"})
          .to_string(float_format=lambda v: f"{v:.2f}"))
    figures = pd.DataFrame([
        (f"one measurement's {pct} at the load, median absolute deviation from its configuration's median of "
         f"{args.rounds * args.repeats} (median over configurations)", f"{out['spread'].median():.1%} over {len(out)}"),
        ("  the same, p90 over configurations", f"{out['spread'].quantile(0.9):.1%}"),
        (f"simulated {pct} at the load: median absolute error against the grid's single measurements",
         f"{out['error_single'].abs().median():.1%}"),
        (f"simulated {pct} at the load: median absolute error against the medians of the repeats "
         f"(goal <= {GOAL_LATENCY:.0%})", f"{out['error_median'].abs().median():.1%}"),
        ("a step replayed again on the same load: median absolute difference from the first",
         "-" if back_to_back is None else f"{back_to_back:.1%}"),
        ("load steps measured / not (unmeasured, unstable)", f"{len(valid)} / {len(repeats) - len(valid)}"),
    ], columns=["figure", "value"])
    print()
    print(figures.to_string(index=False))
    print(f"\n{(time.monotonic() - started) / 60:.1f} min; load average {' '.join(f'{x:.2f}' for x in load0)} at "
          f"the start, {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end; results: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
