"""One window of a generative soak (IO): the stretch of recorded traffic streamed to the vLLM-served
model (`tuner.trial.generate.replay_generate`: measured by the replay in tokens, and by the engine's
counters before and after), with the engine's gauges (KV-cache use, sequences running and waiting)
sampled from Triton's `/metrics` while it runs: at its end an engine that finished every request reads
empty, so the peak and the mean over the window are what can drift. The row's arithmetic is pure
(`tuner.soak.analysis._tokens`)."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Callable

import pandas as pd

from tuner.llm.engine_metrics import GAUGES as METRIC_NAMES
from tuner.llm.engine_metrics import read_engine
from tuner.score import check_tokens
from tuner.server import Launcher
from tuner.settings import StudySettings
from tuner.soak.analysis._tokens import GAUGES, gauge_figures, offered_tokens_per_s, window_row
from tuner.trial.generate import replay_generate

SAMPLE_S = 0.5            # between two reads of /metrics during a window
METRICS_TIMEOUT_S = 5.0


class GaugeSampler:
    """Reads the model's vLLM gauges from Triton's /metrics every `interval_s` in a thread while in use
    (`with`); `samples` holds one {gauge: value} per read that had them."""

    def __init__(self, url: str, model: str, *, interval_s: float = SAMPLE_S) -> None:
        self.url, self.model, self.interval_s = url, model, interval_s
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="soak-engine-gauges", daemon=True)

    def __enter__(self) -> GaugeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=METRICS_TIMEOUT_S + self.interval_s)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                with urllib.request.urlopen(self.url, timeout=METRICS_TIMEOUT_S) as response:
                    text = response.read().decode(errors="replace")
            except (urllib.error.URLError, OSError):
                continue  # a missed read is a missing sample, not a failed window
            values = read_engine(text, self.model).values
            sample = {g: values[METRIC_NAMES[g]] for g in GAUGES if METRIC_NAMES[g] in values}
            if sample:
                self.samples.append(sample)


def measure_window(launcher: Launcher, settings: StudySettings, part: pd.DataFrame, *, speed: float,
                   warmup_s: float, memory: Callable[[], dict]) -> dict:
    """Stream `part` at `speed` to the model (measured after `warmup_s`) and return the window's figures
    (`tuner.soak.analysis._tokens.window_row`); `memory()`: the server's memory after it."""
    with GaugeSampler(launcher.endpoints.metrics, settings.model) as sampler:
        run = replay_generate(launcher, settings, part, speed=speed, warmup_s=warmup_s)
    m = run.measurement
    check = check_tokens(m, settings.sla)
    return window_row(m, sla_ok=check.ok, sla_reason=check.reason, engine=run.engine,
                      gauges=gauge_figures(sampler.samples, run.engine), sent_output_tokens=run.whole.output_tokens,
                      offered_tokens=offered_tokens_per_s(part, speed=speed, warmup_s=warmup_s, duration_s=m.duration_s),
                      memory=memory(), first_error=run.first_error)
