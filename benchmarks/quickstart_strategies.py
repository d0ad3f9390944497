"""The quick start, measured search against model-based search: the recommendation and the wall time of each.

    python benchmarks/quickstart_strategies.py [--output runs/quickstart-strategies] [--repeats 3]

Runs `tuner tune examples/quickstart.yaml` (TPE, 8 measured trials) and `tuner tune
examples/quickstart_model.yaml` (profile, the whole space simulated, 4 measured) one after the other,
each into a new output directory, and prints per strategy: wall time (the profile's share), the
configurations measured, the recommendation with its requests per dollar and improvement over the
incumbent (the tool's own re-measurement, against the incumbent of the same run). When the two
recommend different configurations, both and the incumbent are then measured `--repeats` times more,
interleaved on one server, so "same or better" is read from one round rather than from two runs'
separate noise. tritonserver must be installed already (run the quick start once): the install is not
the strategies' time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
STUDIES = {"measured (TPE)": ROOT / "examples" / "quickstart.yaml",
           "model": ROOT / "examples" / "quickstart_model.yaml"}
KEYS = ("max_batch_size", "max_queue_delay_microseconds")


def run_tune(study: Path, output: Path) -> tuple[float, float | None]:
    """`tuner tune STUDY --output OUTPUT`, its progress passed through; wall time and the profile's."""
    if output.exists():
        shutil.rmtree(output)
    command = [sys.executable, "-m", "tuner", "tune", str(study), "--output", str(output)]
    print("$ " + " ".join(command[1:]), file=sys.stderr, flush=True)
    started = time.monotonic()
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)  # the caller's after
    process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": path},
                               stderr=subprocess.PIPE, text=True, bufsize=1)
    profile_s = None
    for line in process.stderr:
        sys.stderr.write(line)
        found = re.search(r"profile: measured in (\d+) s", line)
        if found:
            profile_s = float(found.group(1))
    if process.wait() != 0:
        sys.exit(f"tuner tune {study.name} failed with exit code {process.returncode}")
    return time.monotonic() - started, profile_s


def row(name: str, summary: dict, wall_s: float, profile_s: float | None) -> dict:
    best, counts = summary["best"], summary["trials"]
    low, high = summary.get("improvement_range") or (None, None)
    return {"strategy": name, "wall": f"{wall_s // 60:.0f} min {wall_s % 60:.0f} s",
            "profile": "-" if profile_s is None else f"{profile_s:.0f} s",
            "measured": counts["complete"] + counts["pruned"],
            "recommended": f"({best['params'][KEYS[0]]}, {best['params'][KEYS[1]]} us)",
            "requests/$": f"{best['requests_per_dollar']:,.0f}",
            "over the incumbent": f"{summary['improvement']:+.1%}"
            + ("" if low is None else f" ({low:+.0%}..{high:+.0%})")}


def cross_check(configs: dict[str, dict], repeats: int, output: Path) -> pd.DataFrame:
    """Each configuration measured `repeats` times, interleaved, on one server (`search_ground_truth.py`'s
    final round): the medians of the quick start's scoring."""
    import search_ground_truth as ground_truth  # benchmarks/: this script's directory, first on sys.path

    from tuner.settings import read_study
    from tuner.trial.run import session

    settings = dataclasses.replace(read_study(STUDIES["measured (TPE)"]), output=str(output))
    keys = {name: tuple(params.items()) for name, params in configs.items()}
    with session(settings, log_dir=str(output / "server")) as evaluate_fn:
        runs = ground_truth.final_round(evaluate_fn, dict.fromkeys(keys.values()), repeats)
    values = {name: runs[key][settings.scoring] for name, key in keys.items()}
    return pd.DataFrame([{"configuration": name, "params": str(tuple(configs[name].values())),
                          "median requests/$": f"{statistics.median(v):,.0f}",
                          "runs": ", ".join(f"{x:,.0f}" for x in v)} for name, v in values.items()])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=ROOT / "runs" / "quickstart-strategies")
    parser.add_argument("--repeats", type=int, default=3, help="cross-check repeats when the picks differ")
    args = parser.parse_args()
    out = args.output.resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows, summaries = [], {}
    for name, study in STUDIES.items():
        target = out / study.stem
        wall_s, profile_s = run_tune(study, target)
        summaries[name] = json.loads((target / "summary.json").read_text())
        rows.append(row(name, summaries[name], wall_s, profile_s))
    print()
    print(pd.DataFrame(rows).to_string(index=False))
    picks = {name: s["best"]["params"] for name, s in summaries.items()}
    if len({tuple(p.values()) for p in picks.values()}) > 1:
        incumbent = summaries["model"]["incumbent"]["params"]
        print(f"\nthe recommendations differ: each, and the incumbent, measured {args.repeats} times more")
        print(cross_check({**{f"{n}'s pick": p for n, p in picks.items()}, "incumbent": incumbent},
                          args.repeats, out / "cross-check").to_string(index=False))
    else:
        print("\nboth recommend the same configuration")
    print(f"\nload average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; outputs: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
