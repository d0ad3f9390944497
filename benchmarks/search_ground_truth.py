"""Ground truth for the search: does TPE find (nearly) the best configuration, measuring little?

    python benchmarks/search_ground_truth.py [examples/grid.yaml] [--output runs/ground-truth]
                                             [--share 0.25] [--seed 0]

1. Grid: every configuration of the study's space, measured on a real local Triton serving the
   emulated-GPU template with the study's (bursty) profile. No pruning, so each gets its full capacity
   search; both scores are measured for each, so one grid gives the optimum for both scorings.
2. TPE, once per scoring, with a trial budget of `--share` of the grid (the incumbent included).
3. A final round, interleaved like the tool's own re-measurement (A B C D A B C D ...): the grid's
   top configurations and TPE's top configurations, for both scorings, measured `--repeats` times
   each. One measurement per configuration carries a winner's curse (the grid's maximum over 60 noisy
   figures is biased upwards, TPE's over 15 less so); the medians of the same round compare like with
   like. The optimum is the grid's best median; TPE's pick is TPE's best median (the tool's rule).
4. For each scoring: the optimum, TPE's pick, the ratio of requests per dollar (single measurements,
   and the final round's medians), the share of the grid TPE measured, and the share of the grid
   within 95% of the optimum (if that share is large, the workload is too easy to tell).

Every run uses the same server (one machine state); results go to OUTPUT/ground_truth.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import sys
import time
from pathlib import Path

import optuna
import pandas as pd

from tuner import search
from tuner import space as tuner_space
from tuner.cost import price_for
from tuner.settings import read_study
from tuner.study import base_config
from tuner.trial import Hints, is_feasible
from tuner.trial.run import session

ROOT = Path(__file__).resolve().parent.parent


def run_study(settings, evaluate_fn, storage: str, n_trials: int, incumbent: dict) -> optuna.Study:
    study = search.open_study(settings, storage, sampler=search.make_sampler(settings.search), incumbent=incumbent,
                              metadata={"scoring": settings.scoring, "storage": storage})
    total = n_trials
    with _bar(total, settings.name) as bar:
        search.run_trials(study, settings, evaluate_fn, n_trials=n_trials, on_trial=lambda _t: bar.update(1))
    return study


def _bar(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="trial", file=sys.stderr, dynamic_ncols=True)


def frame(study: optuna.Study) -> pd.DataFrame:
    rows = []
    for t in study.trials:
        if t.state not in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED):
            continue
        feasible = is_feasible(t) or (t.state == optuna.trial.TrialState.PRUNED and bool(t.user_attrs.get("feasible")))
        rows.append({"number": t.number, "incumbent": bool(t.user_attrs.get("incumbent")),
                     "state": t.state.name, **t.params, "feasible": feasible,
                     "capacity_rps": t.user_attrs.get("capacity_rps"),
                     "capacity_speed": t.user_attrs.get("capacity_speed"),
                     "capacity": t.user_attrs.get("score_capacity") if feasible else None,
                     "utilization": t.user_attrs.get("score_utilization") if feasible else None})
    return pd.DataFrame(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study", nargs="?", default=str(ROOT / "examples" / "grid.yaml"))
    parser.add_argument("--output", default=str(ROOT / "runs" / "ground-truth"))
    parser.add_argument("--share", type=float, default=0.25, help="TPE's trial budget, as a share of the grid")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--top", type=int, default=2,
                        help="configurations of each run (grid, TPE) per scoring in the final round")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats in the final round")
    parser.add_argument("--time-scale", type=float, default=None,
                        help="run a copy of the template with this emulated-GPU time_scale (slower GPU: "
                        "the emulation, not a loaded 2-core CPU, becomes the bottleneck)")
    parser.add_argument("--speed", type=float, default=None, help="override traffic.speed (the recorded load)")
    parser.add_argument("--latency-ms", type=float, default=None,
                        help="override sla.latency_ms (scale it with --time-scale)")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    grid_settings = read_study(args.study)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if args.time_scale is not None:
        grid_settings = dataclasses.replace(
            grid_settings, model_repository=str(scaled_copy(grid_settings, args.time_scale, out / "models")))
    if args.latency_ms is not None:
        grid_settings = dataclasses.replace(
            grid_settings, sla=dataclasses.replace(grid_settings.sla, latency_ms=args.latency_ms))
    if args.speed is not None:
        grid_settings = dataclasses.replace(
            grid_settings, traffic=dataclasses.replace(grid_settings.traffic, speed=args.speed))
    space = dataclasses.replace(grid_settings.search, sampler="grid", seed=args.seed)
    grid_settings = dataclasses.replace(grid_settings, search=space, output=str(out))
    size = tuner_space.grid_size(space)
    budget = max(2, math.floor(args.share * size))
    base = base_config(grid_settings)
    incumbent = tuner_space.from_config(base, space)
    price = price_for(grid_settings.cost).price_per_hour
    print(f"space: {tuner_space.grid(space)}  ({size} configurations); TPE budget {budget} trials; "
          f"price ${price}/h", flush=True)

    results: dict = {"study": args.study, "grid_size": size, "tpe_budget": budget, "share": args.share,
                     "time_scale": args.time_scale, "speed": grid_settings.traffic.speed,
                     "latency_ms": grid_settings.sla.latency_ms}
    started = time.monotonic()
    with session(grid_settings, log_dir=str(out / "server")) as evaluate_fn:
        # the ground truth: no pruning (each configuration gets its full capacity search)
        def unpruned(params: dict, hints: Hints):
            return evaluate_fn(params, Hints(start_speed=hints.start_speed))

        grid_study = run_study(dataclasses.replace(grid_settings, name=f"grid-{stamp}"), unpruned,
                               str(out / f"grid-{stamp}.journal"), size + 1, incumbent)
        grid = frame(grid_study)
        results["incumbent_twice"] = incumbent_twice(grid, incumbent)
        grid = grid[~grid["incumbent"]]  # the incumbent is measured again as its grid point
        grid.to_csv(out / f"grid-{stamp}.csv", index=False)
        results["grid_seconds"] = time.monotonic() - started

        tpe_frames = {}
        for scoring in ("capacity", "utilization"):
            t0 = time.monotonic()
            settings = dataclasses.replace(grid_settings, name=f"tpe-{scoring}-{stamp}", scoring=scoring,
                                           search=dataclasses.replace(space, sampler="tpe", trials=budget))
            tpe_study = run_study(settings, evaluate_fn, str(out / f"tpe-{scoring}-{stamp}.journal"), budget,
                                  incumbent)
            tpe = frame(tpe_study)
            tpe.to_csv(out / f"tpe-{scoring}-{stamp}.csv", index=False)
            tpe_frames[scoring] = tpe
            results[scoring] = compare(grid, tpe, scoring, size)
            results[scoring]["tpe_seconds"] = time.monotonic() - t0

        t0 = time.monotonic()
        candidates = final_candidates(grid, tpe_frames, args.top)
        medians = final_round(evaluate_fn, candidates, args.repeats)
        results["final_round"] = {"repeats": args.repeats, "seconds": time.monotonic() - t0,
                                  "configurations": [{"params": dict(k), **v} for k, v in medians.items()]}
        for scoring in ("capacity", "utilization"):
            results[scoring].update(compare_final(grid, tpe_frames[scoring], scoring, args.top, medians, size))

    print()
    for scoring in ("capacity", "utilization"):
        r = results[scoring]
        print(f"== scoring: {scoring}")
        print(f"   optimum (grid):        {r['optimum_params']}  {r['optimum']:,.0f} requests/$")
        in_grid = "not a grid point" if r["tpe_in_grid"] is None else f"{r['tpe_in_grid']:,.0f} as the grid measured it"
        print(f"   TPE's pick:            {r['tpe_params']}  {r['tpe_own']:,.0f} requests/$ (TPE's run; {in_grid})")
        by_grid = "-" if r["ratio_grid"] is None else f"{r['ratio_grid']:.3f}"
        print(f"   ratio TPE / optimum:   {r['ratio_own']:.3f} (TPE's own measurement), {by_grid} (the grid's)")
        print(f"   TPE measured:          {r['tpe_measured']} of {size} configurations ({r['tpe_share']:.0%})")
        print(f"   grid within 95%:       {r['within_95']} of {r['grid_feasible']} feasible "
              f"({r['within_95_share']:.0%} of the grid)")
        print(f"   passes on single measurements (>= 95% with <= 25% of the grid): {r['passes']}")
        print(f"   final round ({args.repeats} interleaved repeats, medians):")
        print(f"     optimum (grid's best): {r['final_optimum_params']}  {r['final_optimum']:,.0f} requests/$")
        print(f"     TPE's pick:            {r['final_tpe_params']}  {r['final_tpe']:,.0f} requests/$")
        print(f"     ratio TPE / optimum:   {r['final_ratio']:.3f}")
        print(f"   passes on the final round's medians: {r['final_passes']}")
    print(f"\nfinal round: every configuration's {args.repeats} measurements (requests per dollar)")
    table = pd.DataFrame([{**dict(k), **{f"{s}_{i + 1}": round(v[s][i]) for s in ("capacity", "utilization")
                                         for i in range(len(v[s]))}}
                          for k, v in medians.items()])
    print(table.to_string(index=False))
    print(f"\ngrid took {results['grid_seconds'] / 60:.1f} min, "
          f"final round {results['final_round']['seconds'] / 60:.1f} min")
    noise = results.get("incumbent_twice")
    if noise:
        print(f"noise: the incumbent measured twice in the grid run: {noise}")
    (out / "ground_truth.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    return 0


KEYS = ["max_batch_size", "max_queue_delay_microseconds"]


def _top(df: pd.DataFrame, scoring: str, k: int) -> pd.DataFrame:
    done = df[df[scoring].notna() & (df[scoring] > 0) & (df["state"] == "COMPLETE")]
    return done.sort_values(scoring, ascending=False).drop_duplicates(KEYS).head(k)


def final_candidates(grid: pd.DataFrame, tpe_frames: dict, k: int) -> dict[tuple, float | None]:
    """Each candidate's configuration (a hashable key) and a capacity speed to start its search at."""
    out: dict[tuple, float | None] = {}
    for scoring, tpe in tpe_frames.items():
        for df in (grid, tpe):
            for _, row in _top(df, scoring, k).iterrows():
                key = tuple((name, int(row[name])) for name in KEYS)
                speed = row.get("capacity_speed")
                out.setdefault(key, float(speed) if pd.notna(speed) and speed else None)
    return out


