"""One trial's outcome as a typed record, and the one place it meets Optuna's attributes (pure).

    TrialRecord        what a trial measured: the replay at the recorded load, the capacity bracket
                       with the replay at capacity, both scores, and the outcome
    Figures, Bracket, Warmup   its parts
    Evaluate           (params, Hints) -> TrialRecord: a trial, run for real (`tuner.trial.run`) or
                       simulated (`tuner.simulate`): what the search calls
    assess(...)        a measured trial's record from its replay at the load and its capacity search
    to_attrs(record)   the record as flat, JSON-able Optuna user attributes (also trials.csv's columns)
    from_attrs(attrs)  ... and back: every reader (export, report, audit, nightly) goes through it
    record_of(trial)   the record of a FrozenTrial (None for a trial that failed before measuring)
    is_feasible(trial) the one definition of a feasible trial

Outcomes: `measured` (the SLA check at the recorded load is the configuration's), `unmeasured` (the
load generator could not keep its send-lag budget even after retries: neither feasible nor
infeasible, never scored), `unstable` (the server never reached steady state after the load: its
figures are kept, it is never recommended; a model that failed the warm-up's requests is not unstable
but `measured` and infeasible, `Warmup.failing`), `crashed` (the configuration brought the server down:
infeasible), `refused` (the engine refuses the combination, as vLLM refuses batched tokens below its
sequences: infeasible, nothing run).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.measurement import Measurement
from tuner.measurement_tokens import TokenMeasurement
from tuner.score import (
    SlaCheck,
    capacity_score,
    check_sla,
    check_tokens,
    monthly_cost,
    servers_needed,
    tokens_per_dollar_at_capacity,
    tokens_per_dollar_at_load,
    utilization_score,
)
from tuner.settings import SlaSettings
from tuner.space import Params
from tuner.trial.capacity import Capacity, Hints, Step

__all__ = ["MEASURED", "UNMEASURED", "UNSTABLE", "CRASHED", "REFUSED", "NO_VERDICT", "Bracket", "Evaluate", "Figures", "REQUESTS", "Scoring",
           "TOKENS", "TrialRecord", "Warmup", "assess", "from_attrs", "is_feasible", "record_of", "to_attrs"]

MEASURED, UNMEASURED, UNSTABLE, CRASHED, REFUSED = "measured", "unmeasured", "unstable", "crashed", "refused"
NO_VERDICT = (UNMEASURED, UNSTABLE)  # outcomes that say nothing for or against the configuration


@dataclass(frozen=True, kw_only=True)
class Warmup:
    """What a warm-up after a load did, and whether the server reached steady state (tuner.trial.warmup)."""

    seconds: float = 0.0
    sweep_requests: int = 0
    sweep_errors: int = 0
    window_errors: int = 0  # requests Triton failed while the windows replayed the traffic
    first_error: str = ""   # the first failed request's error, where the client saw it (sweep or windows)
    windows_ms: tuple[float, ...] = ()  # compute per execution, at a fixed batch mix, per window compared
    stable: bool = True
    # not steady because the model failed its requests (more of the warm-up's failed than were served),
    # not because it was slow: `reason` says so with the first error
    failing: bool = False
    reason: str = ""
    seen: str = ""  # the windows it saw, as printed (tuner.trial.warmup.describe_windows)

    @property
    def errors(self) -> int:
        """The warm-up's failed requests: the shape sweep's and the windows'."""
        return self.sweep_errors + self.window_errors

    def failures(self) -> str:
        """How many of its requests failed, and where, in a few words ("" when none did). They judge
        nothing (only the measured window does), but a server that fails them is worth saying."""
        if not self.errors:
            return ""
        parts = [f"{self.sweep_errors} of {self.sweep_requests} shape-sweep requests"] if self.sweep_errors else []
        parts += [f"{self.window_errors} while replaying the traffic"] if self.window_errors else []
        return f"{self.errors} requests failed ({', '.join(parts)})"


