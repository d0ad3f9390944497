"""What the production audit of a generative model found: vLLM's figures over the window judged against
the study's token SLA, in the findings table and with the exit codes of every audit (tuner.audit)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from tuner import formats, space
from tuner.audit import Finding, exit_code_of, ratio_verdict
from tuner.errors import UnmeasuredError
from tuner.measurement import percentile_key
from tuner.production._engine_figures import EngineTotals
from tuner.production._result import _iso, _steps, _times
from tuner.production._window import format_duration
from tuner.settings import SlaSettings

__all__ = ["KV_FULL", "EngineAudit", "EngineBaseline", "engine_findings"]

KV_FULL = 0.95  # KV-cache use at which the next burst preempts running requests


@dataclass(frozen=True)
class EngineBaseline:
    """The best configuration of a generative `tuner tune`: its output tokens/s at capacity (one server)."""

    source: str
    params: dict
    capacity_tokens_per_s: float


@dataclass(frozen=True, kw_only=True)
class EngineAudit:
    """The production audit of a vLLM-served model over a window of Prometheus's history."""

    model: str
    prometheus: str
    start: pd.Timestamp
    end: pd.Timestamp
    step_s: float
    price_per_hour: float
    sla: SlaSettings
    tpot_metric: str | None  # the histogram TPOT was read from
    figures: EngineTotals  # the whole window, every replica
    steps: pd.DataFrame  # each step's figures (index: its start), `over_sla` ('' when it held) included
    instances: pd.DataFrame  # each instance's tokens, preemptions and steps with samples
    gaps: list[pd.Timestamp]  # the steps' starts without samples
    restarts: dict[str, int]  # instance -> engine counter resets in the window
    baseline: EngineBaseline | None = None
    ratio: float | None = None  # the peak step's output tokens/s per replica / the baseline's capacity
    recoverable_per_month: float | None = None
    findings: list[Finding] = field(default_factory=list)

    @property
    def over_sla(self) -> list[pd.Timestamp]:
        """The steps whose TTFT, TPOT or error rate broke the SLA."""
        reasons = self.steps["over_sla"]
        return list(reasons.index[reasons.fillna("").astype(bool)])

    @property
    def preempted(self) -> list[pd.Timestamp]:
        """The steps in which vLLM preempted requests."""
        return list(self.steps.index[self.steps["preemptions"].fillna(0) > 0])

    @property
    def exit_code(self) -> int:
        """As every audit: no samples (1), the SLA broken (3), inefficient (10), healthy (0)."""
        if self.figures.seconds == 0:
            return UnmeasuredError.exit_code
        return exit_code_of(self.findings)

    def as_dict(self) -> dict:
        """The audit as a plain, JSON-able dict (what `tuner audit --prometheus --json` writes)."""
        steps = self.steps.reset_index()
        steps["start"] = steps["start"].map(_iso)
        return {
            "model": self.model,
            "kind": "generative",
            "unit": "tokens",
            "prometheus": self.prometheus,
            "window": {"start": _iso(self.start), "end": _iso(self.end), "step_s": self.step_s},
            "price_per_hour": self.price_per_hour,
            "sla": self.sla.__dict__,
            "tpot_metric": self.tpot_metric,
            "figures": self.figures.as_dict(),
            "baseline": None if self.baseline is None else self.baseline.__dict__,
            "throughput_ratio": self.ratio,
            "recoverable_per_month": self.recoverable_per_month,
            "over_sla": [_iso(t) for t in self.over_sla],
            "preempted": [_iso(t) for t in self.preempted],
            "gaps": [_iso(t) for t in self.gaps],
            "restarts": self.restarts,
            "instances": {str(k): v for k, v in self.instances.to_dict(orient="index").items()},
            "steps": steps.astype(object).where(steps.notna(), None).to_dict(orient="records"),
            "findings": [f.__dict__ for f in self.findings],
            "exit_code": self.exit_code,
        }


def _ms(value: float | None) -> str:
    return "none measured" if value is None else f"{value:.1f} ms"


