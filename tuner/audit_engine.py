"""The replay audit of a generative deployment: a model vLLM serves (`engineargs.is_vllm_model`), measured
as `tuner tune` measures such a model's trial (`tuner.trial.run.make_measure`, generative: each replay
streamed, the token SLA of `score.check_tokens`, output tokens per dollar), judged by the rules of
`tuner.audit` (its thresholds, findings table and exit codes).

The deployed engine arguments are the study's model.json with vLLM's values for what it leaves out (as
tune's incumbent: `engineargs.resolved`), as the engine uses them (`engineargs.in_effect`: no GPU memory
share where the KV cache is set in bytes; a local server's CPU build on the CPU's defaults whatever
`cost.gpu` prices): the local launcher serves that file. A remote Triton does not
expose model.json (its model config, NVIDIA's vLLM backend's included, does not hold the engine
arguments), so the audit reads the study repository's and says so in its findings: an assumption, that
the server runs that file.

The batcher's findings (fill rate, Triton's queue) do not apply: vLLM batches inside its engine. In their
place, the engine's own statistics over the replay at the recorded load (`tuner.llm.engine_watch`:
Triton's /metrics sampled while it runs): preemptions (> 0: `watch`, the KV cache is too small for the
traffic), the KV cache's peak use, the running and waiting sequences (`watch` when every sequence slot
was taken and requests waited). The capacity is in output tokens/s (its replay at the capacity speed),
and the throughput ratio divides it by the baseline's, a `tuner tune` of the generative study.

    check_not_vllm(settings, config)   refuse the batcher's audit of a server whose model vLLM serves
    deployed_engine(settings)          the engine arguments the deployment runs, and where they were read
    audit_engine(settings, baseline, at_load_only, *, progress) -> AuditResult
    engine_findings(audit, settings, at_load_only)
    textfile_families(audit, labels)   its figures as Prometheus gauges, in tokens
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import pandas as pd

from tuner import formats, modelconfig, space
from tuner.audit import (
    TOKENS,
    AuditResult,
    Baseline,
    Finding,
    no_verdict,
    ratio_findings,
    soak_findings,
)
from tuner.cost import price_for
from tuner.errors import SettingsError
from tuner.llm import engineargs
from tuner.llm.engine_watch import INTERVAL_S, EngineWatch
from tuner.measurement import percentile_key
from tuner.measurement_tokens import TokenMeasurement
from tuner.modelconfig import ModelConfig
from tuner.score import check_tokens, sla_verdict
from tuner.server import make_launcher
from tuner.settings import StudySettings, check_generative
from tuner.study import base_config, base_engine, study_traffic
from tuner.traffic import mean_output_tps
from tuner.trial import NO_VERDICT, Hints
from tuner.trial.generate import keeping_up, load_check
from tuner.trial.run import make_measure

__all__ = ["audit_engine", "check_not_vllm", "deployed_engine", "engine_findings", "textfile_families"]


def check_not_vllm(settings: StudySettings, config: ModelConfig) -> None:
    """SettingsError in one line when the server's model is a generative one (backend vllm, or it takes
    text_input) while the study's repository does not hold it as one: its engine arguments are read there."""
    if config.backend == "vllm" or any(i.name == "text_input" for i in config.input):
        raise SettingsError(f"{settings.source or '<study>'}: {settings.model} on the server generates text (vLLM), "
                            f"but model_repository has no vLLM-backend {settings.model} with its model.json: the "
                            f"audit of a generative deployment reads the engine arguments there")


def deployed_engine(settings: StudySettings) -> tuple[dict, str]:
    """The engine arguments the deployment runs, vLLM's values filled in where model.json leaves one out
    (as tune's incumbent), and where they were read (a remote server's: an assumption, said)."""
    base = base_config(settings)
    args = base_engine(settings, base)
    if args is None:
        raise SettingsError(f"{settings.source or '<study>'}: {settings.model} is not a vLLM-backend model")
    path = engineargs.version_dir(Path(settings.model_repository) / settings.model) / engineargs.ENGINE_FILE
    where = (f"{path} (the server serves it)" if settings.server.launcher != "remote" else
             f"{path}: a remote Triton does not expose model.json; assumed to be what the server runs")
    return engineargs.in_effect(args, _device(settings)), where


def _device(settings: StudySettings) -> str:
    return engineargs.engine_device(launcher=settings.server.launcher, gpu=settings.cost.gpu)


def engine_params(args: dict, *, gpu: bool) -> space.Params:
    """The engine knobs' values in `args` (the KV cache's size only where model.json sets one; the GPU
    memory share only on a GPU)."""
    out: space.Params = {}
    for knob in space.ENGINE_KNOBS:
        value = knob.read(args)
        if value is not None and (gpu or knob.name != space.GPU_MEMORY):
            out[knob.name] = value
    return out