@dataclass(frozen=True, kw_only=True)
class Figures:
    """One replay's figures as a trial keeps them (the per-request records are not kept)."""

    speed: float = 0.0
    offered_rps: float = 0.0
    requests: int = 0
    errors: int = 0
    error_rate: float = 0.0
    throughput_rps: float = 0.0
    latency_ms: dict[str, float | None] = field(default_factory=dict)  # p50 ... max, from the due time
    fill_rate: float = 0.0
    mean_batch_size: float = 0.0
    queue_ms: float | None = None      # Triton: waiting in the queue, per request
    compute_ms: float | None = None    # Triton: computing, per execution
    busy_s: float = 0.0
    send_lag_p99_ms: float | None = None
    batch_histogram: dict[int, int] = field(default_factory=dict)
    valid: bool = True
    invalid_reason: str = ""
    attempts: int = 1                  # replays run to get a valid one (the retry policy's count)
    repeats: int = 1                   # valid replays near the SLA's limit; the figures are the median one's
    workers: int = 1                   # load-generator processes of the last attempt
    # a generative model's (tuner.measurement_tokens; latency_ms is then end to end): None for an encoder's
    ttft_ms: dict[str, float | None] = field(default_factory=dict)  # time to first token, from the due time
    tpot_ms: dict[str, float | None] = field(default_factory=dict)  # time per output token
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    output_tokens_per_s: float | None = None
    total_tokens_per_s: float | None = None
    goodput_rps: float | None = None
    streamed_tokens_per_s: float | None = None  # the engine's output rate over the window, every request's
    # ... and the engine's batching over the replay (tuner.llm.engine_watch.BATCH_FIGURES), where it was read
    preemptions: float | None = None
    running_peak: float | None = None  # sequences running at once, the peak of the samples
    waiting_peak: float | None = None
    kv_cache_peak: float | None = None  # KV-cache use, 0..1
    emulated_overrun_share: float | None = None  # an emulated GPU's (llm_sim) steps the CPU ran past their time

    @property
    def generative(self) -> bool:
        """Whether these are a generative replay's figures (tokens)."""
        return self.output_tokens is not None

    @classmethod
    def of_tokens(cls, m: TokenMeasurement) -> Figures:
        """The figures of a generative measurement."""
        return cls(
            speed=m.speed, offered_rps=m.offered_rps, requests=m.requests, errors=m.errors, error_rate=m.error_rate,
            throughput_rps=m.throughput_rps, latency_ms={k: _finite(v) for k, v in m.e2e_ms.items()},
            busy_s=m.busy_s, send_lag_p99_ms=_finite(m.send_lag_ms.get("p99")), valid=m.valid,
            invalid_reason=m.invalid_reason, attempts=m.attempts, repeats=m.repeats, workers=m.workers,
            ttft_ms={k: _finite(v) for k, v in m.ttft_ms.items()}, tpot_ms={k: _finite(v) for k, v in m.tpot_ms.items()},
            output_tokens=m.output_tokens, prompt_tokens=m.prompt_tokens, output_tokens_per_s=m.output_tokens_per_s,
            total_tokens_per_s=m.total_tokens_per_s, goodput_rps=m.goodput_rps,
            streamed_tokens_per_s=_finite(m.streamed_tokens_per_s),
            **{name: _finite(value) for name, value in m.engine.items()},
        )

    @classmethod
    def of(cls, m: Measurement) -> Figures:
        """The figures of a measurement."""
        return cls(
            speed=m.speed, offered_rps=m.offered_rps, requests=m.requests, errors=m.errors,
            error_rate=m.error_rate, throughput_rps=m.throughput_rps,
            latency_ms={k: _finite(v) for k, v in m.latency_ms.items()}, fill_rate=m.fill_rate,
            mean_batch_size=m.mean_batch_size, queue_ms=_finite(m.queue_ms_mean), compute_ms=_finite(m.compute_ms_mean),
            busy_s=m.busy_s, send_lag_p99_ms=_finite(m.send_lag_ms.get("p99")),
            batch_histogram=dict(m.batch_histogram), valid=m.valid, invalid_reason=m.invalid_reason,
            attempts=m.attempts, repeats=m.repeats, workers=m.workers,
        )


@dataclass(frozen=True, kw_only=True)
class Bracket:
    """Where the capacity search ended: the last speed that met the SLA and the first that broke it."""

    rps: float = 0.0                   # capacity: offered rate at the highest passing speed (0: none)
    speed: float = 0.0
    upper_rps: float | None = None     # the lowest failing speed's rate (None: none failed)
    upper_speed: float | None = None
    steps: int = 0
    converged: bool = False            # the bracket is within the tolerance
    limited_by: str = ""               # "", max_speed, min_speed, max_steps, load_generator, traffic
    lag_retries: int = 0               # replays run again because the send lag broke its budget
    peak_rps: float | None = None      # the recording's busiest second, replayed at the capacity speed
    at_capacity: Figures | None = None

    @property
    def width(self) -> float | None:
        """upper / lower - 1: how sure the capacity is (None when the bracket is open)."""
        return self.upper_rps / self.rps - 1.0 if self.upper_rps and self.rps > 0 else None


