"""Simulator fidelity on real Triton: does the simulation predict what the real server measures?

    python benchmarks/simulator_fidelity.py [examples/grid.yaml] [--grid DIR] [--profile P]
                                            [--output runs/fidelity] [--landscape] [--preferred S]
    python benchmarks/simulator_fidelity.py --merge OUTPUT [OUTPUT ...]

1. The measured grid: every configuration of the study's space measured on a real local Triton by
   `tuner tune` on a copy of the study scored by utilization (OUTPUT/grid; about 45-60 minutes on 2
   cores for examples/grid.yaml's 60 points): a utilization-scored search never prunes, so every
   configuration gets its full capacity search, and both scores are measured either way. Or an
   existing `tuner tune` output directory of the study (`--grid DIR`, its trials.csv): a capacity-scored
   one prunes, and a pruned trial's capacity is only a bracket (the last passing and the first failing
   speed); those are checked against their bracket and left out of the capacity figures.
2. The profile: `tuner profile STUDY -o OUTPUT/profile.csv` (about a minute), or `--profile P`.
3. Every measured configuration simulated as a trial is measured (`tuner.simulate.Simulator.trial`: the
   step at the recorded load, then the same capacity bisection, with the study's tolerance).
4. Per point: capacity measured and simulated and the error; the SLA's percentile at the recorded load;
   fill rate; both scores. Then the figures the goal names: capacity's median absolute error over the
   configurations feasible in both (goal <= 10 %), and over every verdict by the model strategy's rule
   (`tuner.search.relative_error`: simulated feasible but measured infeasible = 100 %, a pruned trial
   by its bracket); the Spearman rank correlation of the scoring's requests per dollar over every point
   (infeasible = 0, tied) and over the points feasible in both (goal >= 0.9 for both), the pairs the
   server orders the other way (`tuner.search.order_agreement`), the same for utilization scoring, the
   SLA verdicts that agree (goal >= 90 %), and what the simulation's favourite measured.

`--preferred none|max|powers_of_two` sets the study's `search.preferred_batch_size` (for the grid it
measures and the simulation alike): a space's preferred-size half is its own grid, as a searched
strategy would triple the grid. `--merge` prints the figures over several outputs' fidelity.csv together
(the halves of one space, measured with one profile: pass `--profile`) and writes OUTPUT/merged.json
into the first.

`--landscape` also ranks the study's whole space in simulation (every batch size) and writes it as
`simulation.csv` (and `tuner report` then shows the simulated landscape) into the grid's directory when
this script measured it, else into OUTPUT. Results: OUTPUT/fidelity.csv and OUTPUT/fidelity.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy.stats import spearmanr

from tuner import space as knobs
from tuner.cost import price_for
from tuner.search import order_agreement, relative_error
from tuner.settings import read_study
from tuner.simulate import Simulator, batcher_config, read_profile
from tuner.study import base_config, study_traffic

ROOT = Path(__file__).resolve().parent.parent
GOAL_ERROR, GOAL_SPEARMAN, GOAL_VERDICTS = 0.10, 0.9, 0.9


def tuner(*args: str) -> None:
    """Run the tuner command line (this checkout's), its progress on the terminal."""
    command = [sys.executable, "-m", "tuner", *args]
    print("$ " + " ".join(command[1:]), file=sys.stderr, flush=True)
    # this checkout first, the caller's own path after it (where tuner's dependencies may live)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    result = subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": path})
    if result.returncode not in (0, 3):  # 3: no configuration met the SLA, still a measured grid
        sys.exit(f"tuner {args[0]} failed with exit code {result.returncode}")


def unpruned_copy(study: Path, out: Path, *, preferred: str | None = None) -> Path:
    """The study file scored by utilization (which never prunes), its paths made absolute, with a
    minimal final re-measurement (it decides nothing here)."""
    data = yaml.safe_load(study.read_text())
    if preferred is not None:
        data["search"]["preferred_batch_size"] = preferred
    here = study.resolve().parent
    data["model_repository"] = str((here / data["model_repository"]).resolve())
    data["traffic"]["path"] = str((here / data["traffic"]["path"]).resolve())
    data["scoring"] = "utilization"
    data["search"].update(top_k=1, remeasure_repeats=1)
    data["output"] = str((out / "grid").resolve())
    data["name"] = f"{data.get('name', 'grid')}-unpruned"
    path = out / "grid-unpruned.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def measured_points(grid: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The grid's measured trials (parameters, the SLA verdict at load, capacity, latency at load,
    fill rate, scores), and those left out: no verdict (unstable, unmeasured, crashed, failed)."""
    trials = pd.read_csv(grid / "trials.csv")
    keep = trials["state"].isin(("COMPLETE", "PRUNED")) & trials["latency_p99_ms"].notna()
    measured = trials[keep].reset_index(drop=True)
    # a pruned trial met the SLA at load (it was pruned in its capacity search): `feasible` says no
    measured["feasible"] = measured["sla_met"].astype(str).str.lower().eq("true") if "sla_met" in measured \
        else measured["feasible"]
    return measured, trials[~keep].reset_index(drop=True)


def defaults(settings) -> dict:
    """What a configuration leaves to the base config (as `tuner simulate` fills them)."""
    base = base_config(settings)
    space = settings.search
    return {"preferred": space.preferred_batch_size if space.preferred_batch_size in knobs.STRATEGIES else "none",
            "base_preferred": tuple(base.dynamic_batching.preferred_batch_size) or None,
            "instance_count": int(base.instance_group[0].count or 1) if len(base.instance_group) else 1,
            "max_queue_size": int(base.dynamic_batching.default_queue_policy.max_queue_size)}


def params_of(row: pd.Series) -> dict:
    params = {}
    for name in knobs.NAMES:
        if name in row and pd.notna(row[name]):
            value = row[name]
            params[name] = int(value) if isinstance(value, (int, float, np.integer, np.floating)) else value
    return params


def compare(settings, measured: pd.DataFrame, sim: Simulator, fill: dict) -> pd.DataFrame:
    """Each measured point beside its simulated trial."""
    pct = f"latency_p{settings.sla.percentile:g}_ms"
    rows = []
    started = time.monotonic()
    for _, m in measured.iterrows():
        params = params_of(m)
        record = sim.trial(batcher_config(params, **fill))
        s_load = record.at_load
        feasible = bool(m["feasible"])
        rows.append({
            **{k: v for k, v in params.items()},
            **{k: fill[f] for k, f in (("preferred_batch_size", "preferred"), ("instance_count", "instance_count"),
                                       ("max_queue_size", "max_queue_size")) if k not in params},
            "trial": int(m["number"]),
            "pruned": m["state"] == "PRUNED",  # its capacity search stopped early: a lower bound
            "feasible_measured": feasible,
            "feasible_simulated": bool(record.meets_sla),
            "capacity_measured": float(m["capacity_rps"]) if feasible and pd.notna(m["capacity_rps"]) else 0.0,
            "capacity_upper_measured": float(m["capacity_upper_rps"]) if feasible
            and pd.notna(m.get("capacity_upper_rps")) else math.nan,
            "capacity_simulated": float(record.capacity_rps or 0.0),
            "latency_measured": float(m[pct] if pct in m else m["latency_p99_ms"]),
            # None: no request completed at the recorded load (all refused)
            "latency_simulated": float(s_load.latency_ms.get(f"p{settings.sla.percentile:g}") or math.nan),
            "fill_measured": float(m["fill_rate"]),
            "fill_simulated": float(s_load.fill_rate),
            # per execution at the load: Triton's compute (input + infer + output) against the simulated
            # instance's hold (its host work and device time, and any wait for the device)
            "compute_measured": float(m["compute_ms"]) if "compute_ms" in m and pd.notna(m["compute_ms"]) else math.nan,
            "compute_simulated": float(s_load.compute_ms or math.nan),
            "capacity_score_measured": float(m["score_capacity"]) if feasible and pd.notna(m["score_capacity"]) else 0.0,
            "capacity_score_simulated": float(record.scores.get("capacity") or 0.0),
            "utilization_measured": float(m["score_utilization"]) if feasible and pd.notna(m["score_utilization"])
            else 0.0,
            "utilization_simulated": float(record.scores.get("utilization") or 0.0)
            if record.meets_sla else 0.0,
        })
    table = pd.DataFrame(rows)
    # the model strategy's rule (`tuner.search.relative_error`): a verdict the server refutes is a 100 %
    # error, not a point dropped; a pruned trial's capacity lies in its bracket, the simulation is as
    # right as the bracket can say when it falls inside, else off by the distance to the nearer edge
    lo, hi, sim_cap = table["capacity_measured"], table["capacity_upper_measured"], table["capacity_simulated"]
    table["in_bracket"] = table["pruned"] & sim_cap.ge(lo) & (sim_cap.le(hi) | hi.isna())
    table.loc[table["pruned"], "capacity_score_measured"] = np.nan  # a lower bound, not a score
    # (a complete trial by its lower edge: both sides bisected at the same tolerance here, edge to edge)
    table["capacity_error"] = [relative_error(r.capacity_simulated, r.capacity_measured, pruned=r.pruned,
                                              upper=None if pd.isna(r.capacity_upper_measured) or not r.pruned
                                              else r.capacity_upper_measured) for r in table.itertuples()]
    table["latency_error"] = table["latency_simulated"] / table["latency_measured"] - 1
    table["utilization_error"] = [relative_error(r.utilization_simulated, r.utilization_measured)
                                  for r in table.itertuples()]
    print(f"simulated {len(table)} configurations in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return table


def figures(table: pd.DataFrame) -> dict:
    """The goal's figures and the search-level ones."""
    out = {"points": len(table),
           "feasible_measured": int(table["feasible_measured"].sum()),
           "feasible_simulated": int(table["feasible_simulated"].sum()),
           "sla_verdicts_agree": int((table["feasible_measured"] == table["feasible_simulated"]).sum())}
    pruned = table["pruned"]
    out["pruned"] = int(pruned.sum())
    out["pruned_in_bracket"] = int(table["in_bracket"].sum())
    out["refuted"] = int((table["feasible_simulated"] & ~table["feasible_measured"]).sum())
    both_feasible = table["feasible_measured"] & table["feasible_simulated"] & ~pruned
    for name, score, error in (("capacity", "capacity_score", "capacity_error"),
                               ("utilization", "utilization", "utilization_error")):
        known = table[table[f"{score}_measured"].notna()]  # capacity: the unpruned points
        errors = table.loc[both_feasible, error].dropna().abs()  # comparable with the earlier figures
        every = table[error].dropna().abs()  # a refuted verdict = 100 %, pruned by their bracket
        rho = (spearmanr(known[f"{score}_measured"], known[f"{score}_simulated"]).statistic
               if known[f"{score}_measured"].nunique() > 1 and known[f"{score}_simulated"].nunique() > 1 else math.nan)
        both = known[f"{score}_measured"].gt(0) & known[f"{score}_simulated"].gt(0)
        rho_both = (spearmanr(known.loc[both, f"{score}_measured"], known.loc[both, f"{score}_simulated"]).statistic
                    if both.sum() >= 3 else math.nan)
        order = order_agreement(known[f"{score}_simulated"], known[f"{score}_measured"], tolerance=GOAL_ERROR)
        pick = known.loc[known[f"{score}_simulated"].idxmax()]
        best = known[f"{score}_measured"].max()
        out[name] = {
            "median_abs_error": float(errors.median()) if len(errors) else math.nan,
            "p90_abs_error": float(errors.quantile(0.9)) if len(errors) else math.nan,
            "compared": int(len(errors)), "ranked": int(len(known)), "feasible_in_both": int(both.sum()),
            "median_abs_error_every_verdict": float(every.median()) if len(every) else math.nan,
            "p90_abs_error_every_verdict": float(every.quantile(0.9)) if len(every) else math.nan,
            "compared_every_verdict": int(len(every)),
            "spearman": float(rho), "spearman_feasible_in_both": float(rho_both),
            "pairs": order.pairs, "pairs_discordant": order.discordant,
            "simulation_pick": {k: pick[k] if isinstance(pick[k], str) else int(pick[k]) for k in knobs.NAMES
                                if k in pick and pd.notna(pick[k])},
            "pick_measured_over_optimum": float(pick[f"{score}_measured"] / best) if best > 0 else math.nan,
        }
    out["latency_median_abs_error"] = float(table["latency_error"].abs().median())
    return out


