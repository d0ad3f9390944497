"""Load and describe a one-week, 10-million-request traffic profile; print time and peak memory.

    python benchmarks/traffic_bench.py [--requests 10000000] [--csv] [--keep DIR]

Makes the profile once (a diurnal week with lognormal seq_len, Parquet; with --csv also a CSV), then
times `read_traffic` + `describe` + `format_stats` in a fresh Python process per format, so the
peak resident memory printed is that of loading and describing alone. Goal: under 30 s and 2 GB on
2 cores. Not a test: timings depend on the machine and on what else runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WEEK_S = 7 * 86400.0

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from tuner.traffic import describe, format_stats, read_traffic
t_import = time.perf_counter()
df = read_traffic(sys.argv[1])
t_read = time.perf_counter()
stats = describe(df)
table = format_stats(stats, sys.argv[1])
t_done = time.perf_counter()
print(table, file=sys.stderr)
print(json.dumps({"import_s": t_import - t0, "read_s": t_read - t_import, "describe_s": t_done - t_read,
                  "total_s": t_done - t0, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "requests": len(df)}))
"""


def make_profile(folder: Path, requests: int, csv: bool) -> list[Path]:
    from tuner.traffic import synth_diurnal, write_traffic

    t0 = time.perf_counter()
    df = synth_diurnal(
        requests / WEEK_S,
        WEEK_S,
        seed=0,
        sizes={"seq_len": "lognormal:median=200,sigma=0.7,max=512"},
        amplitude=0.6,
    )
    paths = [write_traffic(df, folder / "week.parquet")]
    if csv:
        paths.append(write_traffic(df, folder / "week.csv"))
    sizes = ", ".join(f"{p.name} {p.stat().st_size / 1e6:.0f} MB" for p in paths)
    print(
        f"made {len(df):,} requests over {WEEK_S / 86400:g} days in {time.perf_counter() - t0:.1f} s ({sizes})"
    )
    return paths


def measure(path: Path) -> dict:
    run = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, check=False
    )
    if run.returncode != 0:
        raise SystemExit(f"benchmark child failed on {path}:\n{run.stderr}")
    print(run.stderr)
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000_000)
    parser.add_argument("--csv", action="store_true", help="also time a CSV of the same profile")
    parser.add_argument("--keep", type=Path, help="write the profile here instead of a temporary folder")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        rows = []
        for path in make_profile(folder, args.requests, args.csv):
            result = measure(path)
            rows.append((path.suffix[1:], result))
    print(
        f"{'format':8}{'requests':>12}{'read s':>9}{'describe s':>12}{'total s':>9}{'peak MB':>9}  goal: < 30 s, < 2048 MB"
    )
    for fmt, r in rows:
        ok = "ok" if r["total_s"] < 30 and r["peak_rss_mb"] < 2048 else "OVER"
        print(
            f"{fmt:8}{r['requests']:>12,}{r['read_s']:>9.2f}{r['describe_s']:>12.2f}{r['total_s']:>9.2f}"
            f"{r['peak_rss_mb']:>9.0f}  {ok}"
        )


if __name__ == "__main__":
    main()
