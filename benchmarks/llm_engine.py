"""How fast the llm_vllm template's engine starts in tritonserver, and how fast it streams a burst.

    python benchmarks/llm_engine.py [--runs 2] [--requests 8] [--tokens 64] [--prompt 16]

Each run starts a fresh tritonserver (LocalLauncher) serving model_repository_templates/llm_vllm (vLLM's
CPU build, the tiny model, made first if missing) and times it until ready (the server, the Python
stub, vLLM's import and engine start), then sends `--requests` streamed requests at once
(generate_stream, `--prompt` words, exactly `--tokens` output tokens each, ignore_eos) and times the
burst until the last token. Prints one table row a run, the load average beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.llm.tiny import tiny_model  # noqa: E402
from tuner.server.local import LocalLauncher  # noqa: E402

MODEL = "llm_vllm"


def _stream(http: str, *, prompt: int, tokens: int) -> int:
    params = {"max_tokens": tokens, "min_tokens": tokens, "ignore_eos": True, "temperature": 0}
    body = {"text_input": " ".join(f"w{i}" for i in range(prompt)), "stream": True,
            "exclude_input_in_output": True, "return_num_output_tokens": True,
            "sampling_parameters": json.dumps(params)}
    request = urllib.request.Request(f"http://{http}/v2/models/{MODEL}/generate_stream",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    count = 0
    with urllib.request.urlopen(request, timeout=300) as answer:
        for raw in answer:
            line = raw.decode().strip()
            if line.startswith("data:"):
                count += json.loads(line[5:]).get("num_output_tokens", 0)
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=16)
    args = parser.parse_args()
    tiny_model()
    # the stub imports tuner (the tiny model's name) from this checkout
    os.environ["TUNER_MODEL_PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("TUNER_MODEL_PYTHONPATH", "")) if p)
    print(f"{'run':>3} {'ready s':>8} {'burst':>9} {'burst s':>8} {'tokens/s':>9}  load (1, 5 min)")
    for run in range(1, args.runs + 1):
        start = time.perf_counter()
        with LocalLauncher(ROOT / "model_repository_templates", models=[MODEL], startup_timeout_s=600) as server:
            ready = time.perf_counter() - start
            begin = time.perf_counter()
            with ThreadPoolExecutor(args.requests) as pool:
                counts = list(pool.map(lambda _: _stream(server.endpoints.http, prompt=args.prompt,
                                                         tokens=args.tokens), range(args.requests)))
            burst = time.perf_counter() - begin
        if counts != [args.tokens] * args.requests:
            sys.exit(f"expected {args.tokens} tokens from each request, got {counts}")
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg()[:2])
        print(f"{run:>3} {ready:8.1f} {f'{args.requests}x{args.tokens}':>9} {burst:8.2f} "
              f"{sum(counts) / burst:9.0f}  {load}")


if __name__ == "__main__":
    main()
