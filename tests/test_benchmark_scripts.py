"""The benchmark scripts that take seconds run to their figures with their smallest options. Their
figures are checked by the people who run them (docs/), not here; what is checked here is that a change
in the library has not broken a script under it: simulate_speed.py raised ValueError for two days after
43f2209 changed the simulator's cached schedules, and nothing ran it. The scripts that start servers, or
take minutes, are not run here (the production audit's is, in tests/production/test_audit.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# script and its smallest options -> a line its figures print
QUICK = {
    "simulate_speed.py": (["--runs", "1", "--grid", "half-octave"], "run 1: "),
    "report_bench.py": (["--trials", "20"], "report of a 20-trial study: "),
    "traffic_bench.py": (["--requests", "100000", "--runs", "1"], "  1  memory "),
    "trace_import_bench.py": (["--requests", "1000"], "trace: 1,000 requests"),
}


def run_benchmark(name: str, args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """`python benchmarks/NAME ARGS` from the repository's root, its temporary files under tmp_path."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("name", sorted(QUICK))
def test_a_quick_benchmark_runs_to_its_figures(name, tmp_path):
    args, figures = QUICK[name]
    done = run_benchmark(name, args, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert figures in done.stdout, done.stdout[-3000:]
