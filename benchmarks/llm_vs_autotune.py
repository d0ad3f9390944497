"""vLLM's auto-tune method against tuner's pick, on the same engine and the same recorded traffic.

    python benchmarks/llm_vs_autotune.py [--seqs 16,128] [--tokens 512,2048] [--e2e-ms 20000]
                                         [--repeats 2] [--out DIR]

vLLM's `benchmarks/auto_tune` grids `max_num_seqs` x `max_num_batched_tokens` with requests of one
fixed input and output length and keeps the combination with the highest throughput whose p99
end-to-end latency meets a limit. Both methods here run on the LLM quick start's engine and traffic
(examples/llm_quickstart.yaml: the tiny model in vLLM's CPU build inside Triton, the Azure conversation
trace's busiest two minutes), under the same SLA (p99 end to end <= --e2e-ms, as auto-tune's):

1. **auto-tune's method**: `tuner tune` with the grid sampler over the --seqs x --tokens grid, on the
   traffic with every request's prompt and output set to the window's *mean* lengths (the arrivals
   kept: tuner's capacity search stands in for auto-tune's request-rate sweep); its pick is the grid's
   best in output tokens per dollar at capacity;
2. **tuner**: `tuner tune` on the real trace (TPE, seed 0, as many trials as the grid has points, each
   knob's range spanning the grid's values on a log scale);
3. both picks measured again **on the real trace**, alternating, --repeats times each, on one server.

Printed: each method's pick, its score on the traffic it was chosen on, and its output tokens per dollar
on the real trace (median and each repeat), with the machine's load. Chunked prefill stays vLLM's
default (on) in both: auto-tune does not tune it. With the defaults, 31-36 minutes on 2 cores
(docs/llm-vs-autotune.md: 31 and 32 min with nothing else on the machine, 2026-12-04; 35 min 36 s,
2026-12-06; 43 min beside three other test runs, 2026-12-03).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.cli import main as tuner_main  # noqa: E402
from tuner.settings import read_study  # noqa: E402
from tuner.study import study_traffic  # noqa: E402
from tuner.trial import Hints  # noqa: E402
from tuner.trial.run import session  # noqa: E402

EXAMPLE = ROOT / "examples" / "llm_quickstart.yaml"
KNOBS = ("max_num_seqs", "max_num_batched_tokens")


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.2f}, {five:.2f}"


def study(out: Path, name: str, *, traffic: Path, e2e_ms: float, search: dict, args: argparse.Namespace) -> Path:
    """The quick start's study under the end-to-end SLA, with `search` and `traffic`, written to out/name.yaml."""
    s = yaml.safe_load(EXAMPLE.read_text())
    s["name"] = f"llm-vs-autotune-{name}"
    s["model_repository"] = str((EXAMPLE.parent / s["model_repository"]).resolve())
    s["traffic"]["path"] = str(traffic)
    s["sla"] = {"e2e_ms": e2e_ms, "percentile": 99, "max_error_rate": 0.001}
    s["search"] = {**search, "top_k": 1, "remeasure_repeats": 1,
                   "capacity": {**s["search"]["capacity"], "max_speed": args.max_speed, "max_steps": args.max_steps,
                                "tolerance": args.tolerance}}
    s["output"] = str(out / name)
    path = out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(s, sort_keys=False))
    return path


def tune(path: Path) -> dict:
    """Run `tuner tune` on the study; its summary.json."""
    started = time.monotonic()
    code = tuner_main(["tune", str(path)])
    if code not in (0, 10):  # 10: a change recommended
        raise SystemExit(f"tuner tune {path} exited {code}")
    summary = json.loads((Path(read_study(path).output) / "summary.json").read_text())
    print(f"  {path.stem}: {time.monotonic() - started:.0f} s (load {load()})", flush=True)
    return summary


def _median(values: list[float]) -> float:
    """The median of the measured repeats (NaN: none measured)."""
    kept = [v for v in values if not math.isnan(v)]
    return statistics.median(kept) if kept else math.nan


