"""vLLM's own figures, read from Triton's `/metrics` (the llm_vllm template and NVIDIA's vLLM backend
report them there, labelled with the model): a snapshot parsed with `prometheus_client`'s parser, the
difference of two snapshots over a replay, and a histogram's quantile as Prometheus computes it
(`histogram_quantile`: linear within the bucket that holds the rank), so that what a replay measured
can be set beside what the engine saw of the same requests.

    read_engine(text, model)        -> EngineSnapshot   the `vllm:` series of one model
    engine_delta(before, after)     -> EngineFigures    what happened between two snapshots
    Histogram.quantile(q) / mean()
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["OVERRUN_LIMIT", "EngineFigures", "EngineSnapshot", "Histogram", "engine_delta", "read_engine"]

PREFIX = "vllm:"
TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:time_per_output_token_seconds"  # the gaps between tokens (NVIDIA's backend calls it TPOT)
TPOT = "vllm:request_time_per_output_token_seconds"  # per request: (last - first) / (tokens - 1)
E2E = "vllm:e2e_request_latency_seconds"
QUEUE = "vllm:request_queue_time_seconds"
# counters by family name: the parser names a counter's family without `_total` whether the exposition
# wrote it (vllm:prompt_tokens_total) or not (vllm:num_preemptions)
COUNTERS = {"prompt_tokens": "vllm:prompt_tokens", "generation_tokens": "vllm:generation_tokens",
            "preemptions": "vllm:num_preemptions", "requests": "vllm:request_success"}
GAUGES = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
          "kv_cache_usage": "vllm:kv_cache_usage_perc"}
# the llm_sim template's (an emulated GPU): its engine steps, and those the CPU ran past their emulated time
EMULATED = {"emulated_steps": "tuner_emulated_gpu_steps", "emulated_overruns": "tuner_emulated_gpu_overrun_steps"}
OVERRUN_LIMIT = 0.05  # past this share of overrun steps, an emulated GPU's figures are partly the CPU's


@dataclass(frozen=True)
class Histogram:
    """Observations by bucket: `bounds` the finite upper bounds (seconds), `counts` per bucket with
    one more for +Inf (not cumulative), their `total` and `count`."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    total: float
    count: float

    def mean(self) -> float:
        """The mean observation (exact: the sum over the count); NaN when there is none."""
        return self.total / self.count if self.count > 0 else math.nan

    def quantile(self, q: float) -> float:
        """Prometheus's `histogram_quantile(q)`: the bucket holding rank q x count, linear within it
        (from 0 for the first); the largest finite bound when the rank is in +Inf; NaN when empty."""
        if not self.count > 0:
            return math.nan
        rank, seen = q * self.count, 0.0
        for k, n in enumerate(self.counts):
            if seen + n >= rank and n > 0:
                if k == len(self.bounds):  # +Inf: Prometheus answers the largest finite bound
                    return self.bounds[-1]
                low = self.bounds[k - 1] if k else 0.0
                return low + (self.bounds[k] - low) * (rank - seen) / n
            seen += n
        return self.bounds[-1] if self.bounds else math.nan

    def binned(self, seconds) -> Histogram:
        """`seconds` (observations) counted into these buckets as Prometheus counts them (`le`: a value on
        a bound is in that bound's bucket), so that their quantiles compare with this histogram's like for
        like: a quantile of a histogram is linear within its bucket, not the observations' own."""
        values = np.asarray(seconds, dtype=float)
        edges = np.searchsorted(np.asarray(self.bounds), values, side="left")
        counts = np.bincount(edges, minlength=len(self.bounds) + 1)
        return Histogram(self.bounds, tuple(float(c) for c in counts), float(values.sum()), float(len(values)))

    def minus(self, earlier: Histogram) -> Histogram:
        """The observations made since `earlier` (the same buckets)."""
        if earlier.bounds != self.bounds:
            raise ValueError("histograms with different buckets")
        return Histogram(self.bounds, tuple(a - b for a, b in zip(self.counts, earlier.counts, strict=True)),
                         self.total - earlier.total, self.count - earlier.count)