def engine_findings(a: EngineAudit) -> list[Finding]:
    """The findings of a generative model's production audit."""
    f, step, sla = a.figures, format_duration(a.step_s), a.sla
    window = f"{_iso(a.start)} to {_iso(a.end)} ({format_duration((a.end - a.start).total_seconds())})"
    if f.seconds == 0:
        return [Finding("production window", window, "broken",
                        f"no {step} of the window has two samples of the engine's counters: nothing to measure")]
    n = int(a.steps["replicas"].notna().sum())
    out = [Finding("production window", window, "info", f"{n} steps of {step} with samples")]
    if a.gaps:
        out.append(Finding("scrape gaps", f"{len(a.gaps)} step(s) of {step} without samples: {_times(a.gaps)}",
                           "info", "not counted: the figures are over the steps with samples"))
    if any(a.restarts.values()):
        out.append(Finding("engine restarts", ", ".join(f"{k} {v}" for k, v in sorted(a.restarts.items()) if v),
                           "info", "counter resets, handled: the figures count across them"))
    peak = "" if f.peak_step is None else (
        f"; peak {f.peak_output_tokens_per_s:,.0f} per replica ({f.peak_step.strftime('%Y-%m-%d %H:%M')})")
    out.append(Finding(
        "production output tokens",
        f"{f.output_tokens_per_s:,.1f} tokens/s ({f.replicas:.3g} replica(s), "
        f"{f.per_replica_output_tokens_per_s:,.1f} each{peak})",
        "info", "" if f.generation_tokens else "no output token in the window"))
    hours = f.replicas * f.seconds / 3600
    out.append(Finding(
        "output tokens per dollar",
        f"{formats.number(f.tokens_per_dollar, ',.0f')} ({f.generation_tokens:,.0f} tokens / "
        f"{hours:,.4g} server-hours x ${a.price_per_hour:g})",
        "info", f"prompt tokens beside them: {f.prompt_tokens:,.0f}; requests finished: {f.requests:,.0f}"))
    pct = percentile_key(sla.percentile)
    for name, value, limit in (("TTFT", f.ttft_ms, sla.ttft_ms), ("TPOT", f.tpot_ms, sla.tpot_ms),
                               ("end to end", f.e2e_ms, sla.e2e_ms)):
        if limit is None:
            out.append(Finding(f"{pct} {name} over the window", _ms(value), "info", "the SLA sets no limit"))
        elif f.requests > 0:
            broken = value is None or value > limit
            out.append(Finding(f"{pct} {name} over the window", f"{_ms(value)} (limit {limit:g} ms)",
                               "broken" if broken else "ok",
                               f"the engine's own {name}: production misses its SLA" if broken else ""))
    over = a.over_sla
    judged = int(a.steps["over_sla"].notna().sum())
    first = "" if not over else f"first: {a.steps['over_sla'][over[0]]}"
    out.append(Finding(f"steps of {step} over the SLA", f"{len(over)} of {judged}" + (f": {_times(over)}" if over else ""),
                       "broken" if over else "ok", first))
    if f.error_rate is None:
        out.append(Finding("error rate", "not measured", "info",
                           "Triton's request counters of the model (nv_inference_request_*) are not in Prometheus"))
    else:
        broken = f.error_rate > sla.max_error_rate
        out.append(Finding("error rate", f"{f.error_rate:.3%} (limit {sla.max_error_rate:.3%})",
                           "broken" if broken else "ok",
                           "more requests fail than the SLA allows" if broken else ""))
    out.append(Finding(
        "preemptions", f"{f.preemptions:,.0f} in {len(a.preempted)} step(s) of {step}"
        + (f": {_times(a.preempted)}" if a.preempted else ""),
        "watch" if f.preemptions > 0 else "ok",
        "the KV cache is too small for the load: vLLM evicted running requests to recompute them"
        if f.preemptions > 0 else ""))
    if f.kv_cache_peak is not None:
        full = f.kv_cache_peak >= KV_FULL
        mean = "" if f.kv_cache_mean is None else f", mean {f.kv_cache_mean:.0%}"
        out.append(Finding("KV-cache use", f"peak {f.kv_cache_peak:.0%}{mean}", "watch" if full else "info",
                           f"at or above {KV_FULL:.0%}: the next burst preempts" if full else ""))
    if f.running_max is not None or f.waiting_max is not None:
        waiting = f.waiting_max or 0
        out.append(Finding(
            "requests in an engine",
            f"running at most {formats.number(f.running_max, ',.0f')}, waiting at most {waiting:,.0f}"
            + ("" if f.waiting_mean is None else f" (mean {f.waiting_mean:.2f})"),
            "info", "requests waited for a place in the batch (max_num_seqs, the KV cache)" if waiting else ""))
    out.extend(_baseline(a))
    for k, (instance, row) in enumerate(a.instances.iterrows()):
        out.append(Finding(
            "per instance" if k == 0 else "",
            f"{instance}: {row['output_tokens_per_s']:,.1f} output tokens/s, {row['preemptions']:,.0f} "
            f"preemption(s), {_steps(int(row['steps']))} with samples", "info"))
    return out


def _baseline(a: EngineAudit) -> list[Finding]:
    f = a.figures
    if a.baseline is None or a.ratio is None:
        return [Finding("throughput ratio", "no baseline", "info",
                        "run `tuner tune` on the same study and pass its output with --baseline")]
    b = a.baseline
    value = (f"{a.ratio:.2f} (the peak step's {f.peak_output_tokens_per_s:,.1f} output tokens/s per replica vs "
             f"the {b.capacity_tokens_per_s:,.1f} capacity of {space.describe(b.params)})")
    if a.ratio > 1:
        verdict, why = "watch", "> 1: at its peak a replica serves more than one tuned server can under the SLA"
    else:
        verdict, why = ratio_verdict(a.ratio)
        if verdict == "inefficient":
            why = "even at the peak the replicas serve far less than one tuned server can"
    return [Finding("throughput ratio", value, verdict, why),
            Finding("recoverable budget", f"${formats.number(a.recoverable_per_month, ',.0f')}/month", "info",
                    "the peak's gap to capacity x the replicas' monthly cost")]
