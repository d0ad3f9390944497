"""`tuner audit`: measure a deployed configuration the way `tuner tune` measures a trial, and say
whether it wastes money, without changing anything.

The model's configuration is read from the server as it runs (a remote server is attached read-only:
no model is loaded or unloaded, any control mode works, and it is sent the recorded traffic only: no
warm-up shape sweep: the recorded traffic
takes its place, see `audit`). The study's traffic is replayed at its
recorded load (the SLA there, Triton's fill rate, queue and compute time) and, unless
`at_load_only`, the capacity is searched like a trial's, which drives the server past its SLA:
audit a replica, or a quiet hour.

The verdicts (the audit ratios of the design):
- throughput ratio = the deployed config's capacity / the baseline's (the best configuration of a
  `tuner tune` study with the same SLA and traffic): > 0.75 healthy, 0.60-0.75 watch, < 0.60 inefficient;
- fill rate at the recorded load < 0.5: max_batch_size is larger than the traffic fills;
- recoverable budget = throughput gap x what the deployment costs: (1 - ratio) x servers x price.

A model vLLM serves (a generative deployment) is audited by `tuner.audit_engine` (`audit` hands it over):
measured in tokens, with the engine's own statistics in place of the batcher's.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from tuner import formats, space
from tuner.cost import price_for
from tuner.errors import EXIT_ACT, EXIT_OK, EXIT_SLA_UNMET, InputError, UnmeasuredError
from tuner.files import read_json_object
from tuner.measurement import Measurement, error_line, percentile_key
from tuner.score import check_sla, sla_verdict
from tuner.server import make_launcher
from tuner.settings import StudySettings
from tuner.soak import last_soak
from tuner.study import is_vllm_study, study_traffic
from tuner.trial import NO_VERDICT, UNMEASURED, Hints, TrialRecord, Warmup, to_attrs
from tuner.trial.run import make_measure
from tuner.trial.step import check_measured, step_windows
from tuner.trial.warmup import warm_up

HEALTHY = 0.75      # throughput ratio above which the deployment is healthy
INEFFICIENT = 0.60  # ... and below which it is inefficient
LOW_FILL = 0.5      # fill rate at the recorded load below which max_batch_size is too large


REQUESTS, TOKENS = "requests", "tokens"  # what an audit's capacity and scores count (TrialRecord.unit)


@dataclass(frozen=True)
class Baseline:
    """What the deployment is compared with: the best configuration of a finished `tuner tune`."""

    source: str
    params: dict
    capacity_rps: float
    unit: str = REQUESTS  # a generative study's: tokens, its capacity the output tokens/s below
    output_tokens_per_s: float | None = None  # at capacity (a generative baseline's, what the ratio divides)


@dataclass(frozen=True)
class Finding:
    """One check of an audit: what was checked, the value found, its verdict and why."""

    check: str
    value: str
    verdict: str  # ok | watch | inefficient | broken | info
    why: str = ""


@dataclass(frozen=True, kw_only=True)
class AuditResult:
    """What an audit found: the deployed config's figures, the baseline it is compared with, the findings."""

    model: str
    server: str
    params: dict  # the deployed values of the tuned fields
    result: TrialRecord
    price_per_hour: float
    baseline: Baseline | None = None
    ratio: float | None = None
    recoverable_per_month: float | None = None
    findings: list[Finding] = field(default_factory=list)
    # what the capacity was measured under: its --json is a baseline (load_baseline) only against these
    sla: dict = field(default_factory=dict)  # latency_ms, percentile (a generative study's: ttft_ms, tpot_ms)
    traffic_path: str | None = None
    unit: str = REQUESTS  # tokens: a generative deployment's, its capacity in output tokens/s
    engine: dict | None = None  # a generative deployment's engine arguments and statistics (tuner.audit_engine)
    settling: Warmup | None = None  # a remote deployment's unjudged first warm-up (audit: in place of the sweep)

    @property
    def exit_code(self) -> int:
        """The exit code of `tuner audit` (2: bad input, as for every command): unmeasured (1: the load
        generator could not replay the traffic on time, or the server never settled), SLA broken (3),
        inefficient (10) or healthy (0)."""
        if self.result.outcome in NO_VERDICT:
            return UnmeasuredError.exit_code
        return exit_code_of(self.findings, sla_met=self.result.meets_sla)

    def as_dict(self) -> dict:
        """The result as a plain, JSON-able dict (what `tuner audit --json` writes)."""
        return {
            "model": self.model, "server": self.server, "params": self.params,
            "outcome": self.result.outcome,
            "sla_met": self.result.meets_sla, "sla_reason": self.result.sla_reason or self.result.note,
            "capacity_rps": self.result.capacity_rps or None, "capacity_speed": self.result.capacity_speed or None,
            "price_per_hour": self.price_per_hour,
            "baseline": None if self.baseline is None else self.baseline.__dict__,
            "throughput_ratio": self.ratio, "recoverable_per_month": self.recoverable_per_month,
            # the trial's own record, but for a capacity not measured: null there too, as above
            "figures": {**(attrs := to_attrs(self.result)),
                        **{k: None for k in ("capacity_rps", "capacity_speed") if not attrs.get(k)}},
            "findings": [f.__dict__ for f in self.findings],
            "warmup": None if (w := self.result.warmup) is None else {
                "errors": w.errors, "sweep_errors": w.sweep_errors, "window_errors": w.window_errors,
                "first_error": w.first_error or None},
            "settling": None if (s := self.settling) is None else {
                "errors": s.errors, "stable": s.stable, "first_error": s.first_error or None},
            "exit_code": self.exit_code,
            "sla": self.sla, "traffic": {"path": self.traffic_path},
            "unit": self.unit,
            **({"capacity_output_tokens_per_s": self.capacity_output_tokens_per_s,
                "tokens_per_dollar": self.result.scores.get("capacity"), "engine": self.engine}
               if self.unit == TOKENS else {}),
        }

    @property
    def capacity_output_tokens_per_s(self) -> float | None:
        """A generative deployment's capacity: the output tokens/s of its fastest replay within the SLA."""
        b = self.result.capacity
        return b.at_capacity.output_tokens_per_s if b is not None and b.rps > 0 and b.at_capacity else None


