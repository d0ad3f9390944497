"""The decision rule over the confirmation replays (pure).

Production (A) and the candidate (B) are replayed alternately on tonight's traffic, A/B/A/B...,
at least three pairs. A change is proposed only when

  1. the pairs it judges are valid (the load generator kept its send-lag budget in both replays; a pair
     that could not be measured is reported and left out, and fewer than the pairs asked for keeps), and
  2. the candidate met the SLA in every one of its replays, and
  3. the candidate's score beat production's by at least the margin (default 5%), by one of two rules
     (`confirm.rule`):
     - `all_replays` (default): the candidate's worst replay beats production's best replay by the
       margin: min(candidate) >= (1 + margin) * max(production). Every candidate replay then ranks
       above every production replay, which is the Mann-Whitney U test at its extreme (U = 0): with
       n pairs, noise alone does that with probability 1 / C(2n, n), 1 in 20 for 3 pairs (one-sided
       p = 0.05), and the margin on top makes it rarer still.
     - `every_pair`: in each pair, candidate / production - 1 >= margin (noise alone: 1 in 2^n,
       1 in 8 for 3 pairs, before the margin).

Under capacity scoring a replay's score is known only to its capacity search's bracket: the capacity
lies between the last speed that met the SLA (the score) and the first that broke it
(`ArmResult.per_dollar_upper`, a tolerance above). Two arms whose searches end on the same grid of speeds
then read a whole tolerance apart in every pair (+30 % at a tolerance of 0.3) whatever their true gap, so
the rule judges the candidate's score against the *top* of production's bracket: a change is confirmed
only where the brackets lie apart by the margin. The gains reported stay score against score.

The score is the study's, per dollar, in the night's unit (`ArmResult.unit`): requests for an encoder,
output tokens for a generative model served by vLLM; the rule reads only ratios of it, so it is the
same rule for both, and its reasons name the unit.

The rule is deliberately strict: a replay on a shared machine can be off by 10-20%, and a change that
is proposed on noise flaps the configuration night after night. The gains reported are per pair. Exit
codes a scheduler can act on (tuner.errors): 0 keep (EXIT_OK), 10 change proposed (EXIT_ACT), 3 SLA
unmeetable (EXIT_SLA_UNMET: neither production nor the candidate met the SLA in every replay).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from tuner.errors import EXIT_ACT, EXIT_OK, EXIT_SLA_UNMET
from tuner.formats import gain

# what a score counts per dollar, by the night's unit: short (tables) and in words (reasons)
UNIT_LABELS = {"requests": "req/$", "tokens": "tokens/$"}
UNIT_WORDS = {"requests": "requests per dollar", "tokens": "output tokens per dollar"}


@dataclass(frozen=True, kw_only=True)
class ArmResult:
    """One confirmation replay of one arm (production or the candidate)."""

    arm: str                                # "production" or "candidate"
    meets_sla: bool
    per_dollar: float | None               # the score under the study's scoring, in `unit`; None: nothing to score
    # capacity scoring: the score at the capacity search's first failing speed, the top of its bracket
    # (None: another scoring, or no speed failed); the rule judges the candidate against it
    per_dollar_upper: float | None = None
    unit: str = "requests"                 # what it counts: "requests", or "tokens" (output tokens)
    latency_ms: float = float("nan")       # at the SLA's percentile (a generative model's: end to end)
    ttft_ms: float | None = None           # a generative model's, at the SLA's percentile
    tpot_ms: float | None = None
    error_rate: float = 0.0
    valid: bool = True                     # False: the load generator, not the server, fell behind
    note: str = ""                         # why it broke the SLA or was invalid
    detail: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    """What the rule decided: change or keep, why, the exit code and the gain of each pair."""

    decision: str            # "change" or "keep"
    reason: str
    exit_code: int
    gains: tuple[float, ...] = ()   # per pair: candidate / production score - 1

    @property
    def min_gain(self) -> float | None:
        """The worst pair's gain (None without gains)."""
        return min(self.gains) if self.gains else None

    @property
    def median_gain(self) -> float | None:
        """The median of the pairs' gains (None without gains)."""
        if not self.gains:
            return None
        g = sorted(self.gains)
        mid = len(g) // 2
        return g[mid] if len(g) % 2 else (g[mid - 1] + g[mid]) / 2


def keep(reason: str, exit_code: int = EXIT_OK, gains: tuple[float, ...] = ()) -> Decision:
    """A decision to keep production, for `reason`."""
    return Decision("keep", reason, exit_code, gains)


