"""The long-running exporter (`tuner exporter`): /metrics on 127.0.0.1 with the study's constants, the
production audit of the last --window (its figures from Prometheus, recomputed at most every
`refresh_s`, or from the samples a TritonSource holds of Tritons it scrapes itself) and, given the
nightly job's output, the last night's verdict (tuner/production/_metrics.py builds them all)."""

from __future__ import annotations

import errno
import socketserver
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily, Metric

from tuner.audit import Baseline
from tuner.errors import InputError, TunerError
from tuner.nightly.history import read_history
from tuner.production import _metrics as m
from tuner.production._audit import production_audit
from tuner.production._client import Prometheus
from tuner.production._triton import TritonSource
from tuner.settings import StudySettings
from tuner.study import base_config

__all__ = ["DEFAULT_PORT", "AuditCollector", "serve"]

DEFAULT_PORT = 9465  # not taken by another exporter in Prometheus's list of default ports
REFRESH_S = 30.0


class AuditCollector:
    """A prometheus_client collector of the tuner's metrics for one study, its audit from `prometheus`
    (a Prometheus, or a TritonSource scraping the Tritons itself). A failed audit (Prometheus down, no
    Triton series yet, a Triton that stopped answering) says so in `tuner_exporter_up` 0."""

    def __init__(
        self,
        settings: StudySettings,
        prometheus: Prometheus | TritonSource,
        *,
        window_s: float,
        baseline: Baseline | None = None,
        nightly: str | Path | None = None,
        refresh_s: float = REFRESH_S,
    ):
        self.settings, self.prometheus, self.window_s = settings, prometheus, window_s
        self.baseline, self.nightly, self.refresh_s = baseline, nightly, refresh_s
        self.labels = m.labels_for(settings)
        self.max_batch_size = base_config(
            settings
        ).max_batch_size  # the study's config: read once, checked now
        self._lock = threading.Lock()
        self._at = -float("inf")
        self._audit: list[Metric] = []
        self._error: str | None = None

    def collect(self) -> Iterator[Metric]:
        """The metrics of a scrape (the audit recomputed when older than `refresh_s`)."""
        with self._lock:
            if time.monotonic() - self._at >= self.refresh_s:
                self._refresh()
            audit, error = list(self._audit), self._error
        up = GaugeMetricFamily(
            "tuner_exporter_up", "1: the last audit (from Prometheus, or every Triton's last scrape) succeeded.",
            labels=[*m.LABELS],
        )
        up.add_metric(self.labels.values, 0.0 if error else 1.0)
        # merged as the textfile is: the nightly's two configs are two families of one name
        yield from m.one_family_per_name([
            *m.study_families(self.settings, self.labels, max_batch_size=self.max_batch_size,
                              baseline=self.baseline),
            *audit,
            *self._nightly(),
            up,
        ])

    def _refresh(self) -> None:
        self._at = time.monotonic()
        try:
            if isinstance(self.prometheus, TritonSource):  # the window held in memory, as last scraped
                audit = self.prometheus.audit(self.settings, baseline=self.baseline)
                failing = self.prometheus.failing
                self._audit = m.audit_families(audit, self.labels)
                self._error = "; ".join(failing.values()) if failing else None
                return
            # the window ends now: one step, the window itself
            audit = production_audit(
                self.settings,
                self.prometheus,
                window_s=self.window_s,
                end=float(int(time.time())),
                step_s=self.window_s,
                baseline=self.baseline,
            )
        except TunerError as exc:
            if str(exc) != self._error:  # said once, not at every scrape
                print(f"tuner exporter: {exc}", file=sys.stderr, flush=True)
            self._audit, self._error = [], str(exc)
            return
        self._audit, self._error = m.audit_families(audit, self.labels), None

    def _nightly(self) -> list[Metric]:
        if self.nightly is None:
            return []
        try:
            nights = read_history(self.nightly, warn=lambda _: None)
        except TunerError:
            return []
        return m.nightly_families(nights[-1], self.labels) if nights else []


def serve(collector: AuditCollector, *, port: int, host: str = "127.0.0.1") -> object:
    """Serve `collector` on http://host:port/metrics from a thread of its own; the HTTP server (its
    `shutdown()` stops it). A port in use or not ours to bind: InputError, one line."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:
        server = make_server(host, port, _metrics_only(make_wsgi_app(registry)), _Server,
                             handler_class=_QuietHandler)
    except OSError as exc:
        reason = "in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
        raise InputError(f"--port {port}: cannot serve /metrics on {host}:{port} ({reason})") from None
    threading.Thread(target=server.serve_forever, name="tuner-exporter", daemon=True).start()
    return server


# prometheus_client's start_http_server serves the registry on every path (a scrape of /anything, a
# typo in a scrape config, answered 200); its public make_wsgi_app, served here, is kept to /metrics.
def _metrics_only(app):
    def routed(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return app(environ, start_response)
        status, text = ("200 OK", "tuner exporter: the metrics are at /metrics\n") if path in ("", "/") else \
            ("404 Not Found", f"not found: {path} (the metrics are at /metrics)\n")
        start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
        return [text.encode()]
    return routed


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow scraper never holds the exporter's exit


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # a line per scrape would bury the exporter's own lines
        pass
