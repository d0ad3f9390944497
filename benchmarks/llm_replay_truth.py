"""The replay's TTFT and TPOT against vLLM's own histograms of the same requests, at several loads.

    python benchmarks/llm_replay_truth.py [--speeds 0.25,0.5,1] [--duration 60] [--trace PATH] [--model llm_sim]

One tritonserver serves model_repository_templates/llm_vllm (vLLM's CPU build, the tiny model; or
`--model llm_sim`: the same engine with each step held to an emulated A100's time, so that TTFT has a
GPU's magnitude and the serving path's few milliseconds a GPU's share of it). For
each speed, `tuner.trial.generate.replay_generate` streams the trace's busiest `--duration` seconds
(rows whose prompt and output fit the tiny model's 2,048-token context) and reads the engine's `vllm:`
series on Triton's /metrics before and after. Printed per speed, for TTFT (from the due time) and TPOT
((last - first token) / (tokens - 1), per request): the replay's exact p50 / p99, the same requests'
values put through the engine's buckets (Prometheus's histogram_quantile, so that only the measurement
differs, not the bucket resolution), the engine's, and the difference of the bucketed replay from the
engine, with the machine's load. Acceptance (issue 28): within 5 % at p50 and 10 % at p99.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.llm.engine_metrics import TPOT, TTFT, Histogram  # noqa: E402
from tuner.llm.tiny import tiny_model  # noqa: E402
from tuner.server import make_launcher  # noqa: E402
from tuner.settings import ReplaySettings, SlaSettings, StudySettings, TrafficSettings  # noqa: E402
from tuner.study import study_traffic  # noqa: E402
from tuner.traffic import busiest_window, window  # noqa: E402
from tuner.trial.generate import replay_generate  # noqa: E402

CONTEXT = 2048  # the tiny model's


def bucketed(values_ms: np.ndarray, like: Histogram, q: float) -> float:
    """The q-quantile of `values_ms` through `like`'s buckets, as Prometheus computes it (ms)."""
    return like.binned(np.asarray(values_ms, dtype=float) / 1e3).quantile(q) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--speeds", default="0.25,0.5,1")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--trace", default=str(ROOT / "traffic_profiles" / "azure_llm_2023_conv.csv"))
    parser.add_argument("--model", choices=("llm_vllm", "llm_sim"), default="llm_vllm")
    args = parser.parse_args()
    speeds = [float(s) for s in args.speeds.split(",")]
    tiny_model()
    # the stub imports tuner (the tiny model's name) from this checkout
    os.environ["TUNER_MODEL_PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("TUNER_MODEL_PYTHONPATH", "")) if p)
    settings = StudySettings(name="truth", model_repository=str(ROOT / "model_repository_templates"),
                             model=args.model, traffic=TrafficSettings(path=args.trace),
                             replay=ReplaySettings(warmup_s=0.0, lag_budget_ms=100.0, request_timeout_s=600.0),
                             sla=SlaSettings(ttft_ms=1000.0, tpot_ms=200.0))
    traffic = study_traffic(settings)
    traffic = traffic[traffic["prompt_tokens"] + traffic["output_tokens"] <= CONTEXT].reset_index(drop=True)
    start, count = busiest_window(traffic, args.duration)
    part = window(traffic, start, args.duration)
    print(f"model: {args.model}; trace: {Path(args.trace).name}, busiest {args.duration:g} s of the rows that fit {CONTEXT} tokens: "
          f"{count} requests, prompt median {int(part['prompt_tokens'].median())}, "
          f"output median {int(part['output_tokens'].median())}")
    print(f"{'speed':>5} {'what':>4} {'n':>5}  {'replay p50':>10} {'bucketed':>9} {'engine':>9} {'diff':>7}"
          f"  {'replay p99':>10} {'bucketed':>9} {'engine':>9} {'diff':>7}  {'mean diff':>9}  load (1, 5 min)")
    with make_launcher(settings) as launcher:
        for speed in speeds:
            run = replay_generate(launcher, dataclasses.replace(settings), part, speed=speed)
            load = ", ".join(f"{x:.2f}" for x in os.getloadavg()[:2])
            if run.engine is None:
                sys.exit(f"the server reports no vllm: series for {args.model}")
            for what, values, name in (("TTFT", run.whole.ttfts_ms, TTFT), ("TPOT", run.whole.tpots_ms, TPOT)):
                hist = run.engine.seconds(name)
                cells = []
                for q in (0.5, 0.99):
                    exact = float(np.percentile(values, q * 100)) if len(values) else float("nan")
                    ours = bucketed(values, hist, q)
                    theirs = hist.quantile(q) * 1e3
                    cells.append(f"{exact:10.2f} {ours:9.2f} {theirs:9.2f} {ours / theirs - 1:+7.1%}")
                mean_diff = float(np.mean(values)) / (hist.mean() * 1e3) - 1 if len(values) else float("nan")
                print(f"{speed:5g} {what:>4} {len(values):5d}  {cells[0]}  {cells[1]}  {mean_diff:+9.1%}  {load}")
            print(f"{'':5} errors {run.whole.errors} of {run.whole.requests}, engine counted "
                  f"{run.engine.requests:.0f} requests, {run.engine.preemptions:.0f} preemptions"
                  + (f", emulated steps run late {run.engine.overrun_share:.1%}" if run.engine.emulated_steps else "")
                  + "; "
                  f"send lag p99 {run.whole.send_lag_ms.get('p99', float('nan')):.2f} ms"
                  + (f"; first error: {run.first_error[:200]}" if run.first_error else ""))


if __name__ == "__main__":
    main()
