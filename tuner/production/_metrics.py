"""The tuner's figures as Prometheus metrics (prometheus_client), for dashboards and alerts: built here
once, served by the exporter (`tuner exporter`, _exporter.py) or written for node_exporter's textfile
collector (`tuner audit --textfile`, `tuner nightly --textfile`).

Names follow Prometheus's naming guide: the `tuner_` prefix, the unit in the name (`_seconds`,
`_dollars_per_hour`, `_ratio` for a fraction), base units; every series carries `model`, `version`
and `gpu`. deploy/prometheus/tuner-rules.yml and deploy/grafana/tuner-dashboard.json read them.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client import CollectorRegistry, write_to_textfile
from prometheus_client.core import GaugeMetricFamily, Metric

from tuner.audit import AuditResult, Baseline
from tuner.cost import price_for
from tuner.errors import OutputError
from tuner.paths import os_reason
from tuner.production._engine_result import EngineAudit
from tuner.production._result import ProductionAudit
from tuner.settings import SlaSettings, StudySettings

__all__ = [
    "DECISIONS",
    "Labels",
    "audit_families",
    "check_textfile",
    "engine_audit_families",
    "labels_for",
    "nightly_families",
    "one_family_per_name",
    "registry_of",
    "replay_audit_families",
    "study_families",
    "write_textfile",
]

LABELS = ("model", "version", "gpu")
DECISIONS = ("keep", "change")  # the nightly rule's decisions (tuner/nightly/rule.py)
SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class Labels:
    """The labels every series carries: the model, its version, the GPU it is priced on."""

    model: str
    version: str
    gpu: str

    @property
    def values(self) -> list[str]:
        """The label values, in LABELS' order."""
        return [self.model, self.version, self.gpu]

    def gauge(self, name: str, doc: str, value: float | None, **extra: str) -> GaugeMetricFamily | None:
        """A gauge family of one series with these labels (and `extra`); None without a value."""
        if value is None:
            return None
        family = GaugeMetricFamily(name, doc, labels=[*LABELS, *extra])
        family.add_metric([*self.values, *extra.values()], float(value))
        return family


def labels_for(settings: StudySettings) -> Labels:
    """The study's labels; `version` is the newest numbered version directory of the model in the study's
    repository (Triton's default policy serves it), empty where the repository is not on this host."""
    folder = Path(settings.model_repository) / settings.model
    try:
        versions = [int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit()]
    except OSError:
        versions = []
    # the GPU as the price table names it (cost.gpu's case aside): one GPU type, one label value
    return Labels(settings.model, str(max(versions)) if versions else "", settings.cost.gpu.lower())


def _present(families: Iterable[Metric | None]) -> list[Metric]:
    return [f for f in families if f is not None]


def study_families(
    settings: StudySettings, labels: Labels, *, max_batch_size: int, baseline: Baseline | None = None
) -> list[Metric]:
    """What the study says (the price, max_batch_size, the SLA) and the baseline's figures: the constants
    the recording rules divide Triton's own counters by."""
    price = price_for(settings.cost, source=settings.source).price_per_hour
    capacity = baseline.capacity_rps if baseline is not None else None
    return _present(
        [
            labels.gauge(
                "tuner_gpu_price_dollars_per_hour", "What one server of the model costs per hour.", price
            ),
            labels.gauge(
                "tuner_max_batch_size",
                "The model's max_batch_size (the fill rate's denominator).",
                max_batch_size,
            ),
            labels.gauge(
                "tuner_sla_latency_seconds",
                "The SLA's latency limit at its percentile (the percentile label, as a quantile: 0.99).",
                settings.sla.latency_ms / 1000,
                percentile=_percentile(settings.sla),
            ),
            labels.gauge(
                "tuner_sla_max_error_ratio",
                "The share of failed requests the SLA allows.",
                settings.sla.max_error_rate,
            ),
            labels.gauge(
                "tuner_baseline_capacity_requests_per_second",
                "The baseline's capacity: what one tuned server serves under the SLA.",
                capacity,
            ),
            labels.gauge(
                "tuner_baseline_requests_per_dollar",
                "The baseline's requests per dollar (capacity / price).",
                None if capacity is None or not price else capacity * SECONDS_PER_HOUR / price,
            ),
        ]
    )


def _percentile(sla: SlaSettings) -> str:
    """The `percentile` label's value: the SLA's percentile as Triton's summaries write their quantile
    (0.99 for 99), so that a rule can join the two. Not named `quantile`: Prometheus reserves it for
    summaries (promtool check metrics refuses it on a gauge)."""
    return f"{sla.percentile / 100:g}"


COVERED_HELP = ("The seconds of the window the replicas' samples cover: what the per-second figures divide by "
                "(a scrape gap, or time before the first replica started, is not counted as idle).")


