"""Pure: the SLA check of one measurement, requests per dollar both ways, servers and their cost; for a
generative model the token SLA (TTFT, TPOT) and tokens per dollar both ways.
(The capacity search that uses the SLA check is `tuner.trial.capacity`.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuner.cost import HOURS_PER_MONTH
from tuner.measurement import Measurement, percentile_key
from tuner.measurement_tokens import TokenMeasurement
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
    # where a failing step's own measurement says the configuration's capacity lies, as a replay speed
    # (a generative engine fallen behind: the speed whose average asks what it streamed); None: unknown
    holds_speed: float | None = None


def check_sla(m: Measurement, sla: SlaSettings) -> SlaCheck:
    """Whether `m` meets the SLA: its latency at the SLA's percentile, its error rate and the violation."""
    latency = m.latency(sla.percentile)
    over_latency = latency / sla.latency_ms - 1.0
    over_errors = _over_errors(m.error_rate, sla.max_error_rate)
    violation = max(over_latency, over_errors)
    if math.isnan(violation):
        violation = float("inf")
    reasons = []
    if over_latency > 0:
        reasons.append(f"{percentile_key(sla.percentile)} {latency:.1f} ms > {sla.latency_ms:g} ms")
    if over_errors > 0:
        reasons.append(f"error rate {m.error_rate:.2%} > {sla.max_error_rate:.2%}")
    return SlaCheck(violation <= 0, latency, m.error_rate, violation, "; ".join(reasons))


def sla_verdict(check: SlaCheck | TokenSlaCheck) -> str:
    """A step's SLA verdict as progress lines print it: "ok", or "over the SLA (why)"."""
    return "ok" if check.ok else f"over the SLA ({check.reason})"


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


# --- a generative model: the token SLA and tokens per dollar ---------------------------------------
# TTFT = the first streamed token's time minus the request's due time; TPOT = (last token - first
# token) / (output tokens - 1); end to end = the last token's time minus the due time. The SLA:
# percentile q of TTFT <= sla.ttft_ms and/or of TPOT <= sla.tpot_ms and/or of end to end <= sla.e2e_ms,
# errors <= sla.max_error_rate. A one-token request has no TPOT and meets its limit, in goodput and
# here alike: a window served with none of 2+ tokens meets the TPOT limit. Tokens per dollar = output
# tokens served per dollar of server time, at capacity (the fastest replay that meets the SLA) or at
# the recorded load (the engine's busy time); total tokens (prompt + output) beside it.


@dataclass(frozen=True, kw_only=True)
class TokenSlaCheck:
    """The token SLA check of one measurement: whether it holds, TTFT and TPOT at the SLA's
    percentile, the error rate and the violation (<= 0 when it holds: the Optuna constraint)."""

    ok: bool
    ttft_ms: float | None
    tpot_ms: float | None
    error_rate: float
    violation: float
    reason: str = ""
    e2e_ms: float | None = None