def exit_code_of(findings: list[Finding], *, sla_met: bool = True) -> int:
    """The verdict's exit code, for every audit (by replay, from production's metrics): the SLA missed
    (3: `sla_met` false, or a `broken` finding), inefficient (10) or healthy (0)."""
    if not sla_met or any(f.verdict == "broken" for f in findings):
        return EXIT_SLA_UNMET
    if any(f.verdict == "inefficient" for f in findings):
        return EXIT_ACT
    return EXIT_OK


def ratio_verdict(ratio: float) -> tuple[str, str]:
    """The throughput ratio's verdict and what it means: ok above HEALTHY, inefficient under INEFFICIENT."""
    if ratio > HEALTHY:
        return "ok", f"> {HEALTHY:g}: healthy"
    if ratio >= INEFFICIENT:
        return "watch", f"between {INEFFICIENT:g} and {HEALTHY:g}"
    return "inefficient", f"< {INEFFICIENT:g}: the tuned configuration serves the traffic for less"


def load_baseline(path: str | Path, settings: StudySettings, *, unit: str = REQUESTS) -> Baseline:
    """The best configuration of a finished `tuner tune` (its output directory or summary.json), or the
    deployed one a replay audit measured (`tuner audit --json`: its capacity is the method's baseline
    under ideal conditions); refused when measured for another SLA or on other traffic (the capacities
    would not compare), or in another `unit` (requests against a generative study's output tokens)."""
    path = Path(path)
    summary_path = path if path.suffix == ".json" else path / "summary.json"
    summary = read_json_object(summary_path, label=f"--baseline: {summary_path}",
                               missing="not found (give the output directory of a `tuner tune`)")
    if not summary.get("sla"):
        raise InputError(f"--baseline: {summary_path}: not a tuner summary or `tuner audit --json` (no 'sla')")
    theirs_unit = summary.get("unit") or REQUESTS  # written before generative studies: requests
    if theirs_unit != unit:
        raise InputError(f"--baseline: {summary_path} is {_KIND.get(theirs_unit, theirs_unit)}, this audit is "
                         f"{_KIND.get(unit, unit)}: the capacities do not compare")
    if "outcome" in summary and "best" not in summary:  # a replay audit's --json
        best = {"params": summary.get("params"), "capacity_rps": summary.get("capacity_rps"),
                "at_capacity": {"output_tokens_per_s": summary.get("capacity_output_tokens_per_s")}}
        if not best["capacity_rps"]:
            raise InputError(f"--baseline: {summary_path}: that audit measured no capacity (--at-load-only, "
                             "or the SLA missed), so there is nothing to compare with")
    else:
        best = summary.get("best")
    if not best or not best.get("capacity_rps"):
        raise InputError(f"--baseline: {summary_path}: that study found no configuration with a capacity "
                         "under its SLA, so there is nothing to compare with")
    tokens = ((best.get("at_capacity") or {}).get("output_tokens_per_s") or None) if unit == TOKENS else None
    if unit == TOKENS and not tokens:
        raise InputError(f"--baseline: {summary_path}: its best configuration has no output tokens/s at "
                         "capacity, so there is nothing to compare with")
    _check_same_sla(summary_path, summary["sla"], settings, unit=unit)
    check_same_gpu(f"--baseline: {summary_path}", summary, settings)
    traffic = (summary.get("traffic") or {}).get("path")
    if traffic and Path(traffic).name != Path(settings.traffic.path).name:
        raise InputError(f"--baseline: {summary_path} was tuned on {Path(traffic).name}, this audit replays "
                         f"{Path(settings.traffic.path).name}: the capacities do not compare")
    return Baseline(str(summary_path), dict(best.get("params") or {}), float(best["capacity_rps"]), unit=unit,
                    output_tokens_per_s=float(tokens) if tokens else None)