@dataclass(frozen=True, kw_only=True)
class TrialRecord:
    """What a trial measured: its figures at the recorded load, capacity bracket, scores and outcome."""

    params: Params
    outcome: str = MEASURED
    at_load: Figures | None = None
    sla_met: bool = False              # at the recorded load
    violation: float = math.inf        # the SLA constraint at the recorded load (<= 0: met)
    sla_reason: str = ""
    capacity: Bracket | None = None    # None: not searched (SLA missed at the load, or not asked for)
    scores: dict[str, float | None] = field(default_factory=lambda: {"capacity": None, "utilization": None})
    pruned: bool = False
    price_per_hour: float = 0.0
    peak_rps: float = 0.0
    servers_needed: int | None = None
    monthly_cost: float | None = None
    note: str = ""                     # why unmeasured or unstable, what the crash left in the server log, or
                                       # that the server died during a load the next one survived
    warmup: Warmup | None = None       # the warm-up after the configuration's load
    # a generative trial's capacity steps: the seconds of traffic each replays before its window (the
    # mean end-to-end time at the recorded load: the engine holds its steady share of sequences by then)
    step_warmup_s: float | None = None
    # every request's latency at capacity (for CDFs): kept in memory, not in the storage
    latencies_ms: tuple[float, ...] = field(default=(), repr=False, compare=False)

    @property
    def capacity_rps(self) -> float:
        """The trial's capacity, as requests/s (0 when it was not searched)."""
        return self.capacity.rps if self.capacity else 0.0

    @property
    def capacity_speed(self) -> float:
        """The replay speed at the trial's capacity (0 when it was not searched)."""
        return self.capacity.speed if self.capacity else 0.0

    @property
    def unit(self) -> str:
        """What the scores count per dollar: "tokens" (output tokens) for a generative model, else "requests"."""
        return "tokens" if self.at_load is not None and self.at_load.generative else "requests"

    @property
    def meets_sla(self) -> bool:
        """Measured, and the SLA held at the recorded load."""
        return self.outcome == MEASURED and self.sla_met

    def value(self, scoring: str) -> float:
        """The objective under the study's scoring; 0 when the configuration does not qualify."""
        score = self.scores.get(scoring)
        return float(score) if self.meets_sla and score is not None else 0.0

    def score_upper(self, scoring: str) -> float | None:
        """The score at the top of the capacity bracket, its first failing speed (score x upper / lower
        rate): the capacity lies between that speed and the last passing one, the score's. None under
        another scoring, without a score, or where no speed failed (an open bracket)."""
        score = self.scores.get(scoring)
        width = self.capacity.width if scoring == "capacity" and self.capacity is not None else None
        return float(score) * (1.0 + width) if score is not None and width else None


# a trial: run for real (tuner.trial.run.make_evaluate) or simulated; what the search calls
Evaluate = Callable[[Params, Hints], TrialRecord]


@dataclass(frozen=True, kw_only=True)
class Scoring:
    """How one kind of measurement is checked against the SLA, kept and scored: an encoder's replay
    (`REQUESTS`: requests per dollar) or a generative model's (`TOKENS`: output tokens per dollar)."""

    check: Callable[[Any, SlaSettings], SlaCheck]
    figures: Callable[[Any], Figures]
    # (the replay at capacity, the capacity in requests/s, the price per hour) -> the capacity score
    capacity: Callable[[Any, float, float], float | None]
    utilization: Callable[[Any, float], float | None]  # (the replay at the load, the price) -> its score
    latencies: Callable[[Any], Any]  # what the report's CDF draws, per request at capacity


REQUESTS = Scoring(check=check_sla, figures=Figures.of,
                   capacity=lambda _at, rps, price: capacity_score(rps, price) if rps > 0 else None,
                   utilization=utilization_score, latencies=lambda m: m.latencies_ms)
TOKENS = Scoring(
    check=check_tokens, figures=Figures.of_tokens,
    capacity=lambda at, rps, price: tokens_per_dollar_at_capacity(
        output_tokens_per_s=at.output_tokens_per_s, prompt_tokens_per_s=at.total_tokens_per_s - at.output_tokens_per_s,
        price_per_hour=price).output if at is not None and rps > 0 else None,
    utilization=lambda m, price: tokens_per_dollar_at_load(output_tokens=m.output_tokens, prompt_tokens=m.prompt_tokens,
                                                           busy_s=m.busy_s, price_per_hour=price).output,
    latencies=lambda m: m.ttfts_ms)