def check_token_sla(*, ttft_ms: float | None, tpot_ms: float | None, error_rate: float,
                    sla: SlaSettings, e2e_ms: float | None = None, no_tpot: bool = False) -> TokenSlaCheck:
    """Whether a generative measurement meets the SLA: `ttft_ms`, `tpot_ms` and `e2e_ms` are its TTFT,
    TPOT and end-to-end time at `sla.percentile` (None: none measured), each held to its limit when the
    SLA sets one (a limit with nothing measured is broken: no token came back). `no_tpot`: requests
    were served, none of 2+ tokens; a one-token request has no TPOT and meets that limit, as goodput
    counts it (`tuner.measurement_tokens`), so the TPOT limit holds and the reason says why."""
    if sla.ttft_ms is None and sla.tpot_ms is None and sla.e2e_ms is None:
        raise ValueError("a token SLA needs sla.ttft_ms, sla.tpot_ms or sla.e2e_ms (settings.check_generative)")
    overs, reasons = [], []
    for name, measured, limit in (("TTFT", ttft_ms, sla.ttft_ms), ("TPOT", tpot_ms, sla.tpot_ms),
                                  ("end to end", e2e_ms, sla.e2e_ms)):
        if limit is None:
            continue
        unmeasured = measured is None or math.isnan(measured)
        if name == "TPOT" and no_tpot and unmeasured:
            overs.append(-1.0)  # met outright, as a TPOT of 0 would be
            reasons.append(f"{percentile_key(sla.percentile)} TPOT none: no request of 2+ tokens")
            continue
        over = math.inf if unmeasured else measured / limit - 1.0
        overs.append(over)
        if over > 0:
            shown = "none measured" if unmeasured else f"{measured:.1f} ms"
            reasons.append(f"{percentile_key(sla.percentile)} {name} {shown} > {limit:g} ms")
    over_errors = _over_errors(error_rate, sla.max_error_rate)
    if over_errors > 0:
        reasons.append(f"error rate {error_rate:.2%} > {sla.max_error_rate:.2%}")
    violation = max(*overs, over_errors)
    if math.isnan(violation):
        violation = math.inf
    return TokenSlaCheck(ok=violation <= 0, ttft_ms=ttft_ms, tpot_ms=tpot_ms, e2e_ms=e2e_ms, error_rate=error_rate,
                         violation=violation, reason="; ".join(reasons))


def check_tokens(m: TokenMeasurement, sla: SlaSettings) -> SlaCheck:
    """`check_token_sla` of a generative measurement, as the capacity search and the trial's record read
    an SLA check (`latency_ms`: its TTFT at the SLA's percentile when the SLA limits TTFT, else its TPOT
    when it limits that, else its end-to-end time)."""
    served = m.requests > m.errors
    ttft = m.ttft(sla.percentile) if served else None
    tpot = m.tpot(sla.percentile) if served else None
    e2e = m.e2e(sla.percentile) if served else None
    # TPOT's percentiles are NaN only over no request: served ones, none of 2+ tokens
    no_tpot = served and tpot is not None and math.isnan(tpot)
    check = check_token_sla(ttft_ms=ttft, tpot_ms=tpot, e2e_ms=e2e, error_rate=m.error_rate, sla=sla,
                            no_tpot=no_tpot)
    shown = check.ttft_ms if sla.ttft_ms is not None else check.tpot_ms if sla.tpot_ms is not None else check.e2e_ms
    return SlaCheck(check.ok, math.nan if shown is None else shown, check.error_rate, check.violation, check.reason)


def _over_errors(error_rate: float, budget: float) -> float:
    # an error budget of 0 allows no errors at all: any error breaks it by 1 (100%)
    if budget > 0:
        return error_rate / budget - 1.0
    return 1.0 if error_rate > 0 else -1.0


@dataclass(frozen=True)
class TokenScore:
    """Tokens per dollar: output tokens (the score), and total tokens (prompt + output) beside it."""

    output: float | None
    total: float | None


def tokens_per_dollar_at_capacity(*, output_tokens_per_s: float, prompt_tokens_per_s: float,
                                  price_per_hour: float) -> TokenScore:
    """Tokens per dollar of a server dedicated to the model and kept busy at its capacity (the token
    rates of the fastest replay that meets the SLA)."""
    return TokenScore(capacity_score(output_tokens_per_s, price_per_hour),
                      capacity_score(output_tokens_per_s + prompt_tokens_per_s, price_per_hour))


def tokens_per_dollar_at_load(*, output_tokens: float, prompt_tokens: float, busy_s: float,
                              price_per_hour: float) -> TokenScore:
    """Tokens per dollar of the engine's busy time at the recorded load (the server shared or billed
    by use): the tokens served over the busy seconds' price. None when no busy time or no token."""
    if busy_s <= 0 or output_tokens <= 0:
        return TokenScore(None, None)
    dollars = busy_s * price_per_hour / 3600.0
    return TokenScore(output_tokens / dollars, (output_tokens + prompt_tokens) / dollars)
