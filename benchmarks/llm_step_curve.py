"""A GPU's measured step-time curve for a decoder, against the roofline the llm_sim template assumes.

    python benchmarks/llm_step_curve.py [--device cuda] [--output step-curve.json]   (on a GPU host)
    python benchmarks/llm_step_curve.py --fit step-curve.json                         (anywhere)
    python benchmarks/llm_step_curve.py --device cpu --shape tiny                     (a smoke test)

llm_sim holds each vLLM engine step to a roofline: time_scale x (overhead + max(weights + KV read x
context, compute x tokens)), its four numbers taken from a GPU's public specifications (an A100's, as
no GPU was at hand). This script measures the curve that roofline stands for, on the GPU it runs on:
one engine step of Llama-3-8B's shape (32 layers of 4096, 32 query and 8 KV heads of 128, MLP 14336,
vocabulary 128256; BF16, random weights: nothing is downloaded) in PyTorch, as vLLM runs it on a GPU:
  - decode steps of B sequences, each reading C tokens of KV cache (grouped-query attention), captured
    in a CUDA graph as vLLM's decode steps are, and eager beside them;
  - prefill steps of T prompt tokens (causal attention over the chunk), eager.
Every step's logits come from the last position of each sequence only, as vLLM computes them. Times:
CUDA events, the median of `--repeats` after `--warmup` runs. Not modelled: rotary embeddings, KV
writes, sampling and vLLM's Python scheduling (llm_sim's `step_overhead_ms` stands for those).

It prints and writes (JSON) each point's measured time beside two predictions: the roofline from the
GPU's public figures at the template's efficiencies (85 % of memory bandwidth, 60 % of BF16 matrix
throughput: `--bandwidth-gbs`, `--tflops`), and the roofline fitted to these measurements (the four
numbers llm_sim's config.pbtxt takes, least squares on relative error). `--fit FILE` redoes the fit and
the table from a written JSON without a GPU.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import os
import statistics
import sys
import time
import types
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import numpy as np

TEMPLATE = Path(__file__).resolve().parents[1] / "model_repository_templates" / "llm_vllm" / "1" / "model.py"

SHAPES = {  # layers, hidden, query heads, KV heads, head size, MLP, vocabulary
    "llama3-8b": (32, 4096, 32, 8, 128, 14336, 128256),
    "tiny": (2, 256, 8, 2, 32, 512, 1000),
}
DECODE = [(b, c) for c in (512, 2048) for b in (1, 8, 32, 64, 128, 256)]
PREFILL = [128, 512, 1024, 2048, 4096]
MEMORY_EFFICIENCY, COMPUTE_EFFICIENCY = 0.85, 0.60  # llm_sim's, for the A100 (its config.pbtxt)


@dataclass(frozen=True)
class Point:
    """One measured engine step: `tokens` computed, `context` KV-cache tokens read, its time (ms)."""

    kind: str  # decode | prefill
    sequences: int
    tokens: int
    context: int
    eager_ms: float
    graph_ms: float | None  # decode steps in a CUDA graph, as vLLM runs them

    @property
    def ms(self) -> float:
        return self.graph_ms if self.graph_ms is not None else self.eager_ms


def shape_figures(shape: str) -> dict[str, float]:
    """Bytes of weights read per step, KV bytes per context token, FLOPs per computed token (BF16)."""
    layers, hidden, heads, kv_heads, head, mlp, vocab = SHAPES[shape]
    per_layer = hidden * (heads + 2 * kv_heads) * head + heads * head * hidden + 3 * hidden * mlp
    params = layers * per_layer + hidden * vocab  # the embedding is gathered, not read whole
    return {"weight_bytes": 2.0 * params, "kv_bytes_per_token": 2.0 * 2 * layers * kv_heads * head,
            "flops_per_token": 2.0 * params}


def spec_roofline(shape: str, *, bandwidth_gbs: float, tflops: float, overhead_ms: float = 1.0) -> dict[str, float]:
    """llm_sim's four numbers from a GPU's public figures, at the template's efficiencies."""
    f = shape_figures(shape)
    bandwidth = bandwidth_gbs * 1e9 * MEMORY_EFFICIENCY
    return {"step_overhead_ms": overhead_ms, "weights_ms": f["weight_bytes"] / bandwidth * 1e3,
            "kv_us_per_token": f["kv_bytes_per_token"] / bandwidth * 1e6,
            "compute_us_per_token": f["flops_per_token"] / (tflops * 1e12 * COMPUTE_EFFICIENCY) * 1e6}