def final_round(evaluate_fn, candidates: dict[tuple, float | None], repeats: int) -> dict[tuple, dict]:
    """Measure every candidate `repeats` times, interleaved, unpruned; both scores of each run."""
    runs: dict[tuple, dict[str, list[float]]] = {k: {"capacity": [], "utilization": []} for k in candidates}
    with _bar(repeats * len(candidates), "final round") as bar:
        for _ in range(repeats):
            for key, speed in candidates.items():
                result = evaluate_fn(dict(key), Hints(start_speed=speed))
                for scoring in ("capacity", "utilization"):
                    runs[key][scoring].append(result.value(scoring))
                bar.update(1)
    return runs


def compare_final(grid: pd.DataFrame, tpe: pd.DataFrame, scoring: str, k: int, runs: dict, size: int) -> dict:
    import statistics

    def best_of(df: pd.DataFrame) -> tuple[dict, float]:
        keys = [tuple((name, int(row[name])) for name in KEYS) for _, row in _top(df, scoring, k).iterrows()]
        if not keys:
            return {}, 0.0
        key = max(keys, key=lambda key: statistics.median(runs[key][scoring]))
        return dict(key), statistics.median(runs[key][scoring])

    optimum_params, optimum = best_of(grid)
    tpe_params, tpe_value = best_of(tpe)
    measured = len({(r[KEYS[0]], r[KEYS[1]]) for _, r in tpe.iterrows()})
    ratio = tpe_value / optimum if optimum > 0 else 0.0
    return {"final_optimum_params": optimum_params, "final_optimum": optimum,
            "final_tpe_params": tpe_params, "final_tpe": tpe_value, "final_ratio": ratio,
            "final_passes": bool(ratio >= 0.95 and measured / size <= 0.25 + 1e-9)}


