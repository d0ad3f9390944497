"""The replay as ordinary code calls it: plan, start the Locust process(es), snapshot Triton's
statistics at the end of the warm-up, collect the per-request records.

The load generator runs in subprocesses (`python -m tuner.replay`) because Locust monkey-patches
whatever process imports it; this side stays unpatched (Optuna, the docker SDK, threads).

Warm-up: one continuous open-loop schedule, so the measured part starts on a warmed, loaded server
rather than an idle one. The load generator announces its start time t0 (system-wide monotonic clock);
this process takes the "before" statistics snapshot at t0 + warmup_s and the "after" snapshot once every
request has finished. Requests due before t0 + warmup_s are kept in the records but `measure` leaves
them out; the few in flight across the boundary (about rate x latency of them) are the only mismatch
between the records and the statistics deltas.
"""

from __future__ import annotations

import json
import math
import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from tuner.errors import InputError, ReplayError, ServerError, TrafficError
from tuner.replay import _plan
from tuner.server.base import Endpoints
from tuner.settings import ReplaySettings
from tuner.traffic import due_offsets

# One Locust process held 800 requests/s within a 2 ms send-lag p99 on this project's reference machine
# (2 cores shared with the server, at a load average near 2; benchmarks/replay_rate.py). Above it a
# second process kept the lag lower even there (p99 4.6 ms against 47 ms at 800 req/s, 15 against 58
# at 1200, load average 2.8), so the replay goes distributed.
SINGLE_PROCESS_RPS = 800.0

Stats = Callable[[], dict]


@dataclass(frozen=True)
class ReplayResult:
    """What one replay produced. `records` has one row per request of the schedule:
    row (position in the traffic, sorted by timestamp), due_s / send_s / end_s (seconds from the replay's start),
    latency_ms (end - due: from the due time), send_lag_ms (send - due), ok, error, worker."""

    records: pd.DataFrame
    stats_before: dict | None   # Triton's model statistics at the end of the warm-up
    stats_after: dict | None    # ... once every request had finished
    speed: float
    warmup_s: float
    duration_s: float           # length of the schedule (last due time)
    mode: str                   # "local" (one process) or "distributed" (master + workers)
    workers: int
    reason: str                 # why this mode
    load_generator_cpu: float   # CPU seconds per wall second, all load-generator processes together
    details: dict = field(default_factory=dict)

    def measured(self) -> pd.DataFrame:
        """The records of the measured part (due at or after the warm-up)."""
        return self.records[self.records["due_s"] >= self.warmup_s]


def choose_workers(requested: int, peak_rps: float, cpus: int | None = None) -> tuple[int, str]:
    """The rule for `ReplaySettings.workers = 0`: one process while the busiest second offers at most
    SINGLE_PROCESS_RPS; above it one worker per SINGLE_PROCESS_RPS, at most one per CPU core."""
    if requested > 0:
        return requested, f"workers={requested} was asked for"
    cpus = cpus or os.cpu_count() or 1
    if peak_rps <= SINGLE_PROCESS_RPS:
        return 1, f"peak {peak_rps:.0f} req/s <= {SINGLE_PROCESS_RPS:.0f} req/s that one process holds"
    n = min(math.ceil(peak_rps / SINGLE_PROCESS_RPS), cpus)
    if n < 2:
        return 1, (f"peak {peak_rps:.0f} req/s > {SINGLE_PROCESS_RPS:.0f} req/s that one process holds, "
                   f"but only {cpus} CPU core")
    return n, f"peak {peak_rps:.0f} req/s > {SINGLE_PROCESS_RPS:.0f} req/s that one process holds"