def pair_gain(production: ArmResult, candidate: ArmResult) -> float:
    """Candidate / production score - 1 (-1: no candidate score; inf: no production score)."""
    c, p = candidate.per_dollar, production.per_dollar
    if c is None or not c > 0:
        return -1.0
    if p is None or not p > 0:
        return math.inf  # production served nothing it could be scored on
    return c / p - 1.0


def pair_gains(pairs: list[tuple[ArmResult, ArmResult]]) -> list[float | None]:
    """Each pair's gain, in the order they ran; None for a pair that could not be measured."""
    return [pair_gain(p, c) if p.valid and c.valid else None for p, c in pairs]


RULES = ("all_replays", "every_pair")


def decide(pairs: list[tuple[ArmResult, ArmResult]], margin: float = 0.05, min_pairs: int = 3,
           *,
           rule: str = "all_replays") -> Decision:
    """`pairs` holds (production, candidate) replays in the order they ran."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    units = {r.unit for pair in pairs for r in pair}
    if len(units) > 1:  # a ratio of requests to tokens means nothing
        raise ValueError(f"the arms are scored in different units: {sorted(units)}")
    words = UNIT_WORDS.get(units.pop(), "score") if units else "score"
    # a pair with a replay the load generator could not keep on time says nothing: decide on the rest
    unmeasured = [k for k, pair in enumerate(pairs, 1) if not all(r.valid for r in pair)]
    pairs = [pair for pair in pairs if all(r.valid for r in pair)]
    if len(pairs) < min_pairs:
        why = (f"; pair(s) {', '.join(map(str, unmeasured))} could not be measured (the load generator fell "
               f"behind)" if unmeasured else "")
        return keep(f"confirmation incomplete: {len(pairs)} of {min_pairs} pairs measured{why}")
    gains = tuple(pair_gain(p, c) for p, c in pairs)
    sure = tuple(pair_gain(_top(p), c) for p, c in pairs)  # against production's bracket top, where known
    against = " against the top of production's capacity bracket" if sure != gains else ""
    cand_fail = [(k, c) for k, (_, c) in enumerate(pairs, 1) if not c.meets_sla]
    prod_fail = [(k, p) for k, (p, _) in enumerate(pairs, 1) if not p.meets_sla]
    if cand_fail:
        k, c = cand_fail[0]
        broke = f"the candidate broke the SLA in pair {k}{': ' + c.note if c.note else ''}"
        if prod_fail:
            kp, p = prod_fail[0]
            return keep(f"SLA unmeetable: {broke}, and production broke it in pair {kp}"
                        f"{': ' + p.note if p.note else ''}", EXIT_SLA_UNMET, gains)
        return keep(broke, gains=gains)
    if rule == "every_pair":
        worst = min(range(len(sure)), key=lambda i: sure[i])
        if sure[worst] < margin:
            return keep(f"the candidate beat production by {gain(sure[worst])}{against} in pair {worst + 1}, "
                        f"below the {margin:.0%} margin (gains {_list(gains)})", gains=gains)
        how = f"in every pair{against} (the worst: {gain(sure[worst])})"
    else:
        best_production = max((_top(p) for p, _ in pairs), key=_rpd)
        worst_candidate = min((c for _, c in pairs), key=_rpd)
        spread = pair_gain(best_production, worst_candidate)
        if spread < margin:
            return keep(f"the candidate's worst replay beat production's best by {gain(spread)}{against}, "
                        f"below the {margin:.0%} margin (gains per pair {_list(gains)})", gains=gains)
        top = ", production's at the top of its capacity bracket" if sure != gains else ""
        how = f"in every replay (its worst replay over production's best{top}: {gain(spread)})"
    return Decision("change", f"the candidate met the SLA in all {len(pairs)} replays and beat "
                    f"production's {words} by at least {margin:.0%} {how}; "
                    f"gains per pair {_list(gains)}", EXIT_ACT, gains)


def _top(r: ArmResult) -> ArmResult:
    """The replay scored at the top of its capacity bracket, where it has one."""
    return dataclasses.replace(r, per_dollar=r.per_dollar_upper) if r.per_dollar_upper is not None else r


def _rpd(r: ArmResult) -> float:
    return r.per_dollar if r.per_dollar is not None else 0.0


def _list(gains: tuple[float, ...]) -> str:
    return ", ".join(gain(g) for g in gains)