def pick(summary: dict) -> dict:
    return {k: summary["best"]["params"][k] for k in KNOBS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqs", default="16,128", help="auto-tune's max_num_seqs values (two)")
    parser.add_argument("--tokens", default="512,2048", help="auto-tune's max_num_batched_tokens values (two)")
    parser.add_argument("--e2e-ms", type=float, default=20000.0, help="the p99 end-to-end limit")
    parser.add_argument("--repeats", type=int, default=2, help="re-measurements of each pick on the real trace")
    parser.add_argument("--max-speed", type=float, default=32.0, help="the capacity search's highest speed")
    parser.add_argument("--max-steps", type=int, default=8, help="the capacity search's most steps")
    parser.add_argument("--tolerance", type=float, default=0.1, help="the capacity search's tolerance")
    parser.add_argument("--out", default="/tmp/llm-vs-autotune")
    args = parser.parse_args()
    seqs = sorted(int(v) for v in args.seqs.split(","))
    tokens = sorted(int(v) for v in args.tokens.split(","))
    if len(seqs) != 2 or len(tokens) != 2:
        raise SystemExit("--seqs and --tokens: two values each (the grid's corners)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"start {time.strftime('%Y-%m-%d %H:%M:%S')} (load {load()})", flush=True)

    real = (EXAMPLE.parent / yaml.safe_load(EXAMPLE.read_text())["traffic"]["path"]).resolve()
    # the mean lengths of the rows the study replays (its busiest window), put on every row
    window = study_traffic(read_study(study(out, "probe", traffic=real, e2e_ms=args.e2e_ms,
                                            search={"trials": 1, "max_num_seqs": {"low": 2, "high": 4}}, args=args)))
    means = {c: int(round(window[c].mean())) for c in ("prompt_tokens", "output_tokens")}
    frame = pd.read_csv(real)
    for column, value in means.items():
        frame[column] = value
    mean_csv = out / "mean_lengths.csv"
    frame.to_csv(mean_csv, index=False)
    print(f"mean lengths of the replayed window ({len(window)} requests): {means}", flush=True)

    grid = {"sampler": "grid", "trials": 4,
            "max_num_seqs": {"low": seqs[0], "high": seqs[1], "step": seqs[1] - seqs[0]},
            "max_num_batched_tokens": {"low": tokens[0], "high": tokens[1], "step": tokens[1] - tokens[0]}}
    own = {"sampler": "tpe", "seed": 0, "trials": 4,
           "max_num_seqs": {"low": seqs[0], "high": seqs[1], "log": True},
           "max_num_batched_tokens": {"low": tokens[0], "high": tokens[1], "log": True}}
    auto = tune(study(out, "autotune", traffic=mean_csv, e2e_ms=args.e2e_ms, search=grid, args=args))
    mine = tune(study(out, "tuner", traffic=real, e2e_ms=args.e2e_ms, search=own, args=args))
    picks = {"auto-tune method": pick(auto), "tuner": pick(mine)}
    print(f"picks: {picks}", flush=True)

    # both picks on the real trace, one server, alternating
    settings = read_study(out / "tuner.yaml")
    scores: dict[str, list[float]] = {name: [] for name in picks}
    distinct = {json.dumps(p, sort_keys=True): p for p in picks.values()}
    measured: dict[str, list[float]] = {key: [] for key in distinct}
    with session(settings) as evaluate:
        for k in range(args.repeats):
            for key, params in distinct.items():
                record = evaluate(params, Hints())
                # a repeat the load generator could not keep on time has no verdict: left out, not 0
                score = record.scores["capacity"] if record.outcome == "measured" else None
                measured[key].append(math.nan if score is None else score)
                print(f"  repeat {k + 1}: {params} -> {measured[key][-1] / 1e6:.2f} M tokens/$ "
                      f"({record.outcome}; load {load()})", flush=True)
    for name, params in picks.items():
        scores[name] = measured[json.dumps(params, sort_keys=True)]
    chosen_on = {"auto-tune method": auto, "tuner": mine}
    rows = [{"method": name, "max_num_seqs": p["max_num_seqs"], "max_num_batched_tokens": p["max_num_batched_tokens"],
             "M tokens/$ where chosen": round((chosen_on[name]["best"].get("per_dollar") or 0) / 1e6, 2),
             "M tokens/$ on the real trace (median)": round(_median(scores[name]) / 1e6, 2),
             "repeats": ", ".join(f"{v / 1e6:.2f}" for v in scores[name])} for name, p in picks.items()]
    print()
    print(pd.DataFrame(rows).to_string(index=False))
    ratio = _median(scores["tuner"]) / _median(scores["auto-tune method"])
    print(f"\ntuner's pick / auto-tune's pick on the real trace: {ratio:.3f}   (end {time.strftime('%H:%M:%S')}, "
          f"load {load()})")


if __name__ == "__main__":
    main()