def template_model() -> types.ModuleType:
    """The llm_vllm template's model file (llm_sim's too) as a module, for its pure parts (`_StepTime`,
    the response order): Triton's triton_python_backend_utils, which only exists inside the server, is
    stubbed (as benchmarks/encoder_sim.emulation does), and the file's setting of vLLM's environment is
    undone (it is for the server's process)."""
    stub = sys.modules.setdefault("triton_python_backend_utils", types.ModuleType("triton_python_backend_utils"))
    if not hasattr(stub, "TRITONSERVER_RESPONSE_COMPLETE_FINAL"):
        stub.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    saved = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    spec = importlib.util.spec_from_file_location("llm_vllm_model", TEMPLATE)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = saved
    return module


def roofline_ms(params: dict[str, float], tokens: float, context: float) -> float:
    """llm_sim's step time at time_scale 1: the template's own `_StepTime` (not a copy of its formula)."""
    step_time = _step_time_class()
    return step_time([params[key] for key in step_time.KEYS[:-1]] + [1.0]).seconds(tokens, context) * 1e3


@functools.cache
def _step_time_class():
    return template_model()._StepTime


def fit_roofline(points: list[Point]) -> dict[str, float]:
    """The four numbers that best fit the measured steps (least squares on the relative error)."""
    from scipy.optimize import least_squares

    keys = ("step_overhead_ms", "weights_ms", "kv_us_per_token", "compute_us_per_token")
    measured = np.array([p.ms for p in points])

    def residuals(x):
        params = dict(zip(keys, x, strict=True))
        return np.array([roofline_ms(params, p.tokens, p.context) for p in points]) / measured - 1.0

    # start where each term alone explains its own extreme: the max() leaves a term without gradient
    # while the other one rules, so a start far off can stay there
    smallest = float(min(measured))
    most_tokens = max(points, key=lambda p: (p.tokens, p.ms))
    most_context = max(points, key=lambda p: (p.context if p.kind == "decode" else -1, p.ms))
    start = np.array([0.1 * smallest, 0.9 * smallest,
                      max(1e3 * (most_context.ms - smallest) / max(most_context.context, 1), 1e-6),
                      1e3 * most_tokens.ms / most_tokens.tokens])
    fits = [least_squares(residuals, start * scale, bounds=(0, np.inf)) for scale in (0.5, 1.0, 2.0)]
    best = min(fits, key=lambda f: f.cost)
    return dict(zip(keys, (float(v) for v in best.x), strict=True))