def print_table(table: pd.DataFrame, pct: str) -> None:
    knobs_shown = {"mbs": table["max_batch_size"], "delay_us": table["max_queue_delay_microseconds"]}
    for name, label in (("instance_count", "inst"), ("max_queue_size", "queue"), ("preferred_batch_size", "preferred")):
        if name in table and table[name].nunique() > 1:  # the wider space's knobs, where they vary
            knobs_shown[label] = table[name]
    shown = pd.DataFrame({
        **knobs_shown,
        "trial": table["trial"].astype(str) + np.where(table["pruned"], " (pruned)", ""),
        "feasible m/s": [f"{'y' if a else 'n'}/{'y' if b else 'n'}"
                         for a, b in zip(table["feasible_measured"], table["feasible_simulated"], strict=True)],
        "cap meas": table["capacity_measured"].map("{:.1f}".format),
        "cap sim": table["capacity_simulated"].map("{:.1f}".format),
        "cap err": [("in bracket" if b else f"bracket {lo:.1f}-{hi:.1f}") if p else ("-" if pd.isna(v) else f"{v:+.1%}")
                    for v, p, b, lo, hi in zip(table["capacity_error"], table["pruned"], table["in_bracket"],
                                               table["capacity_measured"], table["capacity_upper_measured"],
                                               strict=True)],
        f"{pct} meas": table["latency_measured"].map("{:.0f}".format),
        f"{pct} sim": table["latency_simulated"].map("{:.0f}".format),
        "fill meas": table["fill_measured"].map("{:.2f}".format),
        "fill sim": table["fill_simulated"].map("{:.2f}".format),
        "exec ms meas": table["compute_measured"].map("{:.1f}".format),
        "exec ms sim": table["compute_simulated"].map("{:.1f}".format),
        "util req/$ meas": table["utilization_measured"].map("{:,.0f}".format),
        "util req/$ sim": table["utilization_simulated"].map("{:,.0f}".format),
        "util err": table["utilization_error"].map(lambda v: "-" if pd.isna(v) else f"{v:+.1%}"),
    })
    print(shown.sort_values(list(knobs_shown)).to_string(index=False))


