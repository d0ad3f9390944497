"""vLLM's statistics watched while replays run: Triton's `/metrics` read in a thread of its own every
`interval_s`, so that a stretch of time (from one `mark` to the next: one replay) comes with what the
engine counted over it (preemptions, requests, tokens: the counters' difference) and the peaks of its
gauges (running and waiting sequences, KV-cache use), which one snapshot taken after the replay would
read at rest. The peaks are of the samples: a spike shorter than `interval_s` can fall between two.

    EngineWatch(url, model, interval_s=0.5)   a context manager; .mark() -> Stretch | None;
                                              .wait_idle(timeout_s) -> bool
    stretch_of(start, samples, seconds)       the arithmetic, on snapshots (pure)
    batch_figures(stretch)                    what a trial keeps of it: the engine's batching, in numbers
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass

from tuner.llm.engine_metrics import GAUGES, EngineFigures, EngineSnapshot, engine_delta, read_engine

__all__ = ["BATCH_FIGURES", "EngineWatch", "Stretch", "batch_figures", "stretch_of"]

INTERVAL_S = 0.5
TIMEOUT_S = 5.0


@dataclass(frozen=True, kw_only=True)
class Stretch:
    """What the engine did between two marks: its counters' difference and its gauges' sampled peaks."""

    seconds: float
    samples: int                # snapshots the peaks are of (the closing one included)
    figures: EngineFigures      # counters over the stretch, gauges at its end
    running_peak: float         # sequences the engine ran at once (NaN: the engine reports none)
    waiting_peak: float         # requests waiting for the scheduler
    kv_cache_peak: float        # KV-cache use, 0..1
    # the gauges ({running, waiting, kv_cache_usage: value}) of each sample taken during the stretch, the
    # closing snapshot left out: a soak's window takes their mean as well as their peak
    gauge_samples: tuple[dict[str, float], ...] = ()

    def as_dict(self) -> dict:
        """Plain numbers (no histograms), for a JSON output."""
        figures = {k: v for k, v in dataclasses.asdict(self.figures).items() if k != "histograms"}
        return {"seconds": self.seconds, "samples": self.samples, "running_peak": self.running_peak,
                "waiting_peak": self.waiting_peak, "kv_cache_usage_peak": self.kv_cache_peak, **figures}


# what a trial keeps of the engine over one replay (tuner.trial.record.Figures has a field of each name)
BATCH_FIGURES = ("preemptions", "running_peak", "waiting_peak", "kv_cache_peak", "emulated_overrun_share")


def batch_figures(stretch: Stretch | None) -> dict[str, float]:
    """How the engine batched over a stretch: its preemptions, the peaks of its running and waiting
    sequences and of its KV-cache use (0..1), and an emulated GPU's share of overrun steps (NaN on a
    real engine, or where the engine reports none of it). Empty where the engine could not be read."""
    if stretch is None:
        return {}
    figures = {"preemptions": stretch.figures.preemptions, "running_peak": stretch.running_peak,
               "waiting_peak": stretch.waiting_peak, "kv_cache_peak": stretch.kv_cache_peak,
               "emulated_overrun_share": stretch.figures.overrun_share}
    return figures


def stretch_of(start: EngineSnapshot, samples: Sequence[EngineSnapshot], seconds: float) -> Stretch:
    """The stretch from snapshot `start` to the last of `samples` (taken after it, in order)."""
    if not samples:
        raise ValueError("a stretch needs at least its closing snapshot")

    def peak(key: str) -> float:
        values = [s.values[GAUGES[key]] for s in samples if GAUGES[key] in s.values]
        return max(values) if values else math.nan

    during = tuple(g for g in ({key: s.values[name] for key, name in GAUGES.items() if name in s.values}
                               for s in samples[:-1]) if g)
    return Stretch(seconds=seconds, samples=len(samples), figures=engine_delta(start, samples[-1]),
                   running_peak=peak("running"), waiting_peak=peak("waiting"), kv_cache_peak=peak("kv_cache_usage"),
                   gauge_samples=during)


class EngineWatch:
    """Samples `model`'s vllm: series at a Prometheus text endpoint (Triton's `/metrics`) while open."""

    def __init__(self, url: str, model: str, *, interval_s: float = INTERVAL_S, timeout_s: float = TIMEOUT_S):
        self.url, self.model, self.interval_s, self.timeout_s = url, model, interval_s, timeout_s
        self._lock = threading.Lock()
        self._samples: list[EngineSnapshot] = []
        self._start: EngineSnapshot | None = None
        self._since = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="engine-watch", daemon=True)

    def __enter__(self) -> EngineWatch:
        text = self._fetch()
        # an endpoint that answers without the model's series: a fresh engine, which (through Triton's
        # vLLM backend) reports them from its first request on; it has counted nothing yet
        self._start = None if text is None else (self._snapshot(text) or EngineSnapshot())
        self._since = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=self.timeout_s + self.interval_s)

    def read(self) -> EngineSnapshot | None:
        """The model's vllm: series now; None when the endpoint cannot be read or holds none."""
        text = self._fetch()
        return None if text is None else self._snapshot(text)

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until the engine runs and queues no request (its gauges), up to `timeout_s`: whether it
        did. False at once when its series cannot be read."""
        deadline = time.monotonic() + timeout_s
        while (snapshot := self.read()) is not None:
            busy = sum(snapshot.values.get(GAUGES[key], 0.0) for key in ("running", "waiting"))
            if busy <= 0:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(self.interval_s, 0.1))
        return False

    def _fetch(self) -> str | None:
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_s) as response:
                return response.read().decode(errors="replace")
        except (urllib.error.URLError, OSError):
            return None

    def _snapshot(self, text: str) -> EngineSnapshot | None:
        snapshot = read_engine(text, self.model)
        return snapshot if snapshot.values or snapshot.histograms else None

    def mark(self) -> Stretch | None:
        """Close the stretch since the last mark (or the start) and open the next one; None when the
        engine's series could not be read at either end."""
        end, now = self.read(), time.monotonic()
        with self._lock:
            samples, self._samples = self._samples, []
        start, self._start = self._start, end
        seconds, self._since = now - self._since, now
        if start is None or end is None:
            return None
        return stretch_of(start, [*samples, end], seconds)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            snapshot = self.read()
            if snapshot is not None:
                with self._lock:
                    self._samples.append(snapshot)
