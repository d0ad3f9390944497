"""The night in a few lines of Markdown, fit for a pull request or a chat message (pure)."""

from __future__ import annotations

import math

import pandas as pd

from tuner import space
from tuner.nightly import drift as drift_mod
from tuner.nightly.rule import ArmResult, Decision, pair_gains


def confirmation_table(pairs: list[tuple[ArmResult, ArmResult]], percentile: float = 99.0) -> str:
    """The confirmation pairs as a Markdown table: each arm's requests per dollar and latency, the gain."""
    q = f"p{percentile:g}"
    lines = [f"| pair | production req/$ | candidate req/$ | gain | production {q} ms | "
             f"candidate {q} ms | candidate SLA |",
             "|---:|---:|---:|---:|---:|---:|---|"]
    for k, ((p, c), g) in enumerate(zip(pairs, pair_gains(pairs), strict=True), 1):
        if g is None:
            note = next(r.note for r in (p, c) if not r.valid)
            lines.append(f"| {k} | - | - | unmeasured | - | - | {note} |")
            continue
        lines.append(f"| {k} | {_rpd(p.requests_per_dollar)} | {_rpd(c.requests_per_dollar)} | "
                     f"{_gain(g)} | {p.latency_ms:.1f} | {c.latency_ms:.1f} | "
                     f"{'met' if c.meets_sla else 'broken: ' + (c.note or '')} |")
    return "\n".join(lines)


def markdown_summary(
    *,
    stamp: str,
    model: str,
    decision: Decision,
    production: dict,
    candidate: dict | None,
    pairs: list[tuple[ArmResult, ArmResult]],
    drift: pd.DataFrame,
    sla: str,
    scoring: str,
    diff: str = "",
    soak: list[str] | tuple[str, ...] = (),
) -> str:
    """The night as Markdown: the decision, both configs, the confirmation, the drift, the diff."""
    title = {"change": "change proposed", "keep": "keep production"}[decision.decision]
    out = [f"## tuner nightly: `{model}`, {stamp}: {title}", "",
           f"**Decision: {decision.decision}** (exit {decision.exit_code}): {decision.reason}.", "",
           f"- production: {_params(production)}",
           f"- candidate: {_params(candidate)}",
           f"- SLA: {sla}; scoring: {scoring} (requests per dollar)"]
    if decision.gains:
        out.append(f"- gain over production: median {_gain(decision.median_gain)}, "
                   f"worst pair {_gain(decision.min_gain)}")
    moved = drift_mod.drifted(drift)
    out.append(f"- traffic drift: {', '.join(moved) if moved else 'none above the threshold'}")
    out.extend(f"- {line}" for line in soak)  # the last `tuner soak` of the study, when there is one
    if pairs:
        out += ["", "### Confirmation (production and candidate alternated on tonight's traffic)", "",
                confirmation_table(pairs)]
    out += ["", "### Traffic compared with the previous run", "", drift_mod.to_markdown(drift)]
    if diff:
        out += ["", "### Proposed config.pbtxt change", "", "```diff", diff.rstrip("\n"), "```"]
    return "\n".join(out) + "\n"


def _params(params: dict | None) -> str:
    return space.describe(params, as_set=True, code=True) if params else "-"


def _rpd(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _gain(g: float | None) -> str:
    if g is None:
        return "-"
    return "inf" if math.isinf(g) else f"{g:+.1%}"