def print_figures(f: dict) -> None:
    c, u = f["capacity"], f["utilization"]
    ok_err = c["median_abs_error"] <= GOAL_ERROR
    ok_rho, ok_both = c["spearman"] >= GOAL_SPEARMAN, c["spearman_feasible_in_both"] >= GOAL_SPEARMAN
    agree = f["sla_verdicts_agree"] / f["points"] if f["points"] else math.nan
    rows = [
        ("capacity: median absolute error (feasible in both)", f"{c['median_abs_error']:.1%} over {c['compared']}",
         f"<= {GOAL_ERROR:.0%}: {'met' if ok_err else 'MISSED'}"),
        ("capacity: p90 absolute error (feasible in both)", f"{c['p90_abs_error']:.1%}", ""),
        ("capacity: median / p90 absolute error, every verdict (refuted = 100 %, pruned by bracket)",
         f"{c['median_abs_error_every_verdict']:.1%} / {c['p90_abs_error_every_verdict']:.1%} over "
         f"{c['compared_every_verdict']}", ""),
        ("capacity scoring: Spearman, every point (infeasible = 0, ties)", f"{c['spearman']:.3f} over {c['ranked']}",
         f">= {GOAL_SPEARMAN}: {'met' if ok_rho else 'MISSED'}"),
        ("capacity scoring: Spearman, feasible in both", f"{c['spearman_feasible_in_both']:.3f} over "
         f"{c['feasible_in_both']}", f">= {GOAL_SPEARMAN}: {'met' if ok_both else 'MISSED'}"),
        (f"capacity scoring: pairs measured in the other order by > {GOAL_ERROR:.0%}",
         f"{c['pairs_discordant']} of {c['pairs']}", ""),
        ("capacity scoring: the simulation's pick, measured / measured optimum",
         f"{c['pick_measured_over_optimum']:.3f} {c['simulation_pick']}", ""),
        ("utilization score: median absolute error (feasible in both)", f"{u['median_abs_error']:.1%} over "
         f"{u['compared']}", ""),
        ("utilization score: median absolute error, every verdict (refuted = 100 %)",
         f"{u['median_abs_error_every_verdict']:.1%} over {u['compared_every_verdict']}", ""),
        ("utilization scoring: Spearman, every point", f"{u['spearman']:.3f} over {u['ranked']}", ""),
        ("utilization scoring: Spearman, feasible in both", f"{u['spearman_feasible_in_both']:.3f} over "
         f"{u['feasible_in_both']}", ""),
        (f"utilization scoring: pairs measured in the other order by > {GOAL_ERROR:.0%}",
         f"{u['pairs_discordant']} of {u['pairs']}", ""),
        ("utilization scoring: the simulation's pick, measured / measured optimum",
         f"{u['pick_measured_over_optimum']:.3f} {u['simulation_pick']}", ""),
        ("SLA verdict at the recorded load agrees", f"{f['sla_verdicts_agree']} of {f['points']} "
         f"(feasible: measured {f['feasible_measured']}, simulated {f['feasible_simulated']}; "
         f"{f['refuted']} simulated feasible, measured not)",
         f">= {GOAL_VERDICTS:.0%}: {'met' if agree >= GOAL_VERDICTS else 'MISSED'}"),
        ("latency percentile at load: median absolute error", f"{f['latency_median_abs_error']:.1%}", ""),
    ]
    if f["pruned"]:
        rows.append(("pruned trials (capacity a bracket; out of the feasible-in-both figures, in the every-"
                     "verdict ones by their bracket): simulated capacity inside the bracket",
                     f"{f['pruned_in_bracket']} of {f['pruned']}", ""))
    print(pd.DataFrame(rows, columns=["figure", "value", "goal"]).to_string(index=False))


