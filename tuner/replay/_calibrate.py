"""How many load-generator processes a replay needs on this host: a calibration of what one process
costs per request here, once per run, and the rule that turns it and the offered peak into a count.

The calibration is a short replay (CALIBRATION_REQUESTS at CALIBRATION_RPS, one process) against a
sink on 127.0.0.1 that answers at once (`_sink`), so it measures the load generator alone: its CPU
time per request, which the machine's other work barely changes (unlike a send lag). One process
keeps its send lag p99 within 2 ms while it is busy at most BUSY_FRACTION of the time, so it holds
BUSY_FRACTION / (CPU seconds per request) requests per second (benchmarks/replay_rate.py).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import numpy as np

from tuner.localhost import owned_temporary_dir
from tuner.replay._processes import REPLAY_PREFIX, run_load_generator
from tuner.replay._sink import sink

CALIBRATION_REQUESTS = 1500
CALIBRATION_RPS = 2000.0
# The share of one core a load-generator process may be busy and still hold send lag p99 <= 2 ms.
BUSY_FRACTION = 0.3
_PLAN = {"model": "calibration", "inputs": [{"name": "INPUT_IDS", "datatype": "INT32"}],
         "outputs": ["OUT"], "shapes": [[[1, 64]]]}


@dataclass(frozen=True)
class Calibration:
    """What one load-generator process costs per request on this host, and the rate it holds."""

    protocol: str
    cpu_us_per_request: float   # CPU time of the load-generator process per request (user + system)
    per_process_rps: float      # the rate one process holds: BUSY_FRACTION / CPU per request
    cpus: int                   # cores this process may run on (its CPU affinity)
    lag_p99_ms: float           # the calibration's own send lag p99 (the host's timing, at CALIBRATION_RPS)
    seconds: float              # how long the calibration took

    def describe(self) -> str:
        """One line for a person: the cost, the rate one process holds, the cores."""
        return (f"load generator on this host ({self.protocol}): {self.cpu_us_per_request:.0f} us CPU per "
                f"request, one process holds ~{self.per_process_rps:.0f} req/s; {self.cpus} CPU cores "
                f"(calibrated in {self.seconds:.1f} s, send lag p99 {self.lag_p99_ms:.2f} ms at "
                f"{CALIBRATION_RPS:.0f} req/s)")


_CACHE: dict[str, Calibration] = {}


def calibrate(protocol: str = "http", *, refresh: bool = False) -> Calibration:
    """This host's calibration for `protocol`, measured on first use and kept for the process."""
    if refresh or protocol not in _CACHE:
        _CACHE[protocol] = _measure(protocol)
    return _CACHE[protocol]


def cached_calibration(protocol: str) -> Calibration | None:
    """The calibration already measured in this process, if any (measures nothing)."""
    return _CACHE.get(protocol)


def per_process_rps(cpu_s_per_request: float, busy_fraction: float = BUSY_FRACTION) -> float:
    """The rate one process holds when each request costs it `cpu_s_per_request` of CPU."""
    return busy_fraction / cpu_s_per_request if cpu_s_per_request > 0 else math.inf


def choose_workers(requested: int, peak_rps: float, *, per_process_rps: float, cpus: int) -> tuple[int, str]:
    """The rule for `ReplaySettings.workers = 0`: (processes, why). One process while the busiest
    second offers at most what one process holds on this host; above it one per `per_process_rps`,
    at most one per CPU core (past that the load generator itself may limit the replay, and says so)."""
    if requested > 0:
        return requested, f"workers={requested} was asked for"
    need = max(1, math.ceil(peak_rps / per_process_rps))
    if need == 1:
        return 1, f"peak {peak_rps:.0f} req/s <= {per_process_rps:.0f} req/s that one process holds here"
    n = min(need, max(1, cpus))
    if n < need:
        return n, (f"peak {peak_rps:.0f} req/s needs {need} processes of {per_process_rps:.0f} req/s, but "
                   f"there are {cpus} CPU cores: the load generator may limit this replay")
    return n, f"peak {peak_rps:.0f} req/s > {per_process_rps:.0f} req/s that one process holds here"


def available_cpus() -> int:
    """The cores this process may run on (its affinity, e.g. under taskset), else all of them."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _measure(protocol: str) -> Calibration:
    start = time.monotonic()
    due = np.arange(CALIBRATION_REQUESTS) / CALIBRATION_RPS
    with owned_temporary_dir(REPLAY_PREFIX) as tmp, sink(protocol) as address:
        outcome = run_load_generator(
            tmp, protocol=protocol, url=address, plan=_PLAN, due=due,
            shape_ids=np.zeros(len(due), dtype=np.int64), workers=1, max_in_flight=1000,
            request_timeout_s=10.0, warmup_s=0.0, stats=dict, progress=False)
    summary = outcome.summaries[0]
    # A request dropped at the in-flight cap (a sink slowed by a busy machine) has no send time and
    # cost the process next to nothing: both figures are over the requests that were sent.
    lag = outcome.records["send_lag_ms"].dropna().to_numpy()
    sent = max(1, len(lag))
    cpu = summary["cpu_s"] / sent
    return Calibration(protocol=protocol, cpu_us_per_request=cpu * 1e6, per_process_rps=per_process_rps(cpu),
                       cpus=available_cpus(), lag_p99_ms=float(np.percentile(lag, 99)) if len(lag) else 0.0,
                       seconds=time.monotonic() - start)