def audit_families(audit: ProductionAudit, labels: Labels) -> list[Metric]:
    """The production audit's figures over its window (absent where the window had nothing to divide)."""
    f = audit.figures
    measured = f.seconds > 0
    rpd = (
        f.per_replica_rps * SECONDS_PER_HOUR / audit.price_per_hour
        if measured and audit.price_per_hour
        else None
    )
    return _present(
        [
            labels.gauge(
                "tuner_requests_per_dollar",
                "Requests served per dollar: per replica over the audit's window.",
                rpd,
            ),
            labels.gauge(
                "tuner_production_requests_per_second",
                "Requests served per second, all replicas.",
                f.throughput_rps if measured else None,
            ),
            labels.gauge(
                "tuner_production_replicas",
                "Instances serving, on average over the window.",
                f.replicas if measured else None,
            ),
            labels.gauge("tuner_batch_fill_ratio", "Mean dispatched batch / max_batch_size.", f.fill_rate),
            labels.gauge(
                "tuner_throughput_ratio", "What a replica serves / the baseline's capacity.", audit.ratio
            ),
            labels.gauge(
                "tuner_recoverable_dollars_per_month",
                "The throughput gap x the replicas' monthly cost.",
                audit.recoverable_per_month,
            ),
            labels.gauge("tuner_production_error_ratio", "Failed requests / all requests.", f.error_rate),
            labels.gauge(
                "tuner_audit_window_seconds", "The audit's window.", (audit.end - audit.start).total_seconds()
            ),
            labels.gauge("tuner_audit_covered_seconds", COVERED_HELP, f.seconds),
            labels.gauge(
                "tuner_audit_window_end_timestamp_seconds",
                "The end of the audit's window (Unix time).",
                audit.end.timestamp(),
            ),
            _exit_code(labels, audit.exit_code),
        ]
    )


def engine_audit_families(audit: EngineAudit, labels: Labels) -> list[Metric]:
    """A generative model's production audit over its window: output tokens per dollar and per second,
    TTFT and TPOT at the SLA's percentile (the percentile label), the steps over the SLA, preemptions,
    the KV cache's peak, the peak's ratio to the baseline (absent where there was nothing to measure)."""
    f = audit.figures
    measured = f.seconds > 0
    seconds = {"ttft": f.ttft_ms, "tpot": f.tpot_ms}
    return _present(
        [
            labels.gauge("tuner_output_tokens_per_dollar", "Output tokens served per dollar of the replicas' time "
                         "over the audit's window.", f.tokens_per_dollar),
            labels.gauge("tuner_production_output_tokens_per_second", "Output tokens per second, all replicas.",
                         f.output_tokens_per_s if measured else None),
            labels.gauge("tuner_production_replicas", "Engines serving, on average over the window.",
                         f.replicas if measured else None),
            *(labels.gauge(f"tuner_production_{k}_seconds", f"The engine's {k.upper()} over the window at the "
                           "SLA's percentile (the percentile label, as a quantile: 0.99).",
                           None if v is None else v / 1000, percentile=_percentile(audit.sla))
              for k, v in seconds.items()),
            labels.gauge("tuner_production_steps_over_sla", "Steps (hours) of the window whose TTFT, TPOT or "
                         "error rate broke the SLA.", len(audit.over_sla) if measured else None),
            labels.gauge("tuner_production_preemptions", "Requests vLLM preempted over the window.",
                         f.preemptions if measured else None),
            labels.gauge("tuner_production_kv_cache_peak_ratio", "The highest KV-cache use of any engine (0-1).",
                         f.kv_cache_peak),
            labels.gauge("tuner_production_error_ratio", "Failed requests / all requests.", f.error_rate),
            labels.gauge("tuner_throughput_ratio", "The peak step's output tokens/s per replica / the baseline's "
                         "capacity.", audit.ratio),
            labels.gauge("tuner_recoverable_dollars_per_month", "The peak's gap to capacity x the replicas' "
                         "monthly cost.", audit.recoverable_per_month),
            labels.gauge("tuner_audit_window_seconds", "The audit's window.",
                         (audit.end - audit.start).total_seconds()),
            labels.gauge("tuner_audit_covered_seconds", COVERED_HELP, f.seconds),
            labels.gauge("tuner_audit_window_end_timestamp_seconds", "The end of the audit's window (Unix time).",
                         audit.end.timestamp()),
            _exit_code(labels, audit.exit_code),
        ]
    )


def _exit_code(labels: Labels, code: int) -> Metric:
    # one family for both audits: a dashboard or an alert reads one series whichever audit ran
    return labels.gauge("tuner_audit_exit_code", "The audit's exit code: 0 healthy, 10 inefficient, 3 SLA broken.",
                        code)