def landscape(settings, sim: Simulator, fill: dict, path: Path) -> None:
    """The whole space (every batch size x the grid's delays) ranked in simulation, as simulation.csv."""
    values = knobs.grid(settings.search)
    values["max_batch_size"] = list(range(settings.search.max_batch_size.low, settings.search.max_batch_size.high + 1))
    configs = [dict(zip(values, combo, strict=True)) for combo in itertools.product(*values.values())]
    started = time.monotonic()
    ranking = sim.rank(configs, **fill)
    ranking.to_csv(path, index=False)
    print(f"simulated the whole space ({len(configs)} configurations) in {time.monotonic() - started:.1f} s "
          f"-> {path}", file=sys.stderr)


def merge(outputs: list[Path]) -> int:
    """The figures over several outputs' points together (one space's halves)."""
    tables = [pd.read_csv(out / "fidelity.csv") for out in outputs]
    table = pd.concat(tables, ignore_index=True)
    print(f"{len(table)} points from {', '.join(f'{out} ({len(t)})' for out, t in zip(outputs, tables, strict=True))}")
    f = figures(table)
    print_figures(f)
    f.update(outputs=[str(out) for out in outputs], loadavg=os.getloadavg())
    (outputs[0] / "merged.json").write_text(json.dumps(f, indent=2, default=str) + "\n")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study", nargs="?", default=str(ROOT / "examples" / "grid.yaml"))
    parser.add_argument("--grid", type=Path, help="an existing `tuner tune` output of the study (its trials.csv)")
    parser.add_argument("--profile", type=Path, help="an existing profile CSV of the study's model")
    parser.add_argument("--output", type=Path, default=ROOT / "runs" / "fidelity")
    parser.add_argument("--landscape", action="store_true", help="also rank the whole space as simulation.csv")
    parser.add_argument("--preferred", choices=knobs.STRATEGIES, help="the study's search.preferred_batch_size")
    parser.add_argument("--merge", type=Path, nargs="+", metavar="OUTPUT", help="figures over these outputs together")
    args = parser.parse_args()
    if args.merge:
        return merge(args.merge)
    args.output = args.output.resolve()
    args.output.mkdir(parents=True, exist_ok=True)
    settings = read_study(args.study)
    if args.preferred:
        settings = dataclasses.replace(settings, search=dataclasses.replace(settings.search,
                                                                             preferred_batch_size=args.preferred))
    started = time.monotonic()
    grid = args.grid
    if grid is None:
        grid = args.output / "grid"
        tuner("tune", str(unpruned_copy(Path(args.study), args.output, preferred=args.preferred)))
    grid_s = time.monotonic() - started
    profile_path = args.profile
    if profile_path is None:
        profile_path = args.output / "profile.csv"
        tuner("profile", str(args.study), "-o", str(profile_path))
    profile_s = time.monotonic() - started - grid_s
    profile = read_profile(profile_path)
    measured, left_out = measured_points(grid)
    traffic = study_traffic(settings)
    sim = Simulator.for_study(settings, traffic, profile, price_per_hour=price_for(settings.cost).price_per_hour)
    fill = defaults(settings)
    table = compare(settings, measured, sim, fill)
    pct = f"p{settings.sla.percentile:g}"
    print(f"\nprofile: {profile_path}: {profile.describe()}")
    why = left_out["outcome"].fillna(left_out["state"]).value_counts().to_dict() if len(left_out) else {}
    print(f"grid: {grid} ({len(measured)} measured configurations"
          + (f"; left out, no verdict: {', '.join(f'{n} {k}' for k, n in why.items())}" if why else "") + ")")
    if len(left_out):
        print("left out: " + ", ".join(f"({int(r.max_batch_size)}, {int(r.max_queue_delay_microseconds)} us)"
                                       for r in left_out.itertuples()) + "\n")
    print_table(table, pct)
    print()
    f = figures(table)
    print_figures(f)
    table.to_csv(args.output / "fidelity.csv", index=False)
    f.update(grid=str(grid), profile=str(profile_path), left_out=len(left_out), grid_seconds=grid_s if args.grid is None else None,
             profile_seconds=profile_s if args.profile is None else None, loadavg=os.getloadavg())
    (args.output / "fidelity.json").write_text(json.dumps(f, indent=2, default=str) + "\n")
    if args.landscape:
        landscape(settings, sim, fill, (grid if args.grid is None else args.output) / "simulation.csv")
    print(f"\nload average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; results: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