def assess(params: Params, load: Measurement, sla: SlaSettings, *, capacity: Callable[[Step], Capacity] | None,
           price_per_hour: float, load_speed: float, peak_rps: float,
           peak_at: Callable[[float], float] | None = None, scoring: Scoring = REQUESTS,
           check: Callable[[Measurement, SlaSettings], SlaCheck] | None = None, **extra) -> TrialRecord:
    """A measured trial's record from its replay at the recorded load: the SLA there, then (if it
    held and `capacity` is given: the capacity search, from that replay as its lower bound) the
    bracket, both scores and the servers the peak needs. The one assessment the real search and the
    simulation share (`scoring`: an encoder's or a generative model's; `check`: the load's SLA check,
    default the scoring's: a generative model's also asks whether its engine keeps up,
    `tuner.trial.generate.load_check`); `extra` goes to the record (warm-up, note)."""
    check = (check or scoring.check)(load, sla)
    bracket, latencies, pruned, at_cap = None, (), False, None
    if check.ok and capacity is not None:
        found = capacity(Step(load_speed, load, check))
        at_cap = found.at_capacity
        bracket = Bracket(rps=found.capacity_rps, speed=found.speed, upper_rps=found.upper_rps,
                          upper_speed=found.upper_speed, steps=len(found.steps), converged=found.converged,
                          limited_by=found.limited_by, lag_retries=sum(s.attempts - 1 for s in found.steps),
                          peak_rps=peak_at(found.speed) if peak_at is not None and found.speed > 0 else None,
                          at_capacity=scoring.figures(at_cap) if at_cap is not None else None)
        latencies = tuple(scoring.latencies(at_cap).tolist()) if at_cap is not None else ()
        pruned = found.pruned
    capacity_rps = bracket.rps if bracket else 0.0
    servers = servers_needed(load_speed, bracket.speed) if bracket else None  # peaks scale with the speed
    scores = {"capacity": scoring.capacity(at_cap, capacity_rps, price_per_hour),
              "utilization": scoring.utilization(load, price_per_hour) if check.ok else None}
    return TrialRecord(params=dict(params), at_load=scoring.figures(load), sla_met=check.ok, violation=check.violation,
                       sla_reason=check.reason, capacity=bracket, scores=scores, pruned=pruned,
                       servers_needed=servers, monthly_cost=monthly_cost(servers, price_per_hour),
                       price_per_hour=price_per_hour, peak_rps=peak_rps, latencies_ms=latencies, **extra)


# --- the record as Optuna attributes: written here, read here ----------------------------------------

_SCALARS = ("outcome", "sla_reason", "pruned", "price_per_hour", "peak_rps", "servers_needed", "monthly_cost",
            "note", "step_warmup_s")
_BRACKET = ("upper_rps", "upper_speed", "steps", "converged", "limited_by", "lag_retries", "peak_rps")


def to_attrs(record: TrialRecord) -> dict[str, object]:
    """The record as flat, JSON-able attributes: the trial's own figures at the recorded load
    unprefixed (`latency_p99_ms`), those at capacity prefixed `capacity_`, the scores `score_<name>`."""
    out: dict[str, object] = {"config": _jsonable(record.params), "feasible": record.meets_sla,
                              "sla_met": record.sla_met, "violation": _finite(record.violation)}
    out.update({name: getattr(record, name) for name in _SCALARS})
    out.update({f"score_{name}": _finite(value) for name, value in record.scores.items()})
    if record.warmup is not None:
        w = record.warmup
        out.update(warmup_seconds=w.seconds, warmup_sweep_requests=w.sweep_requests,
                   warmup_sweep_errors=w.sweep_errors, warmup_window_errors=w.window_errors,
                   warmup_first_error=w.first_error, warmup_stable=w.stable, warmup_failing=w.failing,
                   warmup_reason=w.reason,
                   warmup_seen=w.seen, warmup_windows_ms=",".join(f"{v:.3f}" for v in w.windows_ms))
    if record.at_load is not None:
        out.update(_flat_figures(record.at_load, ""))
    b = record.capacity
    out["capacity_rps"], out["capacity_speed"] = record.capacity_rps, record.capacity_speed
    if b is not None:
        out.update({f"capacity_{name}": getattr(b, name) for name in _BRACKET})
        if b.at_capacity is not None:
            out.update({k: v for k, v in _flat_figures(b.at_capacity, "capacity_").items()
                        if k != "capacity_speed"})
    return out


