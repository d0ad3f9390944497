"""`tuner exporter --triton HOST:PORT ...`: the production figures without a Prometheus, from the /metrics
of each Triton scraped here every `interval_s` (a thread of its own), the last window held in memory
(tuner/production/_samples.py) and judged as the Prometheus source's window is (`judge`)."""

from __future__ import annotations

import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from tuner.audit import Baseline
from tuner.cost import price_for
from tuner.production._audit import judge
from tuner.production._errors import TritonMetricsError
from tuner.production._result import ProductionAudit
from tuner.production._samples import CounterWindow, Scrape, parse_scrape
from tuner.settings import StudySettings
from tuner.study import base_config

__all__ = ["TIMEOUT_S", "TritonSource", "metrics_url"]

TIMEOUT_S = 10.0  # one scrape's answer (Prometheus's default scrape_timeout)


def metrics_url(target: str) -> str:
    """`http://host:8002/metrics` from `host:8002` (or a URL, its path kept); TritonMetricsError otherwise."""
    text = target.strip()
    url = text if "://" in text else f"http://{text}"
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise TritonMetricsError(f"--triton {target!r}: not HOST:PORT (Triton's metrics port, like 127.0.0.1:8002)")
    return url if parts.path not in ("", "/") else f"{parts.scheme}://{parts.netloc}/metrics"


class TritonSource:
    """The Tritons at `targets` (HOST:PORT of their metrics ports), scraped for the study's model."""

    def __init__(self, targets: list[str], *, model: str, window_s: float, interval_s: float = 15.0):
        self.urls = {urllib.parse.urlsplit(u).netloc: u for u in map(metrics_url, targets)}
        self.model, self.interval_s = model, interval_s
        self.window = CounterWindow(window_s)
        self.url = "triton " + " ".join(self.urls)  # what the audit's `prometheus` field names
        self._lock = threading.Lock()
        self._errors: dict[str, str] = {}
        self._stop = threading.Event()

    def check(self) -> None:
        """Scrape every Triton once: TritonMetricsError (one line) for one that does not answer, answers
        no Triton metrics, or has no series of the model. The samples are the window's first."""
        for instance, url in self.urls.items():
            scrape = self._fetch(url)
            if self.model not in scrape.models:
                seen = ", ".join(sorted(m for m in scrape.models if m)) or "none"
                raise TritonMetricsError(
                    f"--triton {instance}: model {self.model!r} has no series in {url} (models there: {seen})"
                )
            with self._lock:
                self.window.add(instance, time.time(), scrape.series)

    def scrape(self) -> dict[str, str]:
        """Scrape every Triton once into the window; the failures by instance (said once, on stderr)."""
        errors = {}
        for instance, url in self.urls.items():
            try:
                scrape = self._fetch(url)
            except TritonMetricsError as exc:  # a gap in this server's samples, not the exporter's end
                errors[instance] = str(exc)
                continue
            with self._lock:
                self.window.add(instance, time.time(), scrape.series)
        for instance, error in errors.items():
            if self._errors.get(instance) != error:
                print(f"tuner exporter: {error}", file=sys.stderr, flush=True)
        self._errors = errors
        return errors

    def start(self) -> threading.Thread:
        """Scrape every `interval_s` from a daemon thread until `stop()`."""
        def loop() -> None:
            while not self._stop.wait(self.interval_s):
                self.scrape()

        thread = threading.Thread(target=loop, name="triton-scrape", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        """End the scraping thread after its current scrape."""
        self._stop.set()

    def audit(self, settings: StudySettings, *, baseline: Baseline | None = None) -> ProductionAudit:
        """The audit of the window held now (the Prometheus source's figures, findings and exit code)."""
        with self._lock:
            counters, step_s = self.window.counters(now=time.time())
        end = counters.ends[-1].timestamp()
        return judge(
            counters,
            model=settings.model,
            prometheus=self.url,
            start=end - step_s,
            end=end,
            step_s=step_s,
            max_batch_size=base_config(settings).max_batch_size,
            price_per_hour=price_for(settings.cost, source=settings.source).price_per_hour,
            max_error_rate=settings.sla.max_error_rate,
            baseline=baseline,
        )

    @property
    def failing(self) -> dict[str, str]:
        """The Tritons whose last scrape failed, with why."""
        return dict(self._errors)

    def _fetch(self, url: str) -> Scrape:
        where = f"--triton {urllib.parse.urlsplit(url).netloc}"
        try:
            with urllib.request.urlopen(url, timeout=TIMEOUT_S) as answer:
                text = answer.read().decode("utf-8", errors="replace")
        except urllib.error.HTTPError as exc:
            raise TritonMetricsError(f"{where}: not Triton's metrics port ({url} answered HTTP {exc.code})") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise TritonMetricsError(f"{where}: cannot read {url} ({reason})") from None
        scrape = parse_scrape(text, self.model)
        if scrape is None:
            raise TritonMetricsError(
                f"{where}: no Triton metrics at {url} (not Triton's metrics port, or the server was started "
                "with --allow-metrics false)"
            )
        return scrape
