"""A week of traffic as hourly Parquet files, read out of core: time and peak memory of each step.

    python benchmarks/traffic_bench.py [--requests 10000000] [--runs 2] [--keep DIR [--reuse]] [--csv]

Writes a diurnal week of `--requests` requests (lognormal seq_len, batch_size 1) as 168 hourly Parquet
files (numpy and pyarrow, an hour at a time: the writer never holds the week), then runs each step in
a fresh Python process, --runs times, and prints its wall time, that process's CPU time (user + system,
over all cores) and its peak resident memory (getrusage ru_maxrss), with the 1-minute load average
before it: a line per step as it ends, then a table of all. --keep DIR keeps the week; --reuse then
measures a week already written there (no write).

    import    open_recording: the files' footers read, the recording planned
    stats     `tuner traffic stats DIR` (open, describe_recording, format_stats)
    window    the busiest 10 minutes found (a timestamp scan) and loaded (only their row groups)
    replay    that window as a replay takes it: loaded, cut to a 60 s step, due times computed
    nightly   the newest hour of the growing directory (nightly's intake)
    csv       (with --csv) the week as one CSV, converted to Parquet once, streamed (a fresh cache)
    memory    (at most 20 M requests) read_traffic-style whole-table describe, for comparison

Goals (issue 29): a week at 1,000 req/s (605 M rows): stats <= 60 s and <= 2 GB, the busiest 10-minute
window found and loaded <= 20 s and <= 1 GB; at 10 M rows, each <= 3 s. Not a test: timings depend on
the machine and on what else runs (the load average is printed beside them).
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

WEEK_S = 7 * 86400.0
HOURS = 168
T0 = 1_767_225_600.0  # 2026-01-01 00:00 UTC: real epoch times, as a logging pipeline writes them

STEPS = {
    "import": """
from tuner.traffic.recording import open_recording
rec = open_recording(DIR)
out = {"rows": rec.rows, "segments": len(rec.segments)}
""",
    "stats": """
from tuner.traffic import format_stats
from tuner.traffic.recording import open_recording
from tuner.traffic.scan import describe_recording
stats = describe_recording(open_recording(DIR))
print(format_stats(stats, DIR), file=sys.stderr)
out = {"rows": stats["requests"], "peak_rps": stats["peak_rps"], "stats": stats}
""",
    "window": """
from tuner.traffic.recording import open_recording
from tuner.traffic.scan import busiest_in, read_window
rec = open_recording(DIR)
start, count = busiest_in(rec, 600.0)
df = read_window(rec, start, 600.0)
assert len(df) == count, (len(df), count)
out = {"rows": len(df), "start_s": start}
""",
    "replay": """
from tuner.traffic import due_offsets, step_window
from tuner.traffic.recording import open_recording
from tuner.traffic.scan import busiest_in, read_window
rec = open_recording(DIR)
start, _ = busiest_in(rec, 600.0)
df = read_window(rec, start, 600.0)
part, warm = step_window(df, 1.0, 10.0, measured_s=60.0)
due = due_offsets(part)
out = {"rows": len(part), "due_s": float(due[-1])}
""",
    "nightly": """
from tuner.nightly.intake import newest_traffic
df, files = newest_traffic(DIR, 1.0)
out = {"rows": len(df), "files": len(files)}
""",
    "csv": """
from tuner.traffic.recording import open_recording
rec = open_recording(DIR + "/../week-csv/week.csv")  # converted to Parquet in a fresh cache
out = {"rows": rec.rows}
""",
    "memory": """
import pandas as pd
from tuner.traffic import describe, read_traffic
from tuner.traffic.recording import recording_files
df = pd.concat([read_traffic(f) for f in recording_files(DIR)], ignore_index=True)
stats = describe(df)
out = {"rows": stats["requests"], "peak_rps": stats["peak_rps"], "stats": stats}
""",
}

CHILD = """
import json, resource, sys, time
t0 = time.perf_counter()
DIR = sys.argv[1]
{body}
out["s"] = time.perf_counter() - t0
usage = resource.getrusage(resource.RUSAGE_SELF)
out["cpu_s"] = usage.ru_utime + usage.ru_stime  # the time this step took of the shared machine's cores
out["peak_mb"] = usage.ru_maxrss / 1024
print(json.dumps(out))
"""


def make_week(folder: Path, requests: int) -> None:
    """168 hourly files of a diurnal week: each hour's arrivals are the uniform order statistics
    of its Poisson count (normalised sums of exponentials: sorted without a sort)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = time.perf_counter()
    rng = np.random.default_rng(0)
    hours = np.arange(HOURS)
    shape = 1 + 0.6 * np.sin(2 * np.pi * (hours % 24) / 24 - np.pi / 2)  # quiet at night, busy by day
    counts = rng.poisson(requests * shape / shape.sum())
    total = 0
    for h in hours:
        n = int(counts[h])
        gaps = rng.standard_exponential(n + 1)
        ts = T0 + h * 3600.0 + 3600.0 * np.cumsum(gaps[:-1]) / gaps.sum()
        seq = np.clip(np.rint(200 * np.exp(0.7 * rng.standard_normal(n))), 1, 512).astype(np.int64)
        table = pa.table({"timestamp": ts, "batch_size": np.ones(n, dtype=np.int64), "seq_len": seq})
        pq.write_table(table, folder / f"traffic-{h // 24 + 1:02d}-{h % 24:02d}.parquet")
        total += n
        if h % 24 == 23:
            print(f"  wrote day {h // 24 + 1}: {total:,} requests so far", file=sys.stderr, flush=True)
    size = sum(p.stat().st_size for p in folder.glob("*.parquet"))
    print(f"made {total:,} requests in {HOURS} hourly files, {size / 1e9:.2f} GB, in {time.perf_counter() - t:.1f} s")


