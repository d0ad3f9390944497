"""The production audit (`tuner audit --prometheus`) timed over a backfilled week: Triton's counters
of 20 replicas at 15 s resolution, written as OpenMetrics from a diurnal profile, turned into TSDB
blocks by `promtool tsdb create-blocks-from openmetrics`, served by a real Prometheus.

    python benchmarks/production_audit.py [--replicas 20] [--days 7] [--runs 3]

prints the audit's time (the issue's acceptance: under 10 s) and its figures beside the profile's.
Also the tests' helper (`from benchmarks.production_audit import ...`): the profile, the week's
counters, the backfill and a private Prometheus server.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

__all__ = [
    "MAX_BATCH_SIZE",
    "SCRAPE_S",
    "Week",
    "backfill",
    "expected",
    "prometheus_server",
    "synthetic_week",
    "write_study",
]

PROFILE = Path(__file__).resolve().parents[1] / "traffic_profiles" / "bursty_60s.csv"  # the study's traffic
MAX_BATCH_SIZE = 32
SCRAPE_S = 15.0
# requests per second per replica, by hour of day (UTC), on a weekday; weekends serve half. Chosen away
# from the thresholds (fill 0.5 from the batch rule below, ratio 0.6 at a 100 req/s baseline) so that
# the hours under them are exact.
WEEKDAY_RPS = (20, 20, 20, 20, 20, 20, 30, 45, 70, 85, 90, 90, 90, 90, 85, 80, 75, 70, 50, 45, 35, 30, 25, 20)
QUEUE_US = 2000.0  # per request
COMPUTE_US = 5000.0
ERROR_SHARE = 0.0005


def mean_batch(rps: np.ndarray) -> np.ndarray:
    """The dispatched batch at a rate: fill 0.3 under 40 req/s, 0.75 above (a busy server batches more)."""
    return np.where(rps < 40, 0.3, 0.75) * MAX_BATCH_SIZE


BLOCK_S = 7200  # Prometheus's block range: promtool reads its whole input once per block, so a file per block


@dataclass(frozen=True)
class Week:
    """The synthetic history: its hours (with the profile's figures) and the files it went to."""

    start: float  # Unix seconds, an hour's start
    end: float
    hours: pd.DataFrame  # index: each hour's start (UTC); per_replica_rps, mean_batch, fill_rate, gap
    files: list[Path]  # OpenMetrics, one per block range
    replicas: int


COUNTERS = (
    ("nv_inference_request_success", 1 - ERROR_SHARE),
    ("nv_inference_request_failure", ERROR_SHARE),
    ("nv_inference_count", 1 - ERROR_SHARE),
    ("nv_inference_exec_count", None),
    ("nv_inference_queue_duration_us", QUEUE_US * (1 - ERROR_SHARE)),
    ("nv_inference_compute_infer_duration_us", COMPUTE_US * (1 - ERROR_SHARE)),
)


def synthetic_week(
    folder: Path,
    *,
    end: float,
    replicas: int = 2,
    days: int = 7,
    model: str = "m",
    restart: bool = True,
    gap: bool = True,
    idle_model: str | None = None,
) -> Week:
    """Write `days` of Triton's counters for `replicas` instances ending at `end` (an hour's start,
    Unix seconds) into `folder` as OpenMetrics files, at SCRAPE_S resolution. Replica i serves a
    share (i + 1) / sum of the total (replicas x the profile's rate); every request is one inference.
    With `restart`, the last replica restarts on day 3 (its counters start again at zero); with `gap`,
    no samples for two whole hours on day 5 (every replica) and for 20 minutes inside an hour on day 2
    (the first replica). `idle_model`: another model on one more instance, loaded but never asked."""
    start = end - days * 86400
    hours = pd.date_range(pd.Timestamp(start, unit="s", tz="UTC"), periods=days * 24, freq="h")
    weekend = hours.day_of_week >= 5
    rps = np.asarray(WEEKDAY_RPS, dtype=float)[hours.hour] * np.where(weekend, 0.5, 1.0)
    batch = mean_batch(rps)
    t = start + np.arange(days * 86400 / SCRAPE_S + 1) * SCRAPE_S  # samples at both ends of every hour
    hour_of = np.minimum((t[1:] - start) // 3600, days * 24 - 1).astype(int)  # each step's hour
    keep = np.ones(len(t), dtype=bool)
    gap_hours = np.zeros(days * 24, dtype=bool)
    if gap:  # two whole hours: no samples strictly inside them
        g = start + (5 * 24 + 2) * 3600
        keep &= ~((t > g) & (t < g + 7200))
        gap_hours[5 * 24 + 2 : 5 * 24 + 4] = True
    shares = np.arange(1, replicas + 1) / np.arange(1, replicas + 1).sum()
    restart_at = np.searchsorted(t, start + (3 * 24 + 10) * 3600 + 150 * SCRAPE_S) if restart else None
    series = []  # (name, labels, values, kept)
    for name, per_request in COUNTERS:
        for i, share in enumerate(shares):
            requests = rps[hour_of] * replicas * share * SCRAPE_S
            step = requests / batch[hour_of] if per_request is None else requests * per_request
            value = np.concatenate([[0.0], np.cumsum(step)])
            if restart_at is not None and i == replicas - 1:  # restarted just after a scrape
                value[restart_at:] -= value[restart_at - 1]
            mask = keep.copy()
            if gap and i == 0:  # 20 minutes inside an hour, one replica
                p = start + (2 * 24 + 14) * 3600 + 600
                mask &= ~((t > p) & (t < p + 1200))
            labels = f'{{model="{model}",version="1",instance="10.0.0.{i + 1}:8002",job="triton"}}'
            series.append((name, labels, np.floor(value), mask))
        if idle_model is not None:
            labels = f'{{model="{idle_model}",version="1",instance="10.0.0.99:8002",job="triton"}}'
            series.append((name, labels, np.zeros(len(t)), keep))
    folder.mkdir(parents=True, exist_ok=True)
    block = (t // BLOCK_S).astype(np.int64)
    files = []
    for b in np.unique(block):
        path = folder / f"block-{b}.om"
        in_block = block == b
        with open(path, "w") as out:
            for k, (name, labels, value, mask) in enumerate(series):
                if k == 0 or series[k - 1][0] != name:
                    out.write(f"# TYPE {name} unknown\n")
                m = mask & in_block
                out.write(
                    "".join(f"{name}{labels} {v:.0f} {s:.0f}\n" for v, s in zip(value[m], t[m], strict=True))
                )
            out.write("# EOF\n")
        files.append(path)
    frame = pd.DataFrame(
        {"per_replica_rps": rps, "mean_batch": batch, "fill_rate": batch / MAX_BATCH_SIZE, "gap": gap_hours},
        index=hours.rename("start"),
    )
    return Week(start, end, frame, files, replicas)


def backfill(files: list[Path], data_dir: Path) -> None:
    """TSDB blocks from the OpenMetrics files, in Prometheus's data directory (promtool's backfill,
    a process per file, as many at a time as there are cores)."""
    data_dir.mkdir(parents=True, exist_ok=True)

    def one(path: Path) -> None:
        subprocess.run(
            ["promtool", "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(path), str(data_dir)],
            check=True,
            capture_output=True,
            text=True,
        )

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        list(pool.map(one, files))


@contextlib.contextmanager
def prometheus_server(
    data_dir: Path,
    *,
    scrape: list[str] | None = None,
    scrape_s: float = 1.0,
    retention: str = "30d",
    port: int | None = None,
    rules: list[Path] | None = None,
    wait_for: int | None = None,
) -> Iterator[str]:
    """A Prometheus of our own on 127.0.0.1 (`port`, default a free one) over `data_dir`, scraping the
    `scrape` targets (host:port of /metrics) every `scrape_s` and evaluating `rules` (rule files) as
    often; yields its URL once the first `wait_for` targets (default: all) answered a scrape, and
    stops it (by its pid) at the end."""
    from tuner.localhost import free_ports

    port = port or free_ports(1)[0]
    config = data_dir.parent / f"{data_dir.name}-prometheus.yml"
    jobs = (
        ""
        if not scrape
        else (
            f"scrape_configs:\n  - job_name: triton\n    scrape_interval: {scrape_s:g}s\n"
            f"    scrape_timeout: {scrape_s:g}s\n    static_configs:\n      - targets: [{', '.join(scrape)}]\n"
        )
    )
    rule_files = "" if not rules else f"rule_files: [{', '.join(str(r) for r in rules)}]\n"
    config.write_text(
        f"global:\n  scrape_interval: {scrape_s:g}s\n  evaluation_interval: {scrape_s:g}s\n{rule_files}{jobs}"
    )
    log = open(data_dir.parent / f"{data_dir.name}-prometheus.log", "w")
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={data_dir}",
            f"--storage.tsdb.retention.time={retention}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"prometheus exited ({proc.returncode}): see {log.name}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            if time.monotonic() > deadline:
                raise RuntimeError(f"prometheus not ready within 60 s: see {log.name}")
            time.sleep(0.2)
        if scrape:  # its first scrapes come seconds after it is ready (target discovery is throttled)
            while not _scraped(url, len(scrape) if wait_for is None else wait_for):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"prometheus has not scraped {', '.join(scrape)} within 60 s")
                time.sleep(0.2)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def write_study(
    tmp: Path,
    *,
    model: str = "m",
    repository: Path | None = None,
    price_per_hour: float = 2.0,
    max_error_rate: float = 0.001,
) -> Path:
    """A study file for the production audit: `model` in `repository` (default: a new one in `tmp`
    whose config.pbtxt says max_batch_size MAX_BATCH_SIZE), an SLA and a price per hour."""
    if repository is None:
        repository = tmp / "models"
        (repository / model).mkdir(parents=True, exist_ok=True)
        (repository / model / "config.pbtxt").write_text(
            f'name: "{model}"\nbackend: "python"\nmax_batch_size: {MAX_BATCH_SIZE}\n'
            "dynamic_batching { max_queue_delay_microseconds: 1000 }\n"
        )
    study = {
        "name": "production",
        "model_repository": str(repository),
        "model": model,
        "traffic": {"path": str(PROFILE)},
        "sla": {"latency_ms": 200, "percentile": 99, "max_error_rate": max_error_rate},
        "cost": {"price_per_hour": price_per_hour},
    }
    path = tmp / "production.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def _scraped(url: str, targets: int) -> bool:
    """Whether every scrape target has a sample of `up` that says it answered."""
    query = urllib.parse.urlencode({"query": 'up{job="triton"} == 1'})
    with contextlib.suppress(OSError, ValueError):
        with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=2) as r:
            return len(json.load(r)["data"]["result"]) >= targets
    return False


def expected(week: Week) -> dict:
    """The profile's figures over the hours with samples (what the audit must recover)."""
    h = week.hours[~week.hours["gap"]]
    served = h["per_replica_rps"] * week.replicas * (1 - ERROR_SHARE)
    return {
        "throughput_rps": float(served.mean()),
        "fill_rate": float(served.sum() / (served / h["mean_batch"]).sum() / MAX_BATCH_SIZE),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=20)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    from tuner.production import Prometheus, production_audit
    from tuner.settings import read_study

    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} not found (Debian: apt-get install prometheus)")
    end = math.floor(time.time() / 3600) * 3600
    with tempfile.TemporaryDirectory(prefix="production-audit-") as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        week = synthetic_week(tmp / "week", end=end, replicas=args.replicas, days=args.days)
        samples = args.replicas * len(COUNTERS) * (len(week.hours) * 240)
        size = sum(f.stat().st_size for f in week.files)
        print(
            f"wrote {samples / 1e6:.1f} M samples ({size / 1e6:.0f} MB) in {time.perf_counter() - t0:.1f} s",
            file=sys.stderr,
        )
        t0 = time.perf_counter()
        backfill(week.files, tmp / "data")
        print(f"promtool backfill: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        settings = read_study(write_study(tmp))
        with prometheus_server(tmp / "data") as url:
            want = expected(week)
            for run in range(args.runs):
                t0 = time.perf_counter()
                audit = production_audit(settings, Prometheus(url), window_s=args.days * 86400, end=week.end)
                took = time.perf_counter() - t0
                f = audit.figures
                print(
                    f"run {run + 1}: audit of {args.days} d x {args.replicas} replicas at {SCRAPE_S:g} s: "
                    f"{took:.2f} s; throughput {f.throughput_rps:.1f} req/s (profile {want['throughput_rps']:.1f}), "
                    f"fill {f.fill_rate:.3f} (profile {want['fill_rate']:.3f}); load average "
                    f"{os.getloadavg()[0]:.2f}"
                )
            # the command itself, its start-up included (its window ends at the last whole hour, as the week)
            t0 = time.perf_counter()
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "tuner",
                    "audit",
                    settings.source,
                    "--prometheus",
                    url,
                    "--window",
                    f"{args.days}d",
                ],
                capture_output=True,
                text=True,
            )
            print(
                f"`tuner audit --prometheus` (a process): {time.perf_counter() - t0:.2f} s, exit {done.returncode}; "
                f"load average {os.getloadavg()[0]:.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