def _check_traffic(settings: StudySettings, base: ModelConfig, traffic: pd.DataFrame, *, args: dict) -> None:
    """Refuse, before a server starts, traffic a generative replay cannot send: no token columns, a model
    that does not stream, a request longer than the engine's context, a measured window with no request
    due (as tune does)."""
    from tuner.replay import plan_generate
    from tuner.trial.generate import check_context
    from tuner.trial.step import check_measured, step_windows

    plan_generate({**json.loads(modelconfig.to_json(base)), "name": settings.model}, traffic)
    context = engineargs.context_tokens(args)
    if context is not None:
        check_context(traffic, context, model=settings.model)
    check_measured(step_windows(traffic, settings), settings.traffic.speed, source=str(settings.traffic.path))


def audit_engine(settings: StudySettings, baseline: Baseline | None = None, at_load_only: bool = False, *,
                 progress: bool = True) -> AuditResult:
    """Measure the generative deployment the study's server runs now and judge it."""
    check_generative(settings, generative=True)
    args, where = deployed_engine(settings)
    traffic = study_traffic(settings)
    _check_traffic(settings, base_config(settings), traffic, args=args)
    price = price_for(settings.cost, source=settings.source).price_per_hour
    server = settings.server.url if settings.server.launcher == "remote" else f"{settings.server.launcher} server"
    params = engine_params(args, gpu=_device(settings) != "cpu")
    replays: list[tuple[TokenMeasurement, dict | None]] = []  # each replay, with the engine's stretch over it
    say = _say_step(settings, traffic) if progress else None
    metrics_url = None
    with make_launcher(settings, read_only=True) as launcher, \
            EngineWatch(launcher.endpoints.metrics, settings.model) as watch:
        metrics_url = launcher.endpoints.metrics
        def on_measure(m: TokenMeasurement) -> None:
            stretch = watch.mark()
            replays.append((m, stretch.as_dict() if stretch is not None else None))
            if say is not None:
                say(m)

        measured = make_measure(launcher, settings, traffic, capacity=not at_load_only, on_measure=on_measure,
                                generative=True)
        if progress:
            print(f"auditing {settings.model} on {server}: {space.describe(params)} (engine arguments: {where})",
                  file=sys.stderr, flush=True)
        result = measured(params, Hints())
    # the replay at the load is the first probe's: its first valid attempt, or its last one
    at_load = next((s for m, s in replays if m.valid), replays[-1][1] if replays else None)
    out = AuditResult(model=settings.model, server=server, params=params, result=result, price_per_hour=price,
                      baseline=baseline, unit=TOKENS, traffic_path=str(settings.traffic.path),
                      sla={"percentile": settings.sla.percentile, "ttft_ms": settings.sla.ttft_ms,
                           "tpot_ms": settings.sla.tpot_ms, "max_error_rate": settings.sla.max_error_rate},
                      engine={"args": args, "args_from": where, "at_load": at_load, "sampled_every_s": INTERVAL_S,
                              "metrics_url": metrics_url})
    mine = out.capacity_output_tokens_per_s
    if baseline is not None and mine and baseline.output_tokens_per_s:
        ratio = mine / baseline.output_tokens_per_s
        cost = result.monthly_cost
        out = dataclasses.replace(out, ratio=ratio,
                                  recoverable_per_month=max(0.0, 1.0 - ratio) * cost if cost is not None else None)
    return dataclasses.replace(out, findings=engine_findings(out, settings, at_load_only))


def engine_findings(a: AuditResult, settings: StudySettings, at_load_only: bool) -> list[Finding]:
    """A generative audit's findings: the engine arguments and where they were read, the token SLA at the
    recorded load, the engine's statistics there, the capacity in output tokens/s, the ratio, the soak."""
    r, load, sla = a.result, a.result.at_load, settings.sla
    engine = a.engine or {}
    out = [Finding("deployed engine arguments", space.describe(a.params), "info", f"from {engine.get('args_from')}")]
    if r.outcome in NO_VERDICT:
        return out + no_verdict(r)
    pct = percentile_key(sla.percentile)
    latencies = ", ".join(
        f"{pct} {name} {_ms(figures.get(pct))} ms" + (f" (limit {limit:g})" if limit is not None else "")
        for name, figures, limit in (("TTFT", load.ttft_ms, sla.ttft_ms), ("TPOT", load.tpot_ms, sla.tpot_ms)))
    out.append(Finding("SLA at the recorded load", f"{latencies}, errors {load.error_rate:.2%}",
                       "ok" if r.meets_sla else "broken",
                       "" if r.meets_sla else f"{r.sla_reason}: the deployment misses its SLA at today's load"))
    out += _engine_statistics(engine.get("at_load"), a.params, engine.get("sampled_every_s", INTERVAL_S),
                              metrics_url=engine.get("metrics_url"))
    mine = a.capacity_output_tokens_per_s
    if at_load_only:
        out.append(Finding("capacity", "not measured (--at-load-only)", "info"))
    elif r.meets_sla and mine:
        cost = formats.number(r.monthly_cost, ",.0f")
        out.append(Finding("capacity", f"{mine:.1f} output tokens/s ({r.capacity_rps:.2f} req/s, speed "
                           f"{r.capacity_speed:.2f}), {formats.number(r.scores.get('capacity'), ',.0f')} output "
                           f"tokens/$; {r.servers_needed} server(s) for the peak, ${cost}/month", "info"))
    theirs = a.baseline.output_tokens_per_s if a.baseline is not None else None
    return out + ratio_findings(a, mine or 0.0, theirs or 0.0, unit="output tokens/s") + soak_findings(settings.output)


