"""What the production audit found, and its verdicts: the same findings table and exit codes as the
replay audit (tuner.audit), from the figures Prometheus holds of the window."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from tuner import formats, space
from tuner.audit import INEFFICIENT, LOW_FILL, Baseline, Finding, exit_code_of, ratio_verdict
from tuner.errors import UnmeasuredError
from tuner.production._figures import ProductionFigures, hours_under
from tuner.production._window import format_duration

__all__ = ["ProductionAudit", "findings"]

LISTED = 6  # hours named in a finding; --json lists them all


@dataclass(frozen=True, kw_only=True)
class ProductionAudit:
    """The production audit of a model over a window of Prometheus's history."""

    model: str
    prometheus: str
    start: pd.Timestamp
    end: pd.Timestamp
    step_s: float
    max_batch_size: int
    price_per_hour: float
    max_error_rate: float
    figures: ProductionFigures  # the whole window, every instance
    steps: pd.DataFrame  # the figures of each step (index: the step's start), ratio included
    instances: pd.DataFrame  # the figures of each instance over the window
    gaps: list[pd.Timestamp]  # the steps' starts without samples
    restarts: dict[str, int]  # instance -> counter resets in the window
    baseline: Baseline | None = None
    ratio: float | None = None
    recoverable_per_month: float | None = None
    findings: list[Finding] = field(default_factory=list)

    @property
    def fill_under(self) -> list[pd.Timestamp]:
        """The steps whose fill rate is under LOW_FILL."""
        return hours_under(self.steps["fill_rate"], LOW_FILL)

    @property
    def ratio_under(self) -> list[pd.Timestamp]:
        """The steps whose throughput ratio is under INEFFICIENT (none without a baseline)."""
        return hours_under(self.steps["ratio"], INEFFICIENT)

    @property
    def exit_code(self) -> int:
        """The replay audit's exit codes: no samples, SLA broken (the error rate), inefficient, healthy."""
        if self.figures.seconds == 0:
            return UnmeasuredError.exit_code
        return exit_code_of(self.findings)

    def as_dict(self) -> dict:
        """The audit as a plain, JSON-able dict (what `tuner audit --prometheus --json` writes)."""
        steps = self.steps.reset_index()
        steps["start"] = steps["start"].map(_iso)
        return {
            "model": self.model,
            "prometheus": self.prometheus,
            "window": {"start": _iso(self.start), "end": _iso(self.end), "step_s": self.step_s},
            "max_batch_size": self.max_batch_size,
            "price_per_hour": self.price_per_hour,
            "figures": self.figures.as_dict(),
            "baseline": None if self.baseline is None else self.baseline.__dict__,
            "throughput_ratio": self.ratio,
            "recoverable_per_month": self.recoverable_per_month,
            "fill_under": [_iso(t) for t in self.fill_under],
            "ratio_under": [_iso(t) for t in self.ratio_under],
            "gaps": [_iso(t) for t in self.gaps],
            "restarts": self.restarts,
            "instances": {str(k): v for k, v in self.instances.to_dict(orient="index").items()},
            "steps": steps.to_dict(orient="records"),
            "findings": [f.__dict__ for f in self.findings],
            "exit_code": self.exit_code,
        }