_KIND = {REQUESTS: "an encoder study's (capacity in requests/s)",
         TOKENS: "a generative study's (capacity in output tokens/s)"}


def check_same_gpu(where: str, summary: dict, settings: StudySettings) -> None:
    """InputError in one line when the baseline was measured on another GPU type than this study's
    `cost.gpu`: its capacity is that GPU's (a price of the user's own, with no GPU named, tells none)."""
    theirs = (summary.get("price") or {}).get("gpu")
    ours = price_for(settings.cost, source=settings.source).gpu
    if theirs and ours and theirs != ours:
        raise InputError(f"{where} was measured on {theirs}, this study's cost.gpu is {ours}: the capacities "
                         f"do not compare (tune on this GPU, or audit with that study's cost)")


def _check_same_sla(summary_path: Path, sla: dict, settings: StudySettings, *, unit: str) -> None:
    """InputError in one line when the baseline was measured for another SLA: its limits (an encoder's
    latency, or a generative study's TTFT and TPOT) or its percentile."""
    if unit == TOKENS:
        from tuner.export import sla_limits

        ours = {"percentile": settings.sla.percentile, "ttft_ms": settings.sla.ttft_ms, "tpot_ms": settings.sla.tpot_ms}
        theirs = {k: sla.get(k, 99.0 if k == "percentile" else None) for k in ours}
        if {k: None if v is None else float(v) for k, v in ours.items()} != \
                {k: None if v is None else float(v) for k, v in theirs.items()}:
            raise InputError(f"--baseline: {summary_path} was tuned for {sla_limits(theirs)}, this audit's SLA is "
                             f"{sla_limits(ours)}: the capacities do not compare")
        return
    ours = (float(settings.sla.latency_ms), float(settings.sla.percentile))
    theirs = (float(sla.get("latency_ms", -1)), float(sla.get("percentile", 99)))
    if ours != theirs:
        raise InputError(f"--baseline: {summary_path} was tuned for {percentile_key(theirs[1])} <= {theirs[0]:g} ms, "
                         f"this audit's SLA is {percentile_key(ours[1])} <= {ours[0]:g} ms: the capacities do not compare")