def measure(shape: str, device: str, *, warmup: int, repeats: int, graphs: bool) -> list[Point]:
    """Each decode and prefill point's step time on `device` (see the module's text)."""
    import torch
    import torch.nn.functional as F

    layers, hidden, heads, kv_heads, head, mlp, vocab = SHAPES[shape]
    dtype = torch.bfloat16 if device != "cpu" else torch.float32
    torch.manual_seed(0)

    def weight(*size):
        return (torch.randn(*size, device=device, dtype=dtype) * 0.02)

    stack = [{"qkv": weight(hidden, (heads + 2 * kv_heads) * head), "o": weight(heads * head, hidden),
              "gate_up": weight(hidden, 2 * mlp), "down": weight(mlp, hidden),
              "n1": torch.ones(hidden, device=device, dtype=dtype), "n2": torch.ones(hidden, device=device, dtype=dtype)}
             for _ in range(layers)]
    lm_head = weight(hidden, vocab)
    decodes = DECODE if shape != "tiny" else [(b, c) for b, c in DECODE if b <= 32]
    prefills = PREFILL if shape != "tiny" else PREFILL[:2]
    most = max(b * c for b, c in decodes)
    # one layer's KV cache, read by every layer: at these sizes it is far beyond the L2 cache
    cache = torch.randn(2, most * kv_heads * head, device=device, dtype=dtype)
    group = heads // kv_heads

    def step(x, attend, last):
        for w in stack:
            h = F.rms_norm(x, (hidden,), w["n1"])
            q, k, v = (h @ w["qkv"]).split([heads * head, kv_heads * head, kv_heads * head], dim=-1)
            x = x + attend(q, k, v) @ w["o"]
            h = F.rms_norm(x, (hidden,), w["n2"])
            g, u = (h @ w["gate_up"]).chunk(2, dim=-1)
            x = x + (F.silu(g) * u) @ w["down"]
        return x[last] @ lm_head

    def decode_attention(b, c):
        k_cache = cache[0, : b * c * kv_heads * head].view(b, kv_heads, c, head)
        v_cache = cache[1, : b * c * kv_heads * head].view(b, kv_heads, c, head)

        def attend(q, k, v):  # one new token per sequence: its query heads as a group per KV head
            out = F.scaled_dot_product_attention(q.view(b, kv_heads, group, head), k_cache, v_cache)
            return out.reshape(b, heads * head)
        return attend

    def prefill_attention(t):
        def attend(q, k, v):
            q = q.view(1, t, heads, head).transpose(1, 2)
            k = k.view(1, t, kv_heads, head).transpose(1, 2).repeat_interleave(group, dim=1)
            v = v.view(1, t, kv_heads, head).transpose(1, 2).repeat_interleave(group, dim=1)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(t, heads * head)
        return attend

    def timed(fn) -> float:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            if device == "cpu":
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
            else:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
        return statistics.median(times)

    points = []
    total = len(decodes) + len(prefills)
    with torch.inference_mode():
        for i, (b, c) in enumerate(decodes, 1):
            x = torch.randn(b, hidden, device=device, dtype=dtype)
            attend, last = decode_attention(b, c), slice(None)
            eager = timed(partial(step, x, attend, last))
            graph_ms = None
            if graphs and device != "cpu":
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    step(x, attend, last)  # warm the allocator outside the capture
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    step(x, attend, last)
                graph_ms = timed(graph.replay)
                del graph
            points.append(Point("decode", b, b, b * c, eager, graph_ms))
            print(f"[{i}/{total}] decode {b} x {c}: {eager:.2f} ms eager"
                  + (f", {graph_ms:.2f} ms graphed" if graph_ms is not None else ""), file=sys.stderr, flush=True)
        for i, t in enumerate(prefills, len(decodes) + 1):
            x = torch.randn(t, hidden, device=device, dtype=dtype)
            attend = prefill_attention(t)
            eager = timed(partial(step, x, attend, slice(t - 1, t)))
            points.append(Point("prefill", 1, t, t, eager, None))
            print(f"[{i}/{total}] prefill {t}: {eager:.2f} ms", file=sys.stderr, flush=True)
    return points


def device_ceilings(device: str) -> dict[str, float]:
    """The GPU's measured copy bandwidth (GB/s) and BF16 matrix rate (TFLOP/s), for the record."""
    import torch

    if device == "cpu":
        return {}
    a = torch.empty(2 * 2**30, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    m = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)

    def best(fn, n=10):
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(n):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)

    copy_s = best(lambda: b.copy_(a))
    matmul_s = best(lambda: m @ m)
    return {"copy_gbs": 2 * a.numel() / copy_s / 1e9, "bf16_tflops": 2 * 8192**3 / matmul_s / 1e12,
            "name": torch.cuda.get_device_name()}


