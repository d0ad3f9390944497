"""Do a GPU's trade-offs show on a CPU? vLLM's knobs measured on the real CPU engine (`llm_vllm`) and on
the emulated GPU (`llm_sim`: the same engine, each step held to an A100's roofline time), same traffic.

    python benchmarks/llm_gpu_shape.py [--seqs 8,256] [--tokens 512,2048] [--out DIR]

The LLM quick start's traffic (examples/llm_quickstart.yaml: the Azure conversation trace's busiest two
minutes at a quarter of their rate) and its capacity search, on each model in turn, one server each, for
every (max_num_seqs, max_num_batched_tokens) of the grid, chunked prefill on: the capacity (x the
load to serve), TTFT and TPOT at the recorded load (p50, p99) and output tokens per dollar at capacity
(each model priced as what it stands for: a CPU server, an A100-40GB). For llm_sim, the share of engine
steps the CPU ran past their emulated time (`tuner_emulated_gpu_overrun_steps_total`): where it is more
than a few per cent, the figures are the CPU's. A table per model, then the orders the two give the grid.
About 15 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.server import make_launcher  # noqa: E402
from tuner.settings import read_study  # noqa: E402
from tuner.study import base_config, base_engine, study_traffic  # noqa: E402
from tuner.trial import Hints  # noqa: E402
from tuner.trial.run import make_evaluate  # noqa: E402

EXAMPLE = ROOT / "examples" / "llm_quickstart.yaml"
MODELS = {"llm_vllm": "cpu", "llm_sim": "a100-40gb"}  # the model, the price it stands for


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.2f}, {five:.2f}"


def study(out: Path, model: str, gpu: str) -> Path:
    s = yaml.safe_load(EXAMPLE.read_text())
    s["name"] = f"gpu-shape-{model}"
    s["model"] = model
    s["model_repository"] = str((EXAMPLE.parent / s["model_repository"]).resolve())
    s["traffic"]["path"] = str((EXAMPLE.parent / s["traffic"]["path"]).resolve())
    s["cost"] = {"gpu": gpu}
    s["output"] = str(out / model)
    path = out / f"{model}.yaml"
    path.write_text(yaml.safe_dump(s, sort_keys=False))
    return path


def overruns(launcher) -> tuple[float, float]:
    """The emulated GPU's steps and overrun steps so far (0, 0 on a real engine)."""
    m = launcher.metrics()
    return m.get("tuner_emulated_gpu_steps_total", 0.0), m.get("tuner_emulated_gpu_overrun_steps_total", 0.0)


def measure(path: Path, grid: list[dict]) -> pd.DataFrame:
    settings = read_study(path)
    base, traffic = base_config(settings), study_traffic(settings)
    engine = base_engine(settings, base)
    rows = []
    with make_launcher(settings, load_models=False) as launcher:
        evaluate = make_evaluate(launcher, settings, base, traffic=traffic, engine=engine)
        for params in grid:
            started = time.monotonic()
            record = evaluate(params, Hints())
            steps, over = overruns(launcher)  # counters of this load of the model (reloaded per trial)
            at = record.at_load
            rows.append({
                **params, "outcome": record.outcome,
                "capacity (x load)": round(record.capacity_speed / settings.traffic.speed, 2) if record.capacity else 0.0,
                "TTFT p50": at.ttft_ms.get("p50") if at else None, "TTFT p99": at.ttft_ms.get("p99") if at else None,
                "TPOT p50": at.tpot_ms.get("p50") if at else None, "TPOT p99": at.tpot_ms.get("p99") if at else None,
                "M tokens/$": round((record.scores.get("capacity") or 0.0) / 1e6, 2),
                "overrun steps": f"{over:.0f}/{steps:.0f}" if steps else "-",
                "s": round(time.monotonic() - started), "load": load()})
            print(f"  {settings.model} {params}: {rows[-1]}", flush=True)
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", default="8,256", help="max_num_seqs values")
    parser.add_argument("--tokens", default="512,2048", help="max_num_batched_tokens values")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--out", default="/tmp/llm-gpu-shape")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    grid = [{"max_num_seqs": s, "max_num_batched_tokens": t, "enable_chunked_prefill": True}
            for s, t in itertools.product((int(v) for v in args.seqs.split(",")),
                                          [int(v) for v in args.tokens.split(",")])]
    print(f"start {time.strftime('%Y-%m-%d %H:%M:%S')} (load {load()})", flush=True)
    tables = {}
    for model in args.models.split(","):
        tables[model] = measure(study(out, model, MODELS[model]), grid)
        print(f"\n{model} ({MODELS[model]} prices), ms:")
        print(tables[model].to_string(index=False), flush=True)
    if len(tables) == 2:
        a, b = (tables[m] for m in tables)
        order = pd.DataFrame({"config": [f"({r.max_num_seqs}, {r.max_num_batched_tokens})" for r in a.itertuples()],
                              **{f"{m} rank": t["M tokens/$"].rank(ascending=False).astype(int) for m, t in tables.items()}})
        print("\nthe grid's order in tokens per dollar on each:")
        print(order.to_string(index=False))
    print(f"\nend {time.strftime('%H:%M:%S')} (load {load()})")


if __name__ == "__main__":
    main()
