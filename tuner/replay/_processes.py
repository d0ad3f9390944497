"""Start the load-generator processes (`python -m tuner.replay`) for one schedule and collect what they
wrote: per-request records, one summary per process, Locust's own totals. Parent side, unpatched."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from tuner.errors import ReplayError
from tuner.localhost import free_ports
from tuner.replay import _forkserver
from tuner.server.base import Watch

REPLAY_PREFIX = "tuner-replay-"  # temporary directories of a replay (removed by the next when their owner died)
Stats = Callable[[], dict]


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What the processes wrote, and the statistics snapshots taken around the measured part."""

    records: pd.DataFrame   # one row per request of the schedule, in schedule order
    summaries: list[dict]   # one per walking process: cpu_s, wall_s, requests, gc pauses, ...
    locust: dict            # Locust's own statistics totals: requests, failures
    stats_before: dict | None
    stats_after: dict | None
    t0: float               # the start of the schedule (time.monotonic, system-wide)
    stopped: bool = False   # `watch` ended it early: no records


def run_load_generator(tmp: Path, *, protocol: str, url: str, plan: dict, due: np.ndarray,
                       shape_ids: np.ndarray, workers: int, max_in_flight: int, request_timeout_s: float,
                       warmup_s: float, stats: Stats, progress: bool, watch: Watch | None = None,
                       watch_every_s: float = 1.0, cut: dict | None = None) -> Outcome:
    """Walk the schedule `due` (seconds from the start; request i of shape `shape_ids[i]` of `plan`)
    with `workers` processes (1: one local process; more: a master and that many workers). `watch`,
    called every `watch_every_s` from the start, may end the walk early (then nothing is recorded).
    `cut` (a generative walk in one process): the rule that cuts its open streams (`_worker`'s doc)."""
    # numpy's own files both ways: the load generator then imports neither pandas nor pyarrow (~1 s of
    # CPU each time a process starts, with every replay)
    np.savez(tmp / "schedule.npz", row=np.arange(len(due)), due_s=np.asarray(due, dtype=float),
             shape_id=np.asarray(shape_ids))
    spec = {
        "protocol": protocol,
        "url": url,
        "plan": plan,
        "schedule": str(tmp / "schedule.npz"),
        "records": str(tmp / "records-{index}.npz"),
        "summary": str(tmp / "summary-{name}.json"),
        "max_in_flight": max_in_flight,
        "request_timeout_s": request_timeout_s,
        "workers": workers,
        "master_port": free_ports(1)[0] if workers > 1 else 0,
        **({"cut": cut} if cut is not None and workers == 1 else {}),
    }
    (tmp / "spec.json").write_text(json.dumps(spec))
    roles = ["local"] if workers == 1 else ["master"] + ["worker"] * workers
    before, after, t0, stopped = _run_processes(tmp, roles, len(due), warmup_s=warmup_s, stats=stats, progress=progress, watch=watch,
                                                watch_every_s=watch_every_s)
    if stopped:
        return Outcome(records=pd.DataFrame(), summaries=[], locust={}, stats_before=before, stats_after=after,
                       t0=t0, stopped=True)
    records = pd.concat([_records(tmp / f"records-{k}.npz") for k in range(workers)])
    return Outcome(
        records=records.sort_values("row", kind="stable").reset_index(drop=True),
        summaries=[json.loads((tmp / f"summary-{k}.json").read_text()) for k in range(workers)],
        locust=json.loads((tmp / "summary-locust.json").read_text()),
        stats_before=before, stats_after=after, t0=t0)


def _run_processes(tmp: Path, roles: list[str], total: int, *, warmup_s: float, stats: Stats,
                   progress: bool, watch: Watch | None, watch_every_s: float
                   ) -> tuple[dict | None, dict | None, float, bool]:
    lines: queue.Queue = queue.Queue()
    procs, logs = [], []
    # The load generator imports this very package, wherever the caller found it.
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    for k, role in enumerate(roles):
        log = open(tmp / f"process-{k}.log", "w+")
        logs.append(log)
        proc = _forkserver.start([str(tmp / "spec.json"), "--role", role], stderr=log, env=env)
        procs.append(proc)
        threading.Thread(target=_pump, args=(k, proc.stdout, lines), daemon=True).start()
    from tqdm import tqdm

    bar = tqdm(total=total, unit="req", desc="replay", disable=not progress, file=sys.stderr,
               dynamic_ncols=True)
    done = [0] * len(roles)
    t0 = None
    before = None
    watched = 0
    try:
        open_streams = len(roles)
        while open_streams:
            timeout = 0.2
            if t0 is not None and before is None:
                timeout = max(0.0, min(timeout, t0 + warmup_s - time.monotonic()))
            if t0 is not None and watch is not None:
                timeout = max(0.0, min(timeout, t0 + (watched + 1) * watch_every_s - time.monotonic()))
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
            if t0 is not None and watch is not None and time.monotonic() >= t0 + (watched + 1) * watch_every_s:
                watched += 1
                if watch(time.monotonic() - t0):
                    return before, stats(), t0, True  # the processes are ended below
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
        return before, after, t0, False
    finally:
        bar.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()


def _records(path: Path) -> pd.DataFrame:
    """One process's records (`_worker.Share.columns`): a generative share's gaps between tokens come
    as one array and a count per request, and go back to one array per request."""
    with np.load(path) as saved:
        columns = {name: saved[name] for name in saved.files}
    counts = columns.pop("itl_count", None)
    if counts is not None:
        columns["itl_ms"] = list(np.split(columns["itl_ms"], np.cumsum(counts)[:-1])) if len(counts) else []
    frame = pd.DataFrame(columns)
    frame["error"] = frame["error"].astype(object)
    return frame


def _pump(k: int, stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put((k, line.strip()))
    lines.put((k, None))
