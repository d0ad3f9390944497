"""How reliable is a sampler at a small budget? Replay its choices on a grid already measured.

    python benchmarks/sampler_on_grid.py GRID.csv [--study examples/grid.yaml] [--share 0.25]
                                                  [--seeds 100] [--scoring capacity]

`search_ground_truth.py` runs one TPE study (one seed) against the real server: one draw. This script
asks how that draw is distributed, with no server: each sampler of `tuner.search.make_sampler` runs
the study's space (`tuner.space.suggest`, the incumbent enqueued first, the SLA as the constraint)
for `--seeds` seeds, and each configuration it proposes is scored from GRID.csv (the grid run's
`grid-*.csv`). A batch size between two measured batch sizes gets the interpolation (in log2) of
its neighbours, or 0 when the nearer one missed the SLA. The table: per sampler, the mean and
quantiles of best-found / optimum, and the share of seeds reaching 95 % of the optimum.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import optuna
import pandas as pd

from tuner import search
from tuner import space as tuner_space
from tuner.settings import read_study
from tuner.study import base_config

ROOT = Path(__file__).resolve().parent.parent
KEYS = ("max_batch_size", "max_queue_delay_microseconds")


def grid_table(path: Path, scoring: str) -> dict[tuple[int, int], float]:
    df = pd.read_csv(path)
    df = df[~df["incumbent"].astype(bool)]
    return {(int(r[KEYS[0]]), int(r[KEYS[1]])): (float(r[scoring]) if r["feasible"] and pd.notna(r[scoring]) else 0.0)
            for _, r in df.iterrows()}


def score(table: dict, batch: int, delay: int) -> float:
    """The grid's figure; between two measured batch sizes, interpolated in log2."""
    sizes = sorted({b for b, d in table if d == delay})
    if batch in sizes:
        return table[(batch, delay)]
    lo = max((b for b in sizes if b < batch), default=sizes[0])
    hi = min((b for b in sizes if b > batch), default=sizes[-1])
    if lo == hi:  # outside the measured sizes (an incumbent beyond the grid): the nearest one's
        return table[(lo, delay)]
    a, c = table[(lo, delay)], table[(hi, delay)]
    w = (math.log2(batch) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
    if a == 0 or c == 0:  # one side misses the SLA: the nearer side decides
        return (a if w < 0.5 else c) if (a == 0) == (w < 0.5) else (a or c)
    return (1 - w) * a + w * c


def run_once(space, table: dict, incumbent: dict, budget: int, optimum: float) -> float:
    study = optuna.create_study(direction="maximize", sampler=search.make_sampler(space))
    study.enqueue_trial(incumbent)
    best = 0.0
    for _ in range(budget):
        trial = study.ask()
        params = tuner_space.suggest(trial, space)
        value = score(table, params[KEYS[0]], params[KEYS[1]])
        trial.set_constraint("sla", -1.0 if value > 0 else 1.0)
        study.tell(trial, value)
        best = max(best, value)
    return best / optimum


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("grid", help="a grid-*.csv written by search_ground_truth.py")
    parser.add_argument("--study", default=str(ROOT / "examples" / "grid.yaml"))
    parser.add_argument("--share", type=float, default=0.25)
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--scoring", default="capacity", choices=("capacity", "utilization"))
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=UserWarning)  # the incumbent may lie outside the bounds

    settings = read_study(args.study)
    table = grid_table(Path(args.grid), args.scoring)
    optimum = max(table.values())
    size = tuner_space.grid_size(settings.search)
    budget = max(2, math.floor(args.share * size))
    incumbent = tuner_space.from_config(base_config(settings), settings.search)
    within = sum(v >= 0.95 * optimum for v in table.values())
    print(f"grid: {len(table)} configurations, optimum {optimum:,.0f} ({args.scoring}), "
          f"{within} within 95 %; budget {budget} trials (the incumbent included), {args.seeds} seeds")

    rows = []
    for sampler in ("tpe", "random"):
        ratios = []
        for seed in range(args.seeds):
            space = dataclasses.replace(settings.search, sampler=sampler, seed=seed, trials=budget)
            ratios.append(run_once(space, table, incumbent, budget, optimum))
        r = np.array(ratios)
        rows.append({"sampler": sampler, "mean": r.mean(), "p10": np.quantile(r, 0.1), "median": np.median(r),
                     "p90": np.quantile(r, 0.9), "seed 0": r[0], "share >= 0.95": (r >= 0.95).mean()})
    print(pd.DataFrame(rows).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