def replay(
    endpoints: Endpoints,
    model: str,
    traffic: pd.DataFrame,
    speed: float,
    settings: ReplaySettings,
    *,
    warmup_s: float | None = None,
    duration_s: float | None = None,
    stats: Stats | None = None,
    progress: bool = False,
) -> ReplayResult:
    """Replay `traffic` against `model` at `speed`, open loop, and return the per-request records.

    `duration_s` cuts the schedule to requests due within that many seconds (warm-up included);
    `warmup_s` defaults to `settings.warmup_s`; `stats` returns the model's Triton statistics
    (default: `v2/models/<model>/stats` over HTTP). Raises ServerSetupError (unreachable server,
    model not loaded), TrafficError (shapes that do not fit the model), ReplayError (the load
    generator failed).
    """
    warmup_s = settings.warmup_s if warmup_s is None else warmup_s
    metadata, config = _plan.model_info(endpoints.http, model)
    if "timestamp" not in traffic.columns:
        raise TrafficError("traffic has no 'timestamp' column")
    if not traffic["timestamp"].is_monotonic_increasing:
        traffic = traffic.sort_values("timestamp", kind="stable")
    traffic = traffic.reset_index(drop=True)
    due = due_offsets(traffic, speed)
    if duration_s is not None:
        keep = due < duration_s
        traffic, due = traffic[keep].reset_index(drop=True), due[keep]
    if len(due) == 0:
        raise TrafficError("traffic has no requests to replay")
    plan = _plan.plan_requests(metadata, config, traffic)
    stats = _mid_replay(stats or (lambda: _plan.statistics(endpoints.http, model)))
    workers, reason = choose_workers(settings.workers, _plan.peak_rate(due))

    with tempfile.TemporaryDirectory(prefix="tuner-replay-") as tmp:
        tmp = Path(tmp)
        pd.DataFrame({"row": np.arange(len(due)), "due_s": due, "shape_id": plan.shape_ids}).to_parquet(
            tmp / "schedule.parquet", index=False)
        spec = {
            "protocol": settings.protocol,
            "url": endpoints.grpc if settings.protocol == "grpc" else endpoints.http,
            "plan": plan.to_json(),
            "schedule": str(tmp / "schedule.parquet"),
            "records": str(tmp / "records-{index}.parquet"),
            "summary": str(tmp / "summary-{name}.json"),
            "max_in_flight": settings.max_in_flight,
            "request_timeout_s": settings.request_timeout_s,
            "workers": workers,
            "master_port": _free_port() if workers > 1 else 0,
        }
        (tmp / "spec.json").write_text(json.dumps(spec))
        roles = ["local"] if workers == 1 else ["master"] + ["worker"] * workers
        before, after, t0 = _run_processes(tmp, roles, len(due), due[-1], warmup_s, stats, progress)
        records = pd.concat([pd.read_parquet(tmp / f"records-{k}.parquet") for k in range(workers)])
        summaries = [json.loads((tmp / f"summary-{k}.json").read_text()) for k in range(workers)]
        locust = json.loads((tmp / "summary-locust.json").read_text())
    records = records.sort_values("row", kind="stable").reset_index(drop=True)
    wall = max(s["wall_s"] for s in summaries) or 1.0
    return ReplayResult(
        records=records, stats_before=before, stats_after=after, speed=speed, warmup_s=warmup_s,
        duration_s=float(due[-1]), mode="local" if workers == 1 else "distributed", workers=workers,
        reason=reason, load_generator_cpu=sum(s["cpu_s"] for s in summaries) / wall,
        details={"processes": summaries, "t0_monotonic": t0, "plan_shapes": len(plan.shapes),
                 "locust": locust},
    )


def _run_processes(tmp: Path, roles: list[str], total: int, last_due: float, warmup_s: float,
                   stats: Stats, progress: bool) -> tuple[dict | None, dict | None, float]:
    lines: queue.Queue = queue.Queue()
    procs, logs = [], []
    # The load generator imports this very package, wherever the caller found it.
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    for k, role in enumerate(roles):
        log = open(tmp / f"process-{k}.log", "w+")
        logs.append(log)
        proc = subprocess.Popen([sys.executable, "-m", "tuner.replay", str(tmp / "spec.json"), "--role", role],
                                stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        procs.append(proc)
        threading.Thread(target=_pump, args=(k, proc.stdout, lines), daemon=True).start()
    from tqdm import tqdm

    bar = tqdm(total=total, unit="req", desc="replay", disable=not progress, file=sys.stderr,
               dynamic_ncols=True)
    done = [0] * len(roles)
    t0 = None
    before = None
    try:
        open_streams = len(roles)
        while open_streams:
            timeout = 0.2
            if t0 is not None and before is None:
                timeout = max(0.0, min(timeout, t0 + warmup_s - time.monotonic()))
            try:
                k, line = lines.get(timeout=timeout)
            except queue.Empty:
                k, line = None, ""
            if k is not None and line is None:
                open_streams -= 1
            elif line.startswith("START "):
                t0 = float(line.split()[1])
            elif line.startswith("P "):
                done[k] = int(line.split()[2])
                bar.update(sum(done) - bar.n)
            if t0 is not None and before is None and time.monotonic() >= t0 + warmup_s:
                before = stats()
            if any(p.poll() not in (None, 0) for p in procs):
                break
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        failed = [k for k, p in enumerate(procs) if p.returncode != 0]
        if failed:
            k = failed[0]
            logs[k].seek(0)
            tail = [line for line in logs[k].read().splitlines() if line.strip()][-5:]
            raise ReplayError(f"load generator process ({roles[k]}) exited with {procs[k].returncode}: "
                              + " | ".join(tail))
        if t0 is None:
            raise ReplayError("load generator never started")
        time.sleep(0.05)  # Triton updates its statistics just after the response leaves
        after = stats()
        if before is None:
            before = after  # the schedule was shorter than the warm-up: nothing measured
        return before, after, t0
    finally:
        bar.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()


def _mid_replay(stats: Stats) -> Stats:
    """Statistics taken during the replay: a server that stops answering then has died or hung
    (ServerError, exit 1), which is not the user's input (the setup was checked before the start)."""
    def snapshot() -> dict:
        try:
            return stats()
        except InputError as exc:
            raise ServerError(f"the server stopped answering during the replay: {exc}") from None
    return snapshot


def _pump(k: int, stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put((k, line.strip()))
    lines.put((k, None))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
