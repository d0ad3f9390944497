"""One window of a generative soak (IO): the stretch of recorded traffic streamed to the vLLM-served
model (`tuner.trial.generate.replay_generate`: measured by the replay in tokens, and by the engine's
counters over it), with the engine's gauges (KV-cache use, sequences running and waiting) sampled from
Triton's `/metrics` while it runs (`tuner.llm.engine_watch`, inside the replay): at its end an engine that
finished every request reads empty, so the peak and the mean over the window are what can drift. The row's arithmetic is pure
(`tuner.soak.analysis._tokens`)."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from tuner.score import check_tokens
from tuner.server import Launcher
from tuner.settings import StudySettings
from tuner.soak.analysis._tokens import gauge_figures, offered_tokens_per_s, window_row
from tuner.trial.generate import replay_generate


def measure_window(launcher: Launcher, settings: StudySettings, part: pd.DataFrame, *, speed: float,
                   warmup_s: float, memory: Callable[[], dict], duration_s: float | None = None) -> dict:
    """Stream `part` at `speed` to the model (measured after `warmup_s`, to `duration_s`: the window's
    wall length, warm-up included, where its measured part ends) and return the window's figures
    (`tuner.soak.analysis._tokens.window_row`); `memory()`: the server's memory after it."""
    measured_s = None if duration_s is None else max(duration_s - warmup_s, 0.0)  # replay_generate's: after it
    run = replay_generate(launcher, settings, part, speed=speed, warmup_s=warmup_s,
                          duration_s=measured_s)  # its gauges sampled meanwhile
    m, stretch = run.measurement, run.stretch
    check = check_tokens(m, settings.sla)
    return window_row(m, sla_ok=check.ok, sla_reason=check.reason, engine=run.engine,
                      gauges=gauge_figures(stretch.gauge_samples if stretch else (), run.engine),
                      sent_output_tokens=run.whole.output_tokens,
                      offered_tokens=offered_tokens_per_s(part, speed=speed, warmup_s=warmup_s, duration_s=m.duration_s),
                      memory=memory(), first_error=run.first_error)
