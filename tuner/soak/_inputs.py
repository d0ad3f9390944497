"""What a soak starts from: the configuration to soak (a vLLM-served model's: its engine arguments),
the recording's quiet windows, and how long a generative window waits after its traffic."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from tuner import modelconfig, space
from tuner.errors import SettingsError
from tuner.files import read_json_object
from tuner.llm import engineargs
from tuner.modelconfig import ModelConfig
from tuner.settings import StudySettings
from tuner.soak.analysis import DAY_S, QuietWindows, cycle_length, quiet_line, quiet_windows
from tuner.study import base_config, base_engine, config_file, engine_file
from tuner.traffic import OUTPUT_TOKENS, TIMESTAMP

RECOMMENDED = Path("recommended") / "config.pbtxt"
RECOMMENDED_ENGINE = Path("recommended") / engineargs.ENGINE_FILE  # a vLLM-served model's (tuner tune's output)
DEFAULT_RESTART_MINUTES = 5.0


def soak_config(settings: StudySettings, output: str | Path, assignments: Iterable[str] = (), *,
                config_path: str | Path | None = None) -> tuple[ModelConfig, str]:
    """The configuration to soak and where it came from: `config_path` if given, else the study's
    recommendation (`OUTPUT/recommended/config.pbtxt`) if there is one, else the model's own
    config.pbtxt; with the `--set` assignments applied."""
    if config_path is not None:
        config, source = config_file(config_path, like=base_config(settings)), str(config_path)
    elif (Path(output) / RECOMMENDED).is_file():
        path = Path(output) / RECOMMENDED
        config, source = modelconfig.load(path), f"{path} (the study's recommendation)"
    else:
        config = base_config(settings)
        source = f"{Path(settings.model_repository) / settings.model / 'config.pbtxt'} (the model's own)"
    params = space.parse_assignments(assignments)
    if params:
        config = space.apply(config, params)
        source += " with " + ", ".join(f"{k}={v}" for k, v in params.items())
    modelconfig.validate(config, source)
    return config, source


def soak_engine(settings: StudySettings, output: str | Path, assignments: Iterable[str] = (), *,
                config_path: str | Path | None = None) -> tuple[ModelConfig, dict, str] | None:
    """What a generative soak soaks, when vLLM serves the study's model (None when it does not): the
    model's config.pbtxt (unchanged: vLLM batches), the engine arguments and where they came from.
    The engine arguments are `config_path`'s (a model.json) if given, else the study's recommendation
    (`OUTPUT/recommended/model.json`) if there is one, else the model's own model.json; with vLLM's
    values filled in for what they leave out (`engineargs.resolved`, as `tuner tune`'s incumbent), and
    the `--set` engine knobs applied (as a trial's are: `space.apply_engine`)."""
    base = base_config(settings)
    own = base_engine(settings, base)
    if own is None:
        return None
    if config_path is not None:
        args, source = engine_file(config_path), str(config_path)  # checked as it is read
    else:
        if (Path(output) / RECOMMENDED_ENGINE).is_file():
            path = Path(output) / RECOMMENDED_ENGINE
            args = read_json_object(path, error=SettingsError)
            label, source = str(path), f"{path} (the study's recommendation)"
        else:
            args = own
            label = str(engineargs.version_dir(Path(settings.model_repository) / settings.model) / engineargs.ENGINE_FILE)
            source = f"{label} (the model's own)"
        engineargs.check(args, source=label)
    # what the engine runs with (vLLM's values filled in; no gpu_memory_utilization where the KV cache is
    # set in bytes), as the audit says it
    args = engineargs.in_effect(args, engineargs.engine_device(launcher=settings.server.launcher, gpu=settings.cost.gpu))
    params = space.parse_assignments(assignments)
    batcher, knobs = space.split(params)
    if batcher:
        key = next(iter(batcher))
        raise SettingsError(f"--set {key}: a field of Triton's dynamic batcher; {settings.model} is batched by vLLM: "
                            f"--set its engine knobs ({', '.join(space.ENGINE_NAMES)})")
    if knobs:
        args = space.apply_engine(args, knobs)
        source += " with " + ", ".join(f"{k}={v}" for k, v in knobs.items())
    return base, args, source


def check_generative_traffic(settings: StudySettings, base: ModelConfig, traffic: pd.DataFrame, *, args: dict) -> None:
    """Refuse, in one line, traffic a generative soak's replays would refuse: no token columns, a
    model that does not stream, a request longer than the engine's context."""
    from tuner.replay import plan_generate
    from tuner.trial.generate import check_context

    plan_generate({**json.loads(modelconfig.to_json(base)), "name": settings.model}, traffic)
    context = engineargs.context_tokens(args)
    if context is not None:
        check_context(traffic, context, model=settings.model)


def restart_windows(traffic: pd.DataFrame, *, minutes: float | None, day_hours: float | None = None,
                    recording: str = "the recording") -> tuple[QuietWindows | None, str]:
    """The recording's quietest stretch of `minutes` per day, and the line that says it. A day is
    `day_hours` of the recording (default 24 h, or the whole recording when it is shorter: the soak
    repeats it, so it is the cycle). `minutes` None is the default length, DEFAULT_RESTART_MINUTES:
    a `recording` too short for it gets no restart window (None, and the line says why) rather than a
    refusal of a flag the user never gave."""
    given = minutes is not None
    minutes = minutes if given else DEFAULT_RESTART_MINUTES
    if not (math.isfinite(minutes) and minutes > 0):
        raise SettingsError(f"--restart-minutes: must be a positive number, got {minutes!r}")
    if day_hours is not None and not (math.isfinite(day_hours) and day_hours > 0):
        raise SettingsError(f"--day-hours: must be a positive number, got {day_hours!r}")
    period = day_hours * 3600.0 if day_hours is not None else min(DAY_S, cycle_length(traffic))
    ts = traffic[TIMESTAMP].to_numpy(dtype=float)
    room = min(period, float(ts.max() - ts.min()))  # a window must fit in a day and in the recording
    length = minutes * 60.0
    if length > room:
        what = (f"a day of the recording is {period / 60:.3g} min" if room == period
                else f"{recording} spans {room / 60:.3g} min")
        if given:
            raise SettingsError(f"--restart-minutes {minutes:g}: the restart window must fit in a day of the "
                                f"recording, but {what}")
        return None, (f"none: {what}, shorter than the default {minutes:g}-min restart "
                      f"(--restart-minutes M below {room / 60:.3g} searches a shorter one)")
    quiet = quiet_windows(traffic, length_s=length, period_s=period, step_s=min(1.0, length / 10))
    return quiet, quiet_line(quiet)


def window_drain_s(settings: StudySettings, traffic: pd.DataFrame) -> float | None:
    """How long a generative window goes on after its traffic, at most while the SLA holds: a window
    ends when its last requests have streamed their output (the replay waits for them, with no
    timeout), about one request's life, here a mean request's at the token SLA's limits (`e2e_ms`, else
    `ttft_ms` + the recording's mean output tokens x `tpot_ms`). None when the SLA bounds neither."""
    sla = settings.sla
    if sla.e2e_ms is not None:
        return sla.e2e_ms / 1000.0
    if sla.ttft_ms is None or sla.tpot_ms is None or OUTPUT_TOKENS not in traffic.columns:
        return None
    tokens = float(pd.to_numeric(traffic[OUTPUT_TOKENS], errors="coerce").mean())
    return (sla.ttft_ms + max(tokens - 1.0, 0.0) * sla.tpot_ms) / 1000.0 if math.isfinite(tokens) else None