def audit(settings: StudySettings, baseline: Baseline | None = None, at_load_only: bool = False,
          *,
          progress: bool = True) -> AuditResult:
    """Measure the configuration the study's server runs now and judge it (a model vLLM serves:
    `tuner.audit_engine.audit_engine`)."""
    from tuner import audit_engine  # it builds on this module

    if is_vllm_study(settings):
        return audit_engine.audit_engine(settings, baseline, at_load_only, progress=progress)
    traffic = study_traffic(settings)
    check_measured(step_windows(traffic, settings), settings.traffic.speed, source=str(settings.traffic.path))
    price = price_for(settings.cost, source=settings.source).price_per_hour
    server = settings.server.url if settings.server.launcher == "remote" else f"{settings.server.launcher} server"
    remote = settings.server.launcher == "remote"
    if remote:
        # a deployment serves people: it gets the recorded traffic only, not the shape sweep's made-up
        # batches (up to max_batch_size rows at the longest lengths, which it may fail and count as
        # failures); the steady-state windows still judge whether it is warm
        settings = dataclasses.replace(settings, measurement=dataclasses.replace(settings.measurement,
                                                                                 shape_sweep=False))
    with make_launcher(settings, read_only=True) as launcher:
        config = launcher.model_config(settings.model)
        audit_engine.check_not_vllm(settings, config)
        measured = make_measure(launcher, settings, traffic, capacity=not at_load_only,
                                         on_measure=_say_step(settings) if progress else None)
        params = space.from_config(config, settings.search)
        if progress:
            print(f"auditing {settings.model} on {server}: {space.describe(params)}", file=sys.stderr, flush=True)
        settling = None
        if remote and settings.measurement.warmup:
            # tune's trial meets a cold server with its shape sweep, which is never judged (only the windows
            # after it are: tuner.trial.warmup.model_failing); without the sweep, a fresh or restarted
            # deployment's cold start (slow executions, a queue, batches it runs out of memory on) would
            # land in the judged windows. So the recorded traffic warms it once, unjudged as the sweep is,
            # and the trial's own warm-up then judges it by tune's rule: the two agree on one config
            settling = warm_up(launcher, settings, traffic, max_batch_size=int(params[space.MAX_BATCH_SIZE]))
            if progress and settling.errors:
                print(f"  settling on the recorded traffic: {settling.failures()} (not judged, as tune's shape "
                      "sweep is not)", file=sys.stderr, flush=True)
        result = measured(params, Hints())
    ratio = recoverable = None
    if baseline is not None and result.capacity_rps > 0:
        ratio = result.capacity_rps / baseline.capacity_rps
        cost = result.monthly_cost
        recoverable = max(0.0, 1.0 - ratio) * cost if cost is not None else None
    out = AuditResult(model=settings.model, server=server, params=space.deployed(config), result=result, price_per_hour=price, baseline=baseline, ratio=ratio, recoverable_per_month=recoverable,
                      sla={"latency_ms": settings.sla.latency_ms, "percentile": settings.sla.percentile},
                      traffic_path=str(settings.traffic.path), settling=settling)
    return dataclasses.replace(out, findings=findings(out, settings, at_load_only))


def findings(a: AuditResult, settings: StudySettings, at_load_only: bool) -> list[Finding]:
    """The audit's findings: the SLA and fill rate at the recorded load, the capacity, the ratio, the soak."""
    r, load = a.result, a.result.at_load
    pct = percentile_key(settings.sla.percentile)
    if r.outcome in NO_VERDICT:
        return no_verdict(r) + warmup_findings(r, a.settling)
    # a model that failed its warm-up is judged by it (tune's rule): the row shows those failures too
    failed_warm = f", warm-up {r.warmup.errors} failed" if r.warmup is not None and r.warmup.failing else ""
    out = warmup_findings(r, a.settling) + [Finding(
        "SLA at the recorded load",
        f"{pct} {formats.number(load.latency_ms.get(pct))} ms (limit {settings.sla.latency_ms:g}), "
        f"errors {load.error_rate:.2%}{failed_warm}",
        "ok" if r.meets_sla else "broken",
        "" if r.meets_sla else f"{r.sla_reason}: the deployment misses its SLA at today's load")]
    mbs = a.params["max_batch_size"]
    if mbs > 0 and load.requests:
        low = load.fill_rate < LOW_FILL
        out.append(Finding(
            "fill rate at the recorded load", f"{load.fill_rate:.2f} (mean batch {load.mean_batch_size:.1f} of {mbs})",
            "watch" if low else "ok",
            f"max_batch_size is larger than the traffic fills (below {LOW_FILL:g})" if low else ""))
    queue, compute = formats.number(load.queue_ms), formats.number(load.compute_ms)
    out.append(Finding("Triton's time split",
                       f"queue {queue} ms per request, compute {compute} ms per execution", "info"))
    if at_load_only:
        out.append(Finding("capacity", "not measured (--at-load-only)", "info"))
    elif r.meets_sla:
        cost = formats.number(r.monthly_cost, ",.0f")
        out.append(Finding("capacity", f"{r.capacity_rps:.1f} req/s (speed {r.capacity_speed:.2f}); "
                           f"{r.servers_needed} server(s) for the peak, ${cost}/month", "info"))
    baseline_rps = a.baseline.capacity_rps if a.baseline is not None else 0.0
    return out + ratio_findings(a, r.capacity_rps, baseline_rps, unit="req/s") + soak_findings(settings.output)