def _engine_statistics(stats: dict | None, params: space.Params, every_s: float, *,
                       metrics_url: str | None = None) -> list[Finding]:
    """What vLLM's own series said over the replay at the recorded load (None: it reports none)."""
    if stats is None:
        return [Finding("vLLM's statistics", "none on the server's /metrics", "info",
                        f"no vllm: series for the model at {metrics_url or 'its metrics URL'} (a remote server's "
                        "metrics not on its HTTP port + 2: set server.metrics_url; NVIDIA's vLLM backend reports "
                        "them with the parameter REPORT_CUSTOM_METRICS): no preemption or KV-cache finding")]
    preempted = stats.get("preemptions") or 0.0
    out = [Finding("preemptions at the recorded load", f"{preempted:.0f}", "watch" if preempted > 0 else "ok",
                   "vLLM evicted running sequences to free KV cache and recomputed them: the KV cache is too "
                   "small for the traffic" if preempted > 0 else "")]
    kv = stats.get("kv_cache_usage_peak")
    out.append(Finding("KV-cache use at the recorded load",
                       "not reported" if _missing(kv) else f"peak {kv:.0%} (sampled every {every_s:g} s)", "info"))
    running, waiting = stats.get("running_peak"), stats.get("waiting_peak")
    if not _missing(running):
        slots = params.get(space.MAX_SEQS)
        waited = not _missing(waiting) and waiting > 0
        full = waited and slots is not None and running >= slots
        out.append(Finding("sequences at the recorded load",
                           f"peak {running:.0f} running (of {formats.number(slots)}), "
                           f"{formats.number(waiting, '.0f')} waiting", "watch" if full else "info",
                           "every sequence slot was taken and requests waited: max_num_seqs caps the batch at "
                           "today's load" if full else ""))
    return out


def _ms(value: float | None) -> str:
    # three significant digits, never as an exponent (a TTFT of seconds reads 1345, not 1.35e+03)
    return formats.number(value, ".0f" if value is not None and abs(value) >= 100 else ".3g")


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _say_step(settings: StudySettings, traffic):
    pct = percentile_key(settings.sla.percentile)
    # a capacity step is judged as the search judges it: the SLA, and an engine falling behind its window
    step_check = keeping_up(check_tokens, tokens_per_s=mean_output_tps(traffic))

    def say(m: TokenMeasurement) -> None:
        # the recorded load: the rule its record is judged by (load_check: falling behind fails it too,
        # unless its window is too short to tell); a capacity step: the step's
        check = (load_check(check_tokens, m, tokens_per_s=mean_output_tps(traffic))
                 if m.speed == settings.traffic.speed else step_check)
        verdict = sla_verdict(check(m, settings.sla)) if m.valid else \
            f"no verdict, {m.invalid_reason}"  # replayed again (the step's retry policy)
        print(f"  replay at speed {m.speed:.2f}: {m.throughput_rps:.2f} req/s, {m.output_tokens_per_s:.1f} output "
              f"tokens/s, {pct} TTFT {_ms(m.ttft_ms.get(pct))} ms, TPOT {_ms(m.tpot_ms.get(pct))} ms: "
              f"{verdict}", file=sys.stderr, flush=True)

    return say


def textfile_families(a: AuditResult, labels) -> list:
    """A generative audit's figures as gauges for node_exporter's textfile (`labels`: a
    `tuner.production.Labels`): in output tokens (their names and the ratio's `unit` say so), never as
    requests."""
    stats = (a.engine or {}).get("at_load") or {}
    kv = stats.get("kv_cache_usage_peak")
    families = [
        labels.gauge("tuner_output_tokens_per_dollar",
                     "Output tokens served per dollar: the deployment's capacity in output tokens/s / price.",
                     a.result.scores.get("capacity") if a.capacity_output_tokens_per_s else None),
        labels.gauge("tuner_capacity_output_tokens_per_second",
                     "The deployment's capacity: output tokens/s of its fastest replay within the SLA.",
                     a.capacity_output_tokens_per_s),
        labels.gauge("tuner_throughput_ratio", "The deployment's capacity / the baseline's, in `unit`.", a.ratio,
                     unit=TOKENS),
        labels.gauge("tuner_recoverable_dollars_per_month", "The throughput gap x the servers' monthly cost.",
                     a.recoverable_per_month),
        labels.gauge("tuner_engine_preemptions", "vLLM's preemptions during the replay at the recorded load.",
                     stats.get("preemptions")),
        labels.gauge("tuner_engine_kv_cache_usage_peak_ratio",
                     "vLLM's KV-cache use at its sampled peak during the replay at the recorded load.",
                     None if _missing(kv) else kv),
        labels.gauge("tuner_audit_exit_code", "The audit's exit code: 0 healthy, 10 inefficient, 3 SLA broken.",
                     a.exit_code),
    ]
    return [f for f in families if f is not None]
