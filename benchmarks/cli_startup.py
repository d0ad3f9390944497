"""How long the CLI takes to say hello: `tuner --help` and `tuner config check FILE`, as a user runs them.

    python benchmarks/cli_startup.py [--runs 10] [--config PATH] [--top 8]

Each command runs `--runs` times as a fresh process through the installed console script's entry point
(`tuner.cli:main`, with this interpreter); prints the median and the fastest wall time against the
goal (0.5 s and 0.8 s on 2 cores), the load average beside them, then the `-X importtime` entries that
cost the most (cumulative microseconds) for one more run of each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENTRY = "import sys; from tuner.cli import main; sys.exit(main())"
GOALS_S = {"--help": 0.5, "config check": 0.8}


def _run(args: list[str], *, importtime: bool = False) -> tuple[float, str]:
    flags = ["-X", "importtime"] if importtime else []
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *flags, "-c", ENTRY, *args], cwd=ROOT, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"tuner {' '.join(args)} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return elapsed, done.stderr


def _top_imports(stderr: str, top: int) -> list[tuple[int, str]]:
    rows = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.removeprefix("import time:").split("|")
        rows.append((int(cumulative), name.rstrip()))
    return sorted(rows, reverse=True)[:top]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--config", default=str(ROOT / "model_repository_templates/encoder_sim/config.pbtxt"))
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    commands = {"--help": ["--help"], "config check": ["config", "check", args.config]}
    _run(["--help"])  # the first start after an install compiles bytecode: not what a user waits for
    print(f"{'command':<22} {'median s':>9} {'fastest s':>10} {'goal s':>7}  load (1, 5 min)")
    for name, argv in commands.items():
        times = [_run(argv)[0] for _ in range(args.runs)]
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg()[:2])
        verdict = "ok" if statistics.median(times) <= GOALS_S[name] else "OVER"
        print(f"tuner {name:<16} {statistics.median(times):9.3f} {min(times):10.3f} {GOALS_S[name]:7.1f}  "
              f"{load}  {verdict} ({args.runs} runs)")
    for name, argv in commands.items():
        print(f"\n-X importtime, tuner {name}: the {args.top} costliest imports (cumulative)")
        for micros, module in _top_imports(_run(argv, importtime=True)[1], args.top):
            print(f"  {micros / 1e3:8.1f} ms  {module}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