def write_csv(folder: Path) -> Path:
    """The week as one CSV beside the hourly files (pyarrow's writer, an hour at a time)."""
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    target = folder.parent / "week-csv" / "week.csv"
    target.parent.mkdir(exist_ok=True)
    with pcsv.CSVWriter(target, pq.read_schema(sorted(folder.glob("*.parquet"))[0])) as writer:
        for path in sorted(folder.glob("*.parquet")):
            writer.write_table(pq.read_table(path))
    print(f"wrote {target}: {target.stat().st_size / 1e9:.2f} GB")
    return target


def measure(step: str, folder: Path) -> dict:
    code = CHILD.format(body=STEPS[step])
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TUNER_TRAFFIC_CACHE": cache}
        run = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True,
                             check=False, env=env)
    if run.returncode != 0:
        raise SystemExit(f"benchmark step {step} failed:\n{run.stderr}")
    if step == "stats":
        print(run.stderr.strip())
    return json.loads(run.stdout.strip().splitlines()[-1])


# what each step reports beside its rows, time and memory, as the progress line names it
DETAILS = {"segments": "segments", "files": "files", "peak_rps": "peak req/s",
           "start_s": "window start (epoch s)", "due_s": "last due (s)"}


def progress(run: int, step: str, load: float, result: dict) -> str:
    """One readable line for a step just measured: wall, CPU, peak memory, load, rows and details."""
    line = (f"run {run} {step:8} {result['s']:8.2f} s wall {result['cpu_s']:8.2f} s CPU "
            f"{result['peak_mb']:8.0f} MB peak  load {load:.2f}  {result['rows']:,} rows")
    for key, name in DETAILS.items():
        if key in result:
            value = result[key]
            line += f", {name} {value:.2f}" if isinstance(value, float) else f", {name} {value:,}"
    return line


def agree(a, b) -> bool:
    """The same statistics: counts equal, floats to 1e-9 (sums are merged chunk by chunk)."""
    import math

    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(agree(a[k], b[k]) for k in a)
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    if isinstance(a, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return a == b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=10_000_000, help="requests in the week")
    parser.add_argument("--keep", type=Path, help="write the week here (kept) instead of a temporary folder")
    parser.add_argument("--reuse", action="store_true", help="the week in --keep is already written")
    parser.add_argument("--runs", type=int, default=2, help="runs of each step (default 2)")
    parser.add_argument("--csv", action="store_true", help="also time converting the week written as one CSV")
    parser.add_argument("--write-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.reuse and (args.keep is None or not any(args.keep.glob("*.parquet"))):
        parser.error("--reuse needs --keep DIR holding a written week (its hourly Parquet files)")
    if args.write_only:
        if not args.reuse:
            make_week(args.keep, args.requests)
        if args.csv:
            write_csv(args.keep)
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp) / "week"
        folder.mkdir(parents=True, exist_ok=True)
        if not args.reuse or args.csv:
            # in a process of its own: Linux keeps a process's peak memory across fork and exec, so
            # the steps' children must come from a parent that never held an hour of traffic
            subprocess.run([sys.executable, __file__, "--write-only", "--keep", str(folder),
                            "--requests", str(args.requests), *(["--reuse"] if args.reuse else []),
                            *(["--csv"] if args.csv else [])], check=True)
        steps = [s for s in STEPS if (s != "memory" or args.requests <= 20_000_000) and (s != "csv" or args.csv)]
        rows = []
        for run in range(1, args.runs + 1):
            for step in steps:
                load = os.getloadavg()[0]
                result = measure(step, folder)
                rows.append((run, step, load, result))
                print(progress(run, step, load, result), file=sys.stderr, flush=True)
    described = {step: r["stats"] for _, step, _, r in rows if "stats" in r}
    if len(described) == 2:
        same = agree(described["stats"], described["memory"])
        print(f"out-of-core statistics {'agree with' if same else 'DIFFER from'} the whole-table describe")
    print(f"\n{'run':>3}  {'step':8}{'rows':>14}{'wall s':>9}{'CPU s':>9}{'peak MB':>9}{'load':>7}")
    for run, step, load, r in rows:
        print(f"{run:>3}  {step:8}{r['rows']:>14,}{r['s']:>9.2f}{r['cpu_s']:>9.2f}{r['peak_mb']:>9.0f}{load:>7.2f}")


if __name__ == "__main__":
    main()