def replay_audit_families(audit: AuditResult, labels: Labels) -> list[Metric]:
    """The replay audit's figures (`tuner audit` without --prometheus): the deployment's capacity as
    requests per dollar, its fill rate at the recorded load, the ratio and the recoverable budget."""
    record = audit.result
    capacity = record.capacity_rps
    at_load = record.at_load
    rpd = capacity * SECONDS_PER_HOUR / audit.price_per_hour if capacity and audit.price_per_hour else None
    return _present(
        [
            labels.gauge(
                "tuner_requests_per_dollar",
                "Requests served per dollar: the deployment's capacity / price.",
                rpd,
            ),
            labels.gauge(
                "tuner_batch_fill_ratio",
                "Mean dispatched batch / max_batch_size, at the recorded load.",
                at_load.fill_rate if at_load is not None and at_load.requests else None,
            ),
            labels.gauge(
                "tuner_throughput_ratio", "The deployment's capacity / the baseline's.", audit.ratio
            ),
            labels.gauge(
                "tuner_recoverable_dollars_per_month",
                "The throughput gap x the servers' monthly cost.",
                audit.recoverable_per_month,
            ),
            _exit_code(labels, audit.exit_code),
        ]
    )


def nightly_families(entry: dict, labels: Labels) -> list[Metric]:
    """The last night's verdict (a line of the nightly history, tuner/nightly/history.py): 1 on its
    decision, 0 on the other; when it ran; its exit code; production's and the best score per dollar in
    the night's unit: requests, or a generative model's output tokens (their own series, never written
    as requests per dollar). `tuner nightly --textfile` and `tuner exporter --nightly` both write these."""
    decision = entry.get("decision")
    verdict = GaugeMetricFamily(
        "tuner_nightly_verdict",
        "The last nightly run's decision (1: this one).",
        labels=[*LABELS, "decision"],
    )
    for d in DECISIONS:
        verdict.add_metric([*labels.values, d], 1.0 if d == decision else 0.0)
    return _present(
        [
            verdict,
            labels.gauge(
                "tuner_nightly_last_run_timestamp_seconds",
                "When the last nightly run started (Unix time).",
                _night_time(entry.get("night")),
                decision=str(decision),
            ),
            labels.gauge(
                "tuner_nightly_exit_code",
                "The last nightly run's exit code: 0 keep, 10 change proposed.",
                entry.get("exit_code"),
            ),
            labels.gauge(
                "tuner_nightly_requests_per_dollar",
                "Requests per dollar tonight's search measured.",
                entry.get("production_requests_per_dollar"),
                config="production",
            ),
            labels.gauge(
                "tuner_nightly_requests_per_dollar",
                "Requests per dollar tonight's search measured.",
                entry.get("best_requests_per_dollar"),
                config="best",
            ),
            *(
                labels.gauge(
                    "tuner_nightly_output_tokens_per_dollar",
                    "Output tokens per dollar tonight's search measured.",
                    entry.get(f"{config}_tokens_per_dollar"),
                    config=config,
                )
                for config in ("production", "best")
                if entry.get("unit") == "tokens"
            ),
        ]
    )


def _night_time(stamp: str | None) -> float | None:
    """A night's stamp (tuner/nightly/rundir.py: 2026-11-30T021500Z) as Unix time."""
    if not stamp:
        return None
    try:
        return datetime.strptime(stamp, "%Y-%m-%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def one_family_per_name(families: Iterable[Metric]) -> list[Metric]:
    """`families` with those of one name (tuner_nightly_requests_per_dollar's two configs) merged into one
    family holding all their samples, in first-seen order: an exposition says a name's HELP and TYPE once
    (Prometheus's text parser and promtool refuse a second, OpenMetrics's parser "metadata after samples").
    The families given are left as built: every exposition of them (each scrape) merges afresh."""
    merged: dict[str, Metric] = {}
    for f in families:
        if f.name not in merged:
            merged[f.name] = copy.copy(f)
            merged[f.name].samples = list(f.samples)
        else:
            merged[f.name].samples.extend(f.samples)
    return list(merged.values())


class _Families:
    """A collector of families built beforehand."""

    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from one_family_per_name(self.families)


def registry_of(families: list[Metric]) -> CollectorRegistry:
    """A registry serving `families` (and nothing else: no process or platform metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return registry


def check_textfile(path: str | os.PathLike, *, label: str = "--textfile") -> Path:
    """The textfile's directory must exist (node_exporter's --collector.textfile.directory): said before
    the work whose figures it would hold, as one OutputError line."""
    folder = Path(path).parent
    if not folder.is_dir():
        raise OutputError(f"{label} {path}: no such directory {folder} (node_exporter's textfile collector "
                          "reads a directory that exists)")
    return Path(path)


def write_textfile(path: str | os.PathLike, families: list[Metric], *, label: str = "--textfile") -> Path:
    """Write `families` for node_exporter's textfile collector: prometheus_client's write_to_textfile (a
    temporary file in the same directory, renamed over `path`: the collector never reads half a file)."""
    try:
        write_to_textfile(str(path), registry_of(families))
    except OSError as exc:
        raise OutputError(f"{label} {path}: cannot write ({os_reason(exc)})") from None
    return Path(path)