def table(points: list[Point], spec: dict[str, float], fitted: dict[str, float]) -> str:
    """Each point: measured, the spec's roofline and the fitted one, with their errors."""
    rows = [f"{'step':<18} {'tokens':>6} {'context':>8} {'eager ms':>9} {'graph ms':>9} "
            f"{'spec ms':>8} {'err':>6} {'fit ms':>8} {'err':>6}"]
    for p in points:
        s, f = roofline_ms(spec, p.tokens, p.context), roofline_ms(fitted, p.tokens, p.context)
        name = f"decode {p.sequences}x{p.context // p.sequences}" if p.kind == "decode" else f"prefill {p.tokens}"
        graph = f"{p.graph_ms:9.2f}" if p.graph_ms is not None else f"{'-':>9}"
        rows.append(f"{name:<18} {p.tokens:>6} {p.context:>8} {p.eager_ms:9.2f} {graph} "
                    f"{s:8.2f} {s / p.ms - 1:+6.0%} {f:8.2f} {f / p.ms - 1:+6.0%}")
    return "\n".join(rows)


def summary(points: list[Point], spec: dict[str, float], fitted: dict[str, float]) -> dict[str, float]:
    def errors(params):
        return [abs(roofline_ms(params, p.tokens, p.context) / p.ms - 1) for p in points]
    return {"spec_median_abs_error": statistics.median(errors(spec)), "spec_max_abs_error": max(errors(spec)),
            "fit_median_abs_error": statistics.median(errors(fitted)), "fit_max_abs_error": max(errors(fitted))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    parser.add_argument("--bandwidth-gbs", type=float, default=4800.0, help="the GPU's memory bandwidth (H200: 4,800)")
    parser.add_argument("--tflops", type=float, default=989.0, help="its dense BF16 matrix rate (H200: 989)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--no-graphs", action="store_true", help="decode steps eager only")
    parser.add_argument("--output", type=Path, default=Path("step-curve.json"))
    parser.add_argument("--fit", type=Path, help="a JSON this script wrote: redo the fit and the table")
    args = parser.parse_args(argv)

    if args.fit:
        try:
            written = json.loads(args.fit.read_text())
        except (OSError, ValueError) as e:
            print(f"llm_step_curve: cannot read {args.fit}: {e}", file=sys.stderr)
            return 2
        points = [Point(**p) for p in written["points"]]
        shape, ceilings, device = written["shape"], written.get("ceilings", {}), written.get("device", "?")
        spec = written["spec"]
    else:
        t0 = time.monotonic()
        shape, device = args.shape, args.device
        ceilings = device_ceilings(args.device)
        points = measure(shape, args.device, warmup=args.warmup, repeats=args.repeats, graphs=not args.no_graphs)
        spec = spec_roofline(shape, bandwidth_gbs=args.bandwidth_gbs, tflops=args.tflops)
        print(f"measured {len(points)} steps in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    fitted = fit_roofline(points)
    figures = summary(points, spec, fitted)
    print(f"{shape} on {ceilings.get('name', device)}"
          + (f": copy {ceilings['copy_gbs']:.0f} GB/s, BF16 {ceilings['bf16_tflops']:.0f} TFLOP/s" if ceilings else ""))
    print(table(points, spec, fitted))
    print(f"{'':<18} {'overhead ms':>12} {'weights ms':>11} {'kv us/token':>12} {'compute us/token':>17}")
    for name, params in (("from the specs", spec), ("fitted", fitted)):
        print(f"{name:<18} {params['step_overhead_ms']:12.3f} {params['weights_ms']:11.3f} "
              f"{params['kv_us_per_token']:12.4f} {params['compute_us_per_token']:17.2f}")
    print(f"|error| median / max: the specs' {figures['spec_median_abs_error']:.0%} / {figures['spec_max_abs_error']:.0%}, "
          f"the fit's {figures['fit_median_abs_error']:.0%} / {figures['fit_max_abs_error']:.0%}")
    if not args.fit:
        args.output.write_text(json.dumps({"shape": shape, "device": device, "ceilings": ceilings, "spec": spec, "fitted": fitted,
                                           "figures": figures, "points": [asdict(p) for p in points]}, indent=2) + "\n")
        print(f"wrote {args.output}")
    return 0 if all(math.isfinite(v) for v in fitted.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