def findings(a: ProductionAudit) -> list[Finding]:
    """The findings of a production audit, in the replay audit's table."""
    f, step = a.figures, format_duration(a.step_s)
    window = f"{_iso(a.start)} to {_iso(a.end)} ({format_duration((a.end - a.start).total_seconds())})"
    if f.seconds == 0:
        return [
            Finding(
                "production window",
                window,
                "broken",
                f"no {step} of the window has two samples of the model's counters: nothing to measure",
            )
        ]
    out = [Finding("production window", window, "info", f"{_steps(len(a.steps))} of {step} with samples")]
    if a.gaps:
        out.append(
            Finding(
                "scrape gaps",
                f"{_steps(len(a.gaps))} of {step} without samples: {_times(a.gaps)}",
                "info",
                "not counted: the figures are over the steps with samples",
            )
        )
    if any(a.restarts.values()):
        out.append(
            Finding(
                "server restarts",
                ", ".join(f"{k} {v}" for k, v in sorted(a.restarts.items()) if v),
                "info",
                "counter resets, handled: the figures count across them",
            )
        )
    out.append(
        Finding(
            "production throughput",
            f"{f.throughput_rps:.1f} req/s ({f.replicas:.3g} replica(s), {f.per_replica_rps:.1f} req/s each)",
            "info",
            "" if f.requests else "no requests in the window",
        )
    )
    if a.max_batch_size > 0 and f.fill_rate is not None:
        low = f.fill_rate < LOW_FILL
        out.append(
            Finding(
                "fill rate over the window",
                f"{f.fill_rate:.2f} (mean batch {f.mean_batch:.1f} of {a.max_batch_size})",
                "watch" if low else "ok",
                f"max_batch_size is larger than the traffic fills (below {LOW_FILL:g})" if low else "",
            )
        )
        out.append(_hours(f"steps of {step} with fill rate < {LOW_FILL:g}", a.fill_under, len(a.steps)))
    out.append(
        Finding(
            "Triton's time split",
            f"queue {formats.number(f.queue_ms)} ms, compute {formats.number(f.compute_ms)} ms per request",
            "info",
        )
    )
    if f.error_rate is not None:
        broken = f.error_rate > a.max_error_rate
        out.append(
            Finding(
                "error rate",
                f"{f.error_rate:.3%} (limit {a.max_error_rate:.3%})",
                "broken" if broken else "ok",
                "more requests fail than the SLA allows" if broken else "",
            )
        )
    if a.baseline is not None and a.ratio is not None:
        b = a.baseline
        verdict, meaning = ratio_verdict(a.ratio)
        if verdict == "inefficient":
            meaning = f"< {INEFFICIENT:g}: the replicas serve far less than one tuned server can"
        out.append(
            Finding(
                "throughput ratio",
                f"{a.ratio:.2f} ({f.per_replica_rps:.1f} req/s per replica vs the "
                f"{b.capacity_rps:.1f} req/s capacity of {space.describe(b.params)})",
                verdict,
                meaning,
            )
        )
        out.append(_hours(f"steps of {step} with ratio < {INEFFICIENT:g}", a.ratio_under, len(a.steps)))
        out.append(
            Finding(
                "recoverable budget",
                f"${formats.number(a.recoverable_per_month, ',.0f')}/month",
                "info",
                "throughput gap x the replicas' monthly cost",
            )
        )
    else:
        out.append(
            Finding(
                "throughput ratio",
                "no baseline",
                "info",
                "run `tuner tune` on the same study and pass its output with --baseline",
            )
        )
    for k, (instance, row) in enumerate(a.instances.iterrows()):
        fill = "" if pd.isna(row["fill_rate"]) else f", fill rate {row['fill_rate']:.2f}"
        out.append(
            Finding(
                "per instance" if k == 0 else "",
                f"{instance}: {row['throughput_rps']:.1f} req/s{fill}, "
                f"errors {0 if pd.isna(row['error_rate']) else row['error_rate']:.3%}, "
                f"{_steps(int(row['steps']))} with samples",
                "info",
            )
        )
    return out


def _steps(n: int) -> str:
    return f"{n} step" + ("" if n == 1 else "s")


def _hours(check: str, hours: list[pd.Timestamp], n: int) -> Finding:
    return Finding(
        check, f"{len(hours)} of {n}" + (f": {_times(hours)}" if hours else ""), "watch" if hours else "ok"
    )


def _times(times: list[pd.Timestamp]) -> str:
    shown = ", ".join(t.strftime("%Y-%m-%d %H:%M") for t in times[:LISTED])
    return shown + (f" and {len(times) - LISTED} more" if len(times) > LISTED else "")


def _iso(t: pd.Timestamp) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")