@dataclass(frozen=True)
class EngineSnapshot:
    """One model's `vllm:` series at one moment: counters and gauges by family name, histograms by name."""

    values: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class EngineFigures:
    """What the engine counted between two snapshots (histograms of the requests finished in between),
    and its gauges at the second."""

    requests: float
    prompt_tokens: float
    generation_tokens: float
    preemptions: float
    running: float
    waiting: float
    kv_cache_usage: float
    histograms: dict[str, Histogram]
    emulated_steps: float = 0.0     # an emulated GPU's (llm_sim) engine steps; 0 on a real engine
    emulated_overruns: float = 0.0  # ... those the CPU took longer than the emulated GPU would have

    @property
    def overrun_share(self) -> float:
        """The share of an emulated GPU's steps the CPU ran past their time (NaN on a real engine):
        above a few per cent, the figures are partly the CPU's, not the emulated GPU's."""
        return self.emulated_overruns / self.emulated_steps if self.emulated_steps > 0 else math.nan

    def seconds(self, name: str) -> Histogram | None:
        """One histogram (`TTFT`, `TPOT`, `ITL`, `E2E`, `QUEUE`), None when the engine reports none."""
        return self.histograms.get(name)


def read_engine(text: str, model: str) -> EngineSnapshot:
    """The `vllm:` series of `model` (label `model`; a series without that label is taken too) in a
    Prometheus text exposition, with an emulated GPU's step counters (`EMULATED`)."""
    values: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(PREFIX) and family.name not in EMULATED.values():
            continue
        for sample in family.samples:
            if sample.labels.get("model", model) != model:
                continue
            if family.type == "histogram":
                if sample.name.endswith("_bucket"):
                    buckets.setdefault(family.name, {})[float(sample.labels["le"])] = sample.value
                elif sample.name.endswith("_sum"):
                    sums[family.name] = sample.value
                elif sample.name.endswith("_count"):
                    counts[family.name] = sample.value
            elif not sample.name.endswith("_created"):
                values[family.name] = values.get(family.name, 0.0) + sample.value
    histograms = {}
    for name, cumulative in buckets.items():
        les = sorted(cumulative)
        finite = tuple(le for le in les if math.isfinite(le))
        running = [cumulative[le] for le in les]
        per_bucket = tuple(b - a for a, b in zip([0.0, *running[:-1]], running, strict=True))
        if len(per_bucket) == len(finite):  # no +Inf bucket written: nothing above the last bound
            per_bucket = (*per_bucket, 0.0)
        histograms[name] = Histogram(finite, per_bucket, sums.get(name, 0.0), counts.get(name, running[-1]))
    return EngineSnapshot(values, histograms)


def engine_delta(before: EngineSnapshot, after: EngineSnapshot) -> EngineFigures:
    """The engine's figures between two snapshots of one model."""
    def counted(key: str) -> float:
        name = COUNTERS[key]
        return after.values.get(name, 0.0) - before.values.get(name, 0.0)

    histograms = {}
    for name, hist in after.histograms.items():
        earlier = before.histograms.get(name)
        histograms[name] = hist.minus(earlier) if earlier is not None else hist
    return EngineFigures(requests=counted("requests"), prompt_tokens=counted("prompt_tokens"),
                         generation_tokens=counted("generation_tokens"), preemptions=counted("preemptions"),
                         running=after.values.get(GAUGES["running"], math.nan),
                         waiting=after.values.get(GAUGES["waiting"], math.nan),
                         kv_cache_usage=after.values.get(GAUGES["kv_cache_usage"], math.nan),
                         histograms=histograms,
                         **{key: after.values.get(name, 0.0) - before.values.get(name, 0.0)
                            for key, name in EMULATED.items()})
