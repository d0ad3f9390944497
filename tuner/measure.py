"""One trial's measurement, from per-request records and Triton's statistics deltas (pure).

`measure()` is implemented with the replay (issue: open-loop replay); the dataclass is the contract
the score and search stages read.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Measurement:
    # offered load and what came back, over the measured window (warm-up excluded)
    speed: float                    # replay speed s
    offered_rps: float              # requests due per second in the measured window
    duration_s: float               # length of the measured window
    requests: int                   # requests due in the measured window
    errors: int
    error_rate: float
    throughput_rps: float           # successful responses per second
    latency_ms: dict[str, float]    # p50, p90, p95, p99, max: from the due time
    send_lag_ms: dict[str, float]   # p50, p99
    valid: bool                     # False when send lag p99 exceeded the budget
    invalid_reason: str = ""
    # Triton's statistics deltas over the same window
    inference_count: int = 0
    execution_count: int = 0
    fill_rate: float = 0.0          # (inference_count / execution_count) / max_batch_size
    mean_batch_size: float = 0.0
    batch_histogram: dict[int, int] = field(default_factory=dict)  # batch size -> executions
    queue_ms_mean: float = 0.0
    compute_ms_mean: float = 0.0    # per execution: input + infer + output
    busy_s: float = 0.0             # model execution time (compute_input + compute_infer + compute_output)
    max_batch_size: int = 0
    load_generator_cpu: float = 0.0  # CPU seconds used by the load generator per wall second
    workers: int = 1                 # Locust processes used

    def latency(self, percentile: float) -> float:
        """The latency at a percentile the SLA names (p50/p90/p95/p99/max are kept)."""
        key = "max" if percentile >= 100 else f"p{percentile:g}"
        if key not in self.latency_ms:
            raise KeyError(f"latency percentile {key} was not measured")
        return self.latency_ms[key]
