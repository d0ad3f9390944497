"""The night in a few lines of Markdown, fit for a pull request or a chat message (pure)."""

from __future__ import annotations

import math

import pandas as pd

from tuner import space
from tuner.measurement import percentile_key
from tuner.nightly import drift as drift_mod
from tuner.nightly.deployed import Proposal
from tuner.nightly.rule import UNIT_LABELS, UNIT_WORDS, ArmResult, Decision, pair_gains


def confirmation_table(pairs: list[tuple[ArmResult, ArmResult]], percentile: float = 99.0) -> str:
    """The confirmation pairs as a Markdown table: each arm's score per dollar (in its unit; production's
    at the top of its capacity bracket too, where the rule judges against it) and latency (a generative
    model's: TTFT and TPOT), the gain."""
    q = percentile_key(percentile)
    unit = pairs[0][0].unit if pairs else "requests"
    per = UNIT_LABELS.get(unit, "/$")
    # (heading, value) per latency column: an encoder's latency, a generative model's TTFT and TPOT
    shown = ([("TTFT", lambda r: r.ttft_ms), ("TPOT", lambda r: r.tpot_ms)] if unit == "tokens"
             else [("", lambda r: r.latency_ms)])
    heads = [f"{arm} {(name + ' ') if name else ''}{q} ms" for name, _ in shown for arm in ("production", "candidate")]
    # under capacity scoring the rule judges the candidate against the top of production's bracket: shown
    top = any(p.per_dollar_upper is not None for p, _ in pairs)
    top_head = f" production {per} (bracket top) |" if top else ""
    lines = [f"| pair | production {per} |{top_head} candidate {per} | gain | {' | '.join(heads)} | candidate SLA |",
             "|---:|---:|" + ("---:|" if top else "") + "---:|---:|" + "---:|" * len(heads) + "---|"]
    for k, ((p, c), g) in enumerate(zip(pairs, pair_gains(pairs), strict=True), 1):
        top_cell = f" {_rpd(p.per_dollar_upper)} |" if top else ""
        if g is None:
            note = next(r.note for r in (p, c) if not r.valid)
            lines.append(f"| {k} | - |{' - |' if top else ''} - | unmeasured | {' | '.join('-' for _ in heads)} | {note} |")
            continue
        cells = [_ms(get(r)) for _, get in shown for r in (p, c)]
        lines.append(f"| {k} | {_rpd(p.per_dollar)} |{top_cell} {_rpd(c.per_dollar)} | {_gain(g)} | "
                     f"{' | '.join(cells)} | {'met' if c.meets_sla else 'broken: ' + (c.note or '')} |")
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
    unit: str = "requests",
    percentile: float = 99.0,
    proposal: Proposal | None = None,
    soak: list[str] | tuple[str, ...] = (),
    search: str | None = None,
) -> str:
    """The night as Markdown: the decision, both configs, the confirmation, the drift, the proposed
    file's diff. Every score is named by its `unit` (requests, or a generative model's output tokens).
    `search`: a line on the search (its time limit stopped it), when there is one to say."""
    title = {"change": "change proposed", "keep": "keep production"}[decision.decision]
    out = [f"## tuner nightly: `{model}`, {stamp}: {title}", "",
           f"**Decision: {decision.decision}** (exit {decision.exit_code}): {decision.reason}.", "",
           f"- production: {_params(production)}",
           f"- candidate: {_params(candidate)}",
           f"- SLA: {sla}; scoring: {scoring} ({UNIT_WORDS.get(unit, unit)})"]
    if decision.gains:
        out.append(f"- gain over production: median {_gain(decision.median_gain)}, "
                   f"worst pair {_gain(decision.min_gain)}")
    if search:
        out.append(f"- {search}")
    moved = drift_mod.drifted(drift)
    out.append(f"- traffic drift: {', '.join(moved) if moved else 'none above the threshold'}")
    out.extend(f"- {line}" for line in soak)  # the last `tuner soak` of the study, when there is one
    if pairs:
        out += ["", "### Confirmation (production and candidate alternated on tonight's traffic)", "",
                confirmation_table(pairs, percentile)]
    out += ["", "### Traffic compared with the previous run", "", drift_mod.to_markdown(drift)]
    if proposal is not None:
        out += ["", f"### Proposed {proposal.name} change", "",
                f"proposed/{proposal.name}: " + ("; ".join(proposal.changed) or "no field changed"), "",
                "```diff", proposal.diff.rstrip("\n"), "```"]
    return "\n".join(out) + "\n"


def _params(params: dict | None) -> str:
    return space.describe(params, as_set=True, code=True) if params else "-"


def _rpd(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _ms(value: float | None) -> str:
    return "-" if value is None or value != value else f"{value:.1f}"


def _gain(g: float | None) -> str:
    if g is None:
        return "-"
    return "inf" if math.isinf(g) else f"{g:+.1%}"
