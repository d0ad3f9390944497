"""Pure: the SLA check of one measurement, requests per dollar both ways, servers and their cost.
(The capacity search that uses the SLA check is `tuner.trial.capacity`.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuner.cost import HOURS_PER_MONTH
from tuner.measurement import Measurement
from tuner.settings import SlaSettings


@dataclass(frozen=True)
class SlaCheck:
    """The SLA check of one measurement: whether it holds, the latency, the error rate and the violation."""

    ok: bool
    latency_ms: float  # at the SLA's percentile
    error_rate: float
    # how far the worse of the two limits is broken, relative to the limit: <= 0 when the SLA holds
    # (this is the Optuna constraint value)
    violation: float
    reason: str = ""


def check_sla(m: Measurement, sla: SlaSettings) -> SlaCheck:
    """Whether `m` meets the SLA: its latency at the SLA's percentile, its error rate and the violation."""
    latency = m.latency(sla.percentile)
    over_latency = latency / sla.latency_ms - 1.0
    # an error budget of 0 allows no errors at all: any error breaks it by 1 (100%)
    if sla.max_error_rate > 0:
        over_errors = m.error_rate / sla.max_error_rate - 1.0
    else:
        over_errors = 1.0 if m.error_rate > 0 else -1.0
    violation = max(over_latency, over_errors)
    if math.isnan(violation):
        violation = float("inf")
    reasons = []
    if over_latency > 0:
        reasons.append(f"p{sla.percentile:g} {latency:.1f} ms > {sla.latency_ms:g} ms")
    if over_errors > 0:
        reasons.append(f"error rate {m.error_rate:.2%} > {sla.max_error_rate:.2%}")
    return SlaCheck(violation <= 0, latency, m.error_rate, violation, "; ".join(reasons))


# --- requests per dollar ---------------------------------------------------------------------------


def capacity_score(capacity_rps: float, price_per_hour: float) -> float:
    """Requests per dollar of a server dedicated to the model and kept busy at its capacity."""
    return capacity_rps * 3600.0 / price_per_hour


def utilization_score(m: Measurement, price_per_hour: float) -> float | None:
    """Requests per dollar of the model's busy time at the recorded load (GPU shared or billed by
    use). None when Triton reported no execution time."""
    served = m.requests - m.errors
    if m.busy_s <= 0 or served <= 0:
        return None
    return served / (m.busy_s * price_per_hour / 3600.0)


def servers_needed(peak_rps: float, capacity_rps: float) -> int | None:
    """Servers of `capacity_rps` each that serve `peak_rps` (at least 1; None without a capacity)."""
    if capacity_rps <= 0:
        return None
    return max(1, math.ceil(peak_rps / capacity_rps - 1e-9))


def monthly_cost(servers: int | None, price_per_hour: float) -> float | None:
    """What `servers` servers cost per month (None when the number of servers is unknown)."""
    return None if servers is None else servers * price_per_hour * HOURS_PER_MONTH
