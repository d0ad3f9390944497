"""The production audit (`tuner audit --prometheus URL`): what production did, read from Triton's
counters in Prometheus over a window (default 7 days) and per hour of it, judged as the replay audit
judges a deployment (tuner.audit: its thresholds, findings table and exit codes).

    _client    Prometheus's HTTP query API, every failure one line
    _errors    its bad inputs (InputErrors: exit 2)
    _window    durations in Prometheus's notation (--window, the retention)
    _series    Triton's counters as increases per step and instance (pandas)
    _figures   the figures from those increases: pure arithmetic, no HTTP
    _result    the audit's result and findings
    _audit     the audit: read, figure, judge
    _metrics   the figures as Prometheus metrics (prometheus_client), and the textfile
    _exporter  `tuner exporter`: those metrics on /metrics, the audit recomputed as scraped
    _samples   Triton's /metrics parsed, the last window's samples in memory (counter resets handled)
    _triton    `tuner exporter --triton`: the Tritons' /metrics scraped here, no Prometheus

A generative model (vLLM serves it; Triton's batcher does nothing) is audited from vLLM's own series:

    _engine_series    vLLM's counters, histograms and gauges per step (and TTFT/TPOT over the window)
    _engine_figures   output tokens/s and per dollar, the peak, the steps over the token SLA
    _engine_result    the audit's result and findings (the same table and exit codes)
    _engine_baseline  a generative `tuner tune`'s output (unit: tokens) as the baseline
    _engine_audit     the audit: read, figure, judge
"""

from tuner.production._audit import HOUR_S, judge, production_audit, window_bounds
from tuner.production._client import Prometheus
from tuner.production._engine_audit import judge_engine, production_engine_audit
from tuner.production._engine_baseline import load_engine_baseline
from tuner.production._engine_figures import EngineSeries
from tuner.production._engine_result import EngineAudit, EngineBaseline
from tuner.production._engine_series import engine_queries, read_engine_series
from tuner.production._errors import NoSeriesError, PrometheusError, TritonMetricsError, WindowError
from tuner.production._exporter import DEFAULT_PORT, AuditCollector, serve
from tuner.production._figures import ProductionFigures
from tuner.production._metrics import (
    Labels,
    audit_families,
    check_textfile,
    engine_audit_families,
    labels_for,
    nightly_families,
    replay_audit_families,
    study_families,
    write_textfile,
)
from tuner.production._result import ProductionAudit
from tuner.production._samples import CounterWindow, parse_scrape
from tuner.production._series import METRICS, Counters, counter_queries, read_counters
from tuner.production._triton import TritonSource
from tuner.production._window import parse_duration

__all__ = [
    "DEFAULT_PORT",
    "engine_queries",
    "EngineAudit",
    "EngineBaseline",
    "EngineSeries",
    "judge_engine",
    "load_engine_baseline",
    "production_engine_audit",
    "read_engine_series",
    "AuditCollector",
    "Labels",
    "audit_families",
    "check_textfile",
    "engine_audit_families",
    "labels_for",
    "nightly_families",
    "replay_audit_families",
    "serve",
    "study_families",
    "write_textfile",
    "HOUR_S",
    "METRICS",
    "counter_queries",
    "Counters",
    "CounterWindow",
    "ProductionFigures",
    "NoSeriesError",
    "ProductionAudit",
    "Prometheus",
    "PrometheusError",
    "TritonMetricsError",
    "TritonSource",
    "WindowError",
    "judge",
    "parse_duration",
    "parse_scrape",
    "production_audit",
    "read_counters",
    "window_bounds",
]
