"""Does `tuner soak` find what the emulated fragmentation puts there? A soak of 12 hours of traffic on
encoder_sim with the fragmentation on, compared with what the emulation's parameters imply; then soaks
with it off, which must report no drift.

    python benchmarks/soak_fidelity.py [--hours 12] [--speed 72] [--window 0.5] [--off-runs 5]
                                       [--off-hours H] [--keep DIR]

The setup (all in a temporary directory): a private copy of encoder_sim with a padded-token budget of
6,144 (12 full-length rows), the fragmentation at rho = 0.01 per 1,000 executions and a slowdown
kappa = 1 (off: rho = 0); a recording of `--hours` of diurnal traffic (a 4-hour period, amplitude 0.3,
2.8 req/s on average: 200 req/s at speed 72), every request 512 tokens long so that a batch of r rows
pads to r x 512 tokens; the configuration max_batch_size 8, max_queue_delay 8 ms; SLA p99 <= 200 ms,
errors <= 0.1 %. Each soak is a real `python -m tuner soak` (capacity at the start, then windows of
`--window` wall minutes).

What the emulation implies (its pure functions `fragmentation` and `first_failing_execution`, read from
encoder_sim/1/model.py), from the executions the soak measured: n(t) = n0 + E t, a straight line fitted
to Triton's execution count since the load against the hours of traffic:
- the largest batch still succeeding: floor(budget(n) / 512) at the start of the soak's last two
  windows (the soak names the largest batch that succeeded in them), and the batch size that stops
  succeeding, one more;
- when each size stops succeeding: n*(r x 512), in hours of traffic;
- the drift of the compute time per request at the first window's batch mix: the emulated GPU time of
  each batch size (`execute_ms`) grows by kappa rho E / 1000 per hour, the rest of Triton's compute time
  (the emulated host time per row and the server's overhead: the first window's measured time of that
  size less the emulated GPU time) does not;
- the projected SLA breach: the capacity measured at the start, C0, falls below the recorded load R
  when that compute time has grown by C0 / R, in hours of traffic (and, for comparison, when the GPU
  time alone has: slowdown(n) = (C0 / R) slowdown(n0));
- the SLA break by errors: the first size to fail that carries more than 0.1 % of the rows (from the
  batch sizes of the soak's first third, before anything failed).
Acceptance: drift detected, the batch size and the projected breach within 25 % of the implied; with
the fragmentation off, no drift in any run. Prints both side by side, and the load average.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner import modelconfig  # noqa: E402
from tuner.soak import LAST_WINDOWS  # noqa: E402
from tuner.traffic import SizeSpec, synth_diurnal, write_traffic  # noqa: E402

TEMPLATE = ROOT / "model_repository_templates" / "encoder_sim"
LENGTH = 512
BUDGET = 6144
RHO = 0.01
KAPPA = 1.0
MAX_BATCH = 8
DELAY_US = 8000
TOLERANCE = 0.25


def emulation():
    """encoder_sim's model.py, for its pure functions (its server-only import stubbed)."""
    sys.modules.setdefault("triton_python_backend_utils", types.ModuleType("triton_python_backend_utils"))
    spec = importlib.util.spec_from_file_location("encoder_sim_model", TEMPLATE / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def repository(folder: Path, rho: float) -> Path:
    """A copy of encoder_sim with the budget and the fragmentation set (the README's way)."""
    repo = folder / "models"
    shutil.copytree(TEMPLATE, repo / "encoder_sim")
    config = modelconfig.load(TEMPLATE / "config.pbtxt")
    for key, value in (("max_padded_tokens", BUDGET), ("fragmentation_per_1k_executions", rho),
                       ("fragmentation_slowdown", KAPPA)):
        config.parameters[key].string_value = f"{value:g}"
    (repo / "encoder_sim" / "config.pbtxt").write_text(modelconfig.to_text(config))
    return repo


def study(folder: Path, repo: Path, traffic: Path, speed: float) -> Path:
    text = f"""name: soak-fidelity
model_repository: {repo}
model: encoder_sim
traffic: {{path: {traffic}, speed: {speed:g}}}
replay: {{warmup_s: 1.0, lag_budget_ms: 50}}
sla: {{latency_ms: 200, percentile: 99, max_error_rate: 0.001}}
search:
  max_batch_size: {{low: 1, high: 64, log: true}}
  max_queue_delay_microseconds: {{low: 0, high: 8000, step: 2000}}
  capacity: {{step_duration_s: 3.0, tolerance: 0.1, start_speed: {speed * 1.25:g}, max_speed: {speed * 6:g}, max_steps: 8}}
output: {folder / 'out'}
"""
    path = folder / "study.yaml"
    path.write_text(text)
    return path


def soak(study_path: Path, hours: float, window: float) -> tuple[int, float]:
    """Run `tuner soak` (its table and progress pass through); its exit code and wall seconds."""
    started = time.monotonic()
    rc = subprocess.call([sys.executable, "-m", "tuner", "soak", str(study_path), "--set", f"max_batch_size={MAX_BATCH}",
                          "--set", f"max_queue_delay_microseconds={DELAY_US}", "--hours", f"{hours:g}",
                          "--window", f"{window:g}", "--replace"], cwd=ROOT)
    if not (study_path.parent / "out" / "soak" / "findings.json").is_file():  # refused or failed: it said why
        sys.exit(f"soak_fidelity: tuner soak exited {rc} without its findings (its message is above)")
    return rc, time.monotonic() - started


def implied(folder: Path, m) -> dict:
    """What the emulation's parameters imply for this soak, from the executions it measured."""
    soak_dir = folder / "out" / "soak"
    windows = pd.read_csv(soak_dir / "windows.csv")
    windows = windows[windows["valid"].astype(str).str.lower() == "true"]
    meta = json.loads((soak_dir / "soak.json").read_text())
    executions = pd.read_csv(soak_dir / "executions.csv")
    # n(t): Triton's execution count since the load at each window's end, against its end in hours
    slope, n0 = np.polyfit(windows["end_hours"], windows["executions_since_load"], 1)
    frag = {"max_padded_tokens": BUDGET, "per_1k_executions": RHO}

    def budget(n: float) -> float:
        return m.fragmentation(n, slowdown=KAPPA, **frag)[0]

    def hours(n: float) -> float:
        return (n - n0) / slope

    recent = windows.sort_values("window").tail(LAST_WINDOWS)  # where the soak reads its batch limits
    n_recent = n0 + slope * float(recent["start_hours"].iloc[0])
    n_end = n0 + slope * float(windows["end_hours"].max())
    out = {"executions_per_hour": slope, "n0": n0, "n_end": n_end,
           "window_hours": {int(r.window): (r.start_hours, r.end_hours) for r in windows.itertuples()},
           "largest_recent": math.floor(budget(n_recent) / LENGTH),
           "largest_at_end": math.floor(budget(n_end) / LENGTH),
           "stops": {r: hours(m.first_failing_execution(r * LENGTH, **frag)) for r in range(1, MAX_BATCH + 1)}}
    # Triton's compute time of a batch of b rows, as the emulation makes it: the emulated GPU time,
    # slowed by the fragmentation, plus what it does not slow (the emulated host time per row and the
    # server's own overhead: the first window's measured time of that size less the emulated GPU time)
    params = {k: v.string_value for k, v in
              modelconfig.load(folder / "models" / "encoder_sim" / "config.pbtxt").parameters.items()}
    scale = float(params["time_scale"])
    tokens, ms = m.parse_table(params["latency_table_ms"])

    def gpu_ms(rows: int) -> float:
        return m.execute_ms(rows * LENGTH, tokens, ms, float(params["memory_bound_tokens"]),
                            float(params["memory_bound_slowdown"])) * scale

    def slowdown(n: float) -> float:
        return m.fragmentation(n, slowdown=KAPPA, **frag)[1]

    first = windows["window"].min()
    ref = executions[(executions["window"] == first) & (executions["failures"] == 0)]
    n_ref = n0 + slope * float(windows.loc[windows["window"] == first, "t_hours"].iloc[0])
    weights = ref["successes"].to_numpy(dtype=float)
    gpu = np.array([gpu_ms(int(b)) for b in ref["size"]])
    fixed = ref["compute_ms"].to_numpy(dtype=float) - gpu * slowdown(n_ref)
    big_g, big_f = float(weights @ gpu), float(weights @ fixed)
    out["gpu_share"] = big_g * slowdown(n0) / (big_f + big_g * slowdown(n0))
    out["compute_drift"] = big_g * KAPPA * RHO / 1000 * slope / (big_f + big_g * slowdown(n0))
    cap = meta.get("capacity") or {}
    if cap.get("capacity_rps") and cap.get("rate_rps"):
        ratio = cap["capacity_rps"] / cap["rate_rps"]
        out["capacity_ratio"] = ratio
        # capacity scales as 1 / compute time: C(n) / C(n0) = C0 / R, C linear in slowdown(n) = 1 + kappa lost(n)
        slow = (ratio * (big_f + big_g * slowdown(n0)) - big_f) / big_g
        lost = (slow - 1.0) / KAPPA
        out["breach"] = hours(lost * 1000.0 / RHO) if lost < 1 else math.inf
        lost_gpu = (ratio * slowdown(n0) - 1.0) / KAPPA  # if capacity scaled with the GPU time alone
        out["breach_gpu_only"] = hours(lost_gpu * 1000.0 / RHO) if lost_gpu < 1 else math.inf
    # the SLA break by errors: sizes from the first third (nothing failed yet), rows per size
    early = executions[executions["window"] < windows["window"].max() / 3]
    rows = early.groupby("size")["successes"].sum() * early.groupby("size")["successes"].sum().index
    share = rows[::-1].cumsum()[::-1] / rows.sum()  # rows in batches of at least this size
    over = [int(r) for r, f in share.items() if f > 0.001]
    if over:
        out["error_break_size"] = max(over)
        out["error_break"] = out["stops"].get(max(over), math.inf)
    return out


def judged(found: dict, want: dict) -> list[tuple[str, str, str, str]]:
    """Rows of the comparison: what, the soak, the emulation, within the tolerance."""
    def close(a, b) -> str:
        if a is None or b is None or not math.isfinite(b):
            return "-"
        return "yes" if abs(a - b) <= TOLERANCE * abs(b) else "NO"

    batches = found.get("batches") or {}
    capacity = next((c for c in found.get("crossings") or [] if c["figure"] == "capacity_rps"), None)
    observed = found.get("observed_breach")
    rows = [("verdict", found.get("verdict"), "drift", "yes" if found.get("verdict") == "drift" else "NO")]
    compute = next((t for t in found.get("trends") or [] if t["figure"] == "compute_ms_fixed_mix"), {})
    rows.append(("compute per request at a fixed batch mix, drift per hour of traffic",
                 f"{100 * (compute.get('relative_per_hour') or math.nan):+.2f} %",
                 f"{100 * want['compute_drift']:+.2f} % (the GPU time, {want['gpu_share']:.0%} of it, "
                 f"{100 * KAPPA * RHO * want['executions_per_hour'] / 1000:+.2f} %)",
                 close(compute.get("relative_per_hour"), want["compute_drift"])))
    rows.append((f"largest batch still succeeding (last {LAST_WINDOWS} windows)", str(batches.get("largest_recent")),
                 str(want["largest_recent"]), close(batches.get("largest_recent"), want["largest_recent"])))
    rows.append(("batch size that stops succeeding", str(batches.get("smallest_failing")),
                 f"{want['largest_recent'] + 1} (at the very end {want['largest_at_end']} rows fit)",
                 close(batches.get("smallest_failing"), want["largest_recent"] + 1)))
    spans = want["window_hours"]
    for s in batches.get("sizes") or []:
        k = s.get("first_failure_window")
        if k is not None and int(s["size"]) in want["stops"]:
            a, b = spans.get(int(k), (math.nan, math.nan))
            rows.append((f"size {s['size']} first failed", f"window {k}: {a:.2f}-{b:.2f} h",
                         f"{want['stops'][int(s['size'])]:.2f} h", "-"))
    if capacity is not None or "breach" in want:
        got = capacity["hours"] if capacity else None
        rows.append(("projected SLA breach: capacity below the recorded load (h of traffic)",
                     "none" if got is None else f"{got:.2f} h ({capacity['interval_hours'][0]:.3g} to "
                     f"{capacity['interval_hours'][1] or math.inf:.3g})",
                     f"{want.get('breach', math.nan):.2f} h (C0/R = {want.get('capacity_ratio', math.nan):.3f}; "
                     f"{want.get('breach_gpu_only', math.nan):.2f} h if capacity scaled with the GPU time alone)",
                     close(got, want.get("breach"))))
    if observed is not None or "error_break" in want:
        rows.append(("SLA broken by errors (observed, h of traffic)",
                     "none" if observed is None else f"{observed['hours']:.2f} h",
                     f"{want.get('error_break', math.nan):.2f} h (size {want.get('error_break_size')} fails)",
                     close(observed["hours"] if observed else None, want.get("error_break"))))
    return rows


def table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(f"{str(c):<{w}}" for c, w in zip(r, widths, strict=True)) for r in [header, *rows])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hours", type=float, default=12.0, help="hours of traffic per soak (default 12)")
    p.add_argument("--speed", type=float, default=72.0, help="replay speed (default 72: 12 h in 10 min)")
    p.add_argument("--window", type=float, default=0.5, help="wall minutes per window (default 0.5)")
    p.add_argument("--off-runs", type=int, default=5, help="soaks with the fragmentation off (default 5)")
    p.add_argument("--off-hours", type=float, default=None, help="hours of each off soak (default --hours)")
    p.add_argument("--keep", metavar="DIR", help="keep the soaks' directories here")
    args = p.parse_args()
    m = emulation()
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="tuner-soak-fidelity-"))
    base.mkdir(parents=True, exist_ok=True)
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    try:
        traffic = base / "traffic.parquet"
        write_traffic(synth_diurnal(200.0 / args.speed, args.hours * 3600, seed=3, period_s=4 * 3600, amplitude=0.3,
                                    sizes={"seq_len": SizeSpec.parse(f"constant:{LENGTH}")}), traffic)
        on = base / "on"
        on.mkdir(exist_ok=True)
        rc, wall = soak(study(on, repository(on, RHO), traffic, args.speed), args.hours, args.window)
        found = json.loads((on / "out" / "soak" / "findings.json").read_text())
        want = implied(on, m)
        print(f"\n=== fragmentation on (rho {RHO:g}/1k executions, kappa {KAPPA:g}, budget {BUDGET} tokens): "
              f"exit {rc}, {wall / 60:.1f} min of wall time, {want['executions_per_hour']:,.0f} executions "
              f"per hour of traffic (n0 = {want['n0']:,.0f}), load average "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        rows = judged(found, want)
        print(table(rows, ("figure", "tuner soak", "the emulation implies", f"within {TOLERANCE:.0%}")))
        passed = all(r[3] in ("yes", "-") for r in rows if r[0] != "SLA broken by errors (observed, h of traffic)")
        off_rows = []
        for k in range(args.off_runs):
            off = base / f"off-{k + 1}"
            off.mkdir(exist_ok=True)
            rc, wall = soak(study(off, repository(off, 0.0), traffic, args.speed), args.off_hours or args.hours,
                            args.window)
            f = json.loads((off / "out" / "soak" / "findings.json").read_text())
            drifting = [f"{t['figure']} {100 * (t.get('relative_per_hour') or math.nan):+.2f} %/h"
                        for t in f.get("trends") or [] if t["verdict"] == "drift"]
            off_rows.append((str(k + 1), f.get("verdict"), ", ".join(drifting) or "-", f"{wall / 60:.1f} min",
                             " ".join(f"{x:.2f}" for x in os.getloadavg())))
            passed &= f.get("verdict") != "drift"
        if off_rows:
            print("\n=== fragmentation off")
            print(table(off_rows, ("run", "verdict", "drifting figures", "wall", "load average after")))
        print(f"\nacceptance: {'PASS' if passed else 'FAIL'}; soaks in {base}")
        return 0 if passed else 1
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