def from_attrs(attrs: dict) -> TrialRecord:
    """A record from what `to_attrs` wrote (missing figures come back as their defaults)."""
    at_load = _figures_from(attrs, "") if "requests" in attrs else None
    capacity = None
    if "capacity_steps" in attrs:
        at_capacity = _figures_from(attrs, "capacity_") if "capacity_requests" in attrs else None
        if at_capacity is not None:
            at_capacity = dataclasses.replace(at_capacity, speed=float(attrs.get("capacity_speed") or 0.0))
        capacity = Bracket(rps=float(attrs.get("capacity_rps") or 0.0), speed=float(attrs.get("capacity_speed") or 0.0),
                           at_capacity=at_capacity,
                           **{name: attrs.get(f"capacity_{name}") for name in _BRACKET
                              if f"capacity_{name}" in attrs})
    params = {k: tuple(v) if isinstance(v, list) else v for k, v in (attrs.get("config") or {}).items()}
    violation = attrs.get("violation")
    warmup = None
    if "warmup_seconds" in attrs:
        windows = str(attrs.get("warmup_windows_ms") or "")
        warmup = Warmup(seconds=float(attrs["warmup_seconds"]), sweep_requests=int(attrs.get("warmup_sweep_requests") or 0),
                        sweep_errors=int(attrs.get("warmup_sweep_errors") or 0),
                        window_errors=int(attrs.get("warmup_window_errors") or 0),
                        first_error=str(attrs.get("warmup_first_error") or ""),
                        windows_ms=tuple(float(v) for v in windows.split(",") if v),
                        stable=bool(attrs.get("warmup_stable", True)), failing=bool(attrs.get("warmup_failing", False)),
                        reason=str(attrs.get("warmup_reason") or ""),
                        seen=str(attrs.get("warmup_seen") or ""))
    return TrialRecord(
        params=params, at_load=at_load, capacity=capacity, warmup=warmup,
        sla_met=bool(attrs.get("sla_met", attrs.get("feasible", False))),
        violation=math.inf if violation is None else float(violation),
        scores={name[len("score_"):]: attrs.get(name) for name in attrs if name.startswith("score_")},
        **{name: attrs[name] for name in _SCALARS if name in attrs},
    )


_PERCENTILE_DICTS = ("latency_ms", "ttft_ms", "tpot_ms")  # flat as <stem>_<percentile>_ms


def _flat_figures(f: Figures, prefix: str) -> dict[str, object]:
    out: dict[str, object] = {}
    for spec in dataclasses.fields(Figures):
        value = getattr(f, spec.name)
        if spec.name in _PERCENTILE_DICTS:
            stem = spec.name[:-len("_ms")]
            out.update({f"{prefix}{stem}_{k}_ms": _finite(v) for k, v in value.items()})
        elif spec.name == "batch_histogram":
            out[f"{prefix}batch_histogram"] = json.dumps({str(k): n for k, n in sorted(value.items())})
        else:
            out[f"{prefix}{spec.name}"] = _finite(value) if isinstance(value, float) else value
    return out


def _figures_from(attrs: dict, prefix: str) -> Figures:
    values: dict = {}
    for spec in dataclasses.fields(Figures):
        key = f"{prefix}{spec.name}"
        if spec.name in _PERCENTILE_DICTS:
            start, end = f"{prefix}{spec.name[:-len('_ms')]}_", "_ms"
            values[spec.name] = {k[len(start):-len(end)]: v for k, v in attrs.items()
                                    if k.startswith(start) and k.endswith(end)
                                    and "_" not in k[len(start):-len(end)]}
        elif spec.name == "batch_histogram":
            raw = attrs.get(key)
            values[spec.name] = {int(k): int(n) for k, n in json.loads(raw).items()} if raw else {}
        elif key in attrs and attrs[key] is not None:
            values[spec.name] = attrs[key]
    return Figures(**values)


def record_of(trial: optuna.trial.FrozenTrial) -> TrialRecord | None:
    """The trial's record; None when it failed before anything was measured (refused, interrupted)."""
    attrs = trial.user_attrs
    return from_attrs(attrs) if "outcome" in attrs else None


def is_feasible(trial: optuna.trial.FrozenTrial) -> bool:
    """The one definition: a finished trial, measured, that met the SLA at the recorded load and has
    a score under the study's scoring (its objective value is above 0)."""
    return (trial.state == TrialState.COMPLETE and trial.value is not None and trial.value > 0
            and all(c <= 0 for c in trial.constraints.values()))


def _finite(value):
    # a figure as JSON and Optuna's attributes hold it: a float, None where it was not measured (NaN, inf)
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _jsonable(params: Params) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in params.items()}
