"""Do a GPU's trade-offs show on a CPU? vLLM's knobs measured on the real CPU engine (`llm_vllm`) and on
the emulated GPU (`llm_sim`: the same engine, each step held to an A100's roofline time), same traffic.

    python benchmarks/llm_gpu_shape.py [--seqs 8,256] [--tokens 512,2048] [--time-scale 4]
                                       [--tolerance 0.1] [--max-steps 7] [--out DIR]

The LLM quick start's traffic (examples/llm_quickstart.yaml: the Azure conversation trace's busiest two
minutes at a quarter of their rate) and its capacity search, on each model in turn, one server each, for
every (max_num_seqs, max_num_batched_tokens) of the grid, chunked prefill on (the capacity searched to
--tolerance in --max-steps): the capacity (x the
load to serve), TTFT and TPOT at the recorded load (p50, p99) and output tokens per dollar at capacity
(each model priced as what it stands for: a CPU server, an A100-40GB). For llm_sim, the share of engine
steps the CPU ran past their emulated time (`tuner_emulated_gpu_overrun_steps_total`): where it is more
than a few per cent, the figures are the CPU's. A table per model, then the orders the two give the grid.
About 18 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.cost import price_for  # noqa: E402
from tuner.llm.engine_metrics import EngineSnapshot, engine_delta, read_engine  # noqa: E402
from tuner.server import make_launcher  # noqa: E402
from tuner.settings import CostSettings, read_study  # noqa: E402
from tuner.study import base_config, base_engine, study_traffic  # noqa: E402
from tuner.trial import Hints  # noqa: E402
from tuner.trial.run import make_evaluate  # noqa: E402

EXAMPLE = ROOT / "examples" / "llm_quickstart.yaml"
MODELS = {"llm_vllm": "cpu", "llm_sim": "a100-40gb"}  # the model, the price it stands for


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.2f}, {five:.2f}"


def study(out: Path, model: str, gpu: str, *, scale: float, capacity: dict) -> Path:
    """The quick start's study on `model`. An emulated GPU `scale` x slower (its `time_scale`, for a CPU
    too slow for the GPU's own step times) serves the traffic `scale` x slower, under SLA limits `scale`
    x longer, at a price `scale` x lower: the same GPU, in slow motion, with the same figures per dollar."""
    s = yaml.safe_load(EXAMPLE.read_text())
    s["name"] = f"gpu-shape-{model}"
    s["model"] = model
    templates = (EXAMPLE.parent / s["model_repository"]).resolve()
    s["traffic"]["path"] = str((EXAMPLE.parent / s["traffic"]["path"]).resolve())
    s["cost"] = {"gpu": gpu}
    s["search"]["capacity"].update(capacity)
    if model == "llm_sim":  # its time_scale set to `scale`, in a copy
        repository = out / "models"
        shutil.rmtree(repository, ignore_errors=True)
        shutil.copytree(templates / model, repository / model)  # the linked model.py copied as a file
        config = repository / model / "config.pbtxt"
        config.write_text(re.sub(r'(key: "time_scale" value: \{ string_value: )"[^"]*"', rf'\1"{scale:g}"',
                                 config.read_text()))
        templates = repository
    if scale != 1.0:
        s["traffic"]["speed"] /= scale
        s["sla"] = {**s["sla"], "ttft_ms": s["sla"]["ttft_ms"] * scale, "tpot_ms": s["sla"]["tpot_ms"] * scale}
        s["cost"]["price_per_hour"] = price_for(CostSettings(gpu=gpu)).price_per_hour / scale
    s["model_repository"] = str(templates)
    s["output"] = str(out / model)
    path = out / f"{model}.yaml"
    path.write_text(yaml.safe_dump(s, sort_keys=False))
    return path


def overruns(launcher, model: str) -> tuple[float, float]:
    """The emulated GPU's steps and overrun steps since the model's load (0, 0 on a real engine), read as
    `tuner replay` reads them."""
    with urllib.request.urlopen(launcher.endpoints.metrics, timeout=10) as response:
        figures = engine_delta(EngineSnapshot(), read_engine(response.read().decode(errors="replace"), model))
    return figures.emulated_steps, figures.emulated_overruns


def measure(path: Path, grid: list[dict], *, scale: float = 1.0) -> pd.DataFrame:
    """Each configuration of `grid` on the study's model, one server; latencies in the emulated GPU's
    own milliseconds (the measured / `scale`)."""
    settings = read_study(path)
    base, traffic = base_config(settings), study_traffic(settings)
    engine = base_engine(settings, base)
    rows = []
    with make_launcher(settings, load_models=False) as launcher:
        evaluate = make_evaluate(launcher, settings, base, traffic=traffic, engine=engine)
        for params in grid:
            started = time.monotonic()
            record = evaluate(params, Hints())
            steps, over = overruns(launcher, settings.model)  # this load of the model's (reloaded per trial)
            at = record.at_load
            rows.append({
                **params, "outcome": record.outcome,
                "capacity (x load)": round(record.capacity_speed / settings.traffic.speed, 2) if record.capacity else 0.0,
                **{f"{name} {q}": round(figures.get(q) / scale, 1) if at and figures.get(q) is not None else None
                   for name, figures in (("TTFT", at.ttft_ms if at else {}), ("TPOT", at.tpot_ms if at else {}))
                   for q in ("p50", "p99")},
                "M tokens/$": round((record.scores.get("capacity") or 0.0) / 1e6, 2),
                "overrun steps": f"{over:.0f}/{steps:.0f}" if steps else "-",
                "s": round(time.monotonic() - started), "load": load()})
            print(f"  {settings.model} {params}: {rows[-1]}", flush=True)
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqs", default="8,256", help="max_num_seqs values")
    parser.add_argument("--tokens", default="512,2048", help="max_num_batched_tokens values")
    parser.add_argument("--models", default=",".join(MODELS), help="templates to measure, comma-separated")
    parser.add_argument("--tolerance", type=float, default=0.1, help="the capacity search's (the quick start's 0.25)")
    parser.add_argument("--max-steps", type=int, default=7, help="the capacity search's (the quick start's 5)")
    parser.add_argument("--time-scale", type=float, default=4.0,
                        help="llm_sim's time_scale (the traffic, SLA and price scaled with it)")
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
        scale = args.time_scale if model == "llm_sim" else 1.0
        capacity = {"tolerance": args.tolerance, "max_steps": args.max_steps}
        tables[model] = measure(study(out, model, MODELS[model], scale=scale, capacity=capacity), grid, scale=scale)
        print(f"\n{model} ({MODELS[model]} prices{f', time_scale {scale:g}' if scale != 1 else ''}), ms:")
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