def no_verdict(r: TrialRecord) -> list[Finding]:
    """The one finding of an audit whose replay at the recorded load gave no verdict (unmeasured, unstable)."""
    if r.outcome == UNMEASURED:
        return [Finding("SLA at the recorded load", "unmeasured", "broken",
                        f"{r.note}; raise replay.lag_budget_ms, set replay.workers, or lower traffic.speed "
                        f"and audit again (no verdict on the deployment)")]
    return [Finding("SLA at the recorded load", r.outcome, "broken",
                    f"{r.note} (no verdict on the deployment: audit it again, or raise "
                    f"measurement.warmup_max_s)")]


def warmup_findings(r: TrialRecord, settling: Warmup | None = None) -> list[Finding]:
    """The warm-ups' failed requests, when they had any: the settling one (a remote deployment's, in place
    of tune's shape sweep) is never judged, the trial's is as tune judges it (tuner.trial.warmup.model_failing:
    a model failing more of its requests than it served); failures either way are worth watching."""
    out = []
    if settling is not None and settling.errors:
        out.append(Finding("warm-up (settling)", f"{settling.failures()} before the deployment settled", "watch",
                           f"not judged, as tune's shape sweep is not (a cold or restarted deployment fails "
                           f"them, then serves the load); the first: {_first_error(settling)}"))
    w = r.warmup
    if w is not None and w.failing:
        out.append(Finding("warm-up", w.failures(), "broken", w.reason))
    elif w is not None and w.errors:
        out.append(Finding("warm-up", w.failures(), "watch",
                           f"not judged (the measured window is); the first: {_first_error(w)}"))
    return out


def _first_error(w: Warmup) -> str:
    # a replay the warm-up stopped keeps no request's error: Triton's counts are all there is
    return (error_line(w.first_error) if w.first_error.strip() else
            "not kept (Triton counted them; its log has their error)")


def ratio_findings(a: AuditResult, mine: float, theirs: float, *, unit: str) -> list[Finding]:
    """The throughput ratio against the baseline and the recoverable budget (or: no baseline)."""
    if a.baseline is not None and a.ratio is not None:
        out = [Finding("throughput ratio", f"{a.ratio:.2f} ({mine:.1f} vs {theirs:.1f} {unit} of "
                       f"{space.describe(a.baseline.params)})", *ratio_verdict(a.ratio))]
        recoverable = formats.number(a.recoverable_per_month, ",.0f")
        return out + [Finding("recoverable budget", f"${recoverable}/month", "info",
                              "throughput gap x the deployment's monthly cost")]
    if a.baseline is None:
        return [Finding("throughput ratio", "no baseline", "info",
                        "run `tuner tune` on the same study and pass its output with --baseline")]
    return []


def soak_findings(output: str | Path) -> list[Finding]:
    """The last `tuner soak` of the study's output, when there is one: its verdict and advice."""
    lines = last_soak(output)
    if not lines:
        return []
    verdict = "watch" if ": drift" in lines[0] else "info"
    why = "over a long run the configuration drifts: see the soak's restart advice" if verdict == "watch" else ""
    return [Finding("last soak", lines[0], verdict, why)] + [Finding("", line, "info") for line in lines[1:]]


def format_audit(a: AuditResult) -> str:
    """The findings as a left-aligned table (text reads left to right)."""
    frame = pd.DataFrame([f.__dict__ for f in a.findings]).astype(str)
    widths = {c: max(len(c), *(len(v) for v in frame[c])) for c in frame.columns}
    formatters = {c: (lambda v, w=widths[c]: f"{v:<{w}}") for c in frame.columns}
    return frame.to_string(index=False, justify="left", formatters=formatters)


def _say_step(settings: StudySettings):
    pct = settings.sla.percentile

    def say(m: Measurement) -> None:
        said = sla_verdict(check_sla(m, settings.sla))
        # a model without batching (max_batch_size 0) has no batch to fill
        fill = f", fill rate {m.fill_rate:.2f}" if m.max_batch_size > 0 else ""
        print(f"  replay at speed {m.speed:.2f}: {m.throughput_rps:.1f} req/s, {percentile_key(pct)} "
              f"{m.latency(pct):.1f} ms{fill}: {said}", file=sys.stderr, flush=True)

    return say