def incumbent_twice(grid: pd.DataFrame, incumbent: dict) -> dict:
    """The incumbent is trial 0 and also a grid point: two measurements of one configuration."""
    same = grid[(grid["max_batch_size"] == incumbent["max_batch_size"])
                & (grid["max_queue_delay_microseconds"] == incumbent["max_queue_delay_microseconds"])]
    return {s: [None if pd.isna(v) else round(float(v)) for v in same[s]] for s in ("capacity", "utilization")}


def scaled_copy(settings, time_scale: float, repo: Path) -> Path:
    """A copy of the study's model with another `time_scale` parameter (the template's own files are
    never changed)."""
    from tuner import modelconfig

    source = Path(settings.model_repository) / settings.model
    target = repo / settings.model
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target)
    config = modelconfig.load(target / "config.pbtxt")
    config.parameters["time_scale"].string_value = f"{time_scale:g}"
    (target / "config.pbtxt").write_text(modelconfig.to_text(config))
    return repo


def compare(grid: pd.DataFrame, tpe: pd.DataFrame, scoring: str, size: int) -> dict:
    keys = ["max_batch_size", "max_queue_delay_microseconds"]
    feasible = grid[grid[scoring].notna() & (grid[scoring] > 0)]
    best = feasible.loc[feasible[scoring].idxmax()]
    ranked_tpe = tpe[tpe[scoring].notna() & (tpe["state"] == "COMPLETE")]
    pick = ranked_tpe.loc[ranked_tpe[scoring].idxmax()] if len(ranked_tpe) else None
    in_grid = None
    if pick is not None:
        match = grid[(grid[keys[0]] == pick[keys[0]]) & (grid[keys[1]] == pick[keys[1]])]
        if len(match):
            in_grid = float(match[scoring].iloc[0]) if pd.notna(match[scoring].iloc[0]) else 0.0
    measured = len({(r[keys[0]], r[keys[1]]) for _, r in tpe.iterrows()})
    within = int((feasible[scoring] >= 0.95 * best[scoring]).sum())
    # TPE may pick a batch size between the grid's powers of two: then only its own measurement exists
    ratio_grid = in_grid / best[scoring] if in_grid is not None and in_grid > 0 else None
    ratio_own = (float(pick[scoring]) if pick is not None else 0.0) / best[scoring]
    return {
        "optimum_params": {k: int(best[k]) for k in keys},
        "optimum": float(best[scoring]),
        "tpe_params": {k: int(pick[k]) for k in keys} if pick is not None else None,
        "tpe_own": float(pick[scoring]) if pick is not None else 0.0,
        "tpe_in_grid": in_grid,
        "ratio_grid": ratio_grid,
        "ratio_own": ratio_own,
        "tpe_measured": measured,
        "tpe_share": measured / size,
        "grid_feasible": len(feasible),
        "within_95": within,
        "within_95_share": within / size,
        "passes": bool(ratio_own >= 0.95 and measured / size <= 0.25 + 1e-9),
        "passes_by_grid_measurement": None if ratio_grid is None else bool(ratio_grid >= 0.95),
    }


if __name__ == "__main__":
    sys.exit(main())
