"""Import time and peak memory of a Triton trace file: `python benchmarks/trace_import_bench.py [--requests N]`.

Writes a trace of N requests as tritonserver writes one with `level=TIMESTAMPS` (a head entry and a
timestamps entry of six markers per request, ~360 bytes a request), then imports it in a fresh
process (`tuner traffic import triton`'s function), twice, printing the wall time and the process's
peak resident memory beside the machine's load. Not a test: timings depend on the machine and on what
else runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MARKERS = ("HTTP_RECV_START", "REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_END", "REQUEST_END")
CHILD = """
import resource, sys, time
from tuner.traffic import import_triton_trace
t = time.perf_counter()
rows = len(import_triton_trace(sys.argv[1]))
print(rows, time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def write_trace(path: Path, n: int) -> None:
    with path.open("w") as out:
        out.write("[")
        for i in range(1, n + 1):
            ns = 1_000_000 * i
            head = {"id": i, "model_name": "m", "model_version": 1}
            stamps = {"id": i, "timestamps": [{"name": m, "ns": ns + 1000 * k} for k, m in enumerate(MARKERS)]}
            out.write(("," if i > 1 else "") + json.dumps(head) + "," + json.dumps(stamps))
        out.write("]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        write_trace(trace, args.requests)
        size_mb = trace.stat().st_size / 1e6
        print(f"trace: {args.requests:,} requests, {size_mb:,.0f} MB")
        print(f"{'run':>3}  {'rows':>10}  {'seconds':>8}  {'peak MB':>8}  load (1, 5 min)")
        for run in (1, 2):
            load = os.getloadavg()
            out = subprocess.run([sys.executable, "-c", CHILD, str(trace)], check=True, capture_output=True, text=True)
            rows, seconds, peak = out.stdout.split()
            print(f"{run:>3}  {int(rows):>10,}  {float(seconds):>8.1f}  {float(peak):>8.0f}  {load[0]:.1f}, {load[1]:.1f}")
            time.sleep(1)


if __name__ == "__main__":
    main()
