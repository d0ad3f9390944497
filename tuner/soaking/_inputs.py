"""What a soak starts from: the configuration to soak, and the recording's quiet windows."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from tuner import modelconfig, space
from tuner.errors import SettingsError
from tuner.evaluate import base_config
from tuner.modelconfig import ModelConfig
from tuner.settings import StudySettings
from tuner.soak import DAY_S, QuietWindows, quiet_windows
from tuner.soaking._plan import cycle_length

RECOMMENDED = Path("recommended") / "config.pbtxt"


def soak_config(settings: StudySettings, output: str | Path, assignments: Iterable[str] = (), *,
                config_path: str | Path | None = None) -> tuple[ModelConfig, str]:
    """The configuration to soak and where it came from: `config_path` if given, else the study's
    recommendation (`OUTPUT/recommended/config.pbtxt`) if there is one, else the model's own
    config.pbtxt; with the `--set` assignments applied."""
    if config_path is not None:
        path = Path(config_path)
        if not path.is_file():
            raise SettingsError(f"--config {path}: no such file")
        config, source = modelconfig.load(path), str(path)
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


def restart_windows(traffic: pd.DataFrame, *, minutes: float, day_hours: float | None = None) -> QuietWindows:
    """The recording's quietest stretch of `minutes` per day. A day is `day_hours` of the recording
    (default 24 h, or the whole recording when it is shorter: the soak repeats it, so it is the cycle)."""
    if not (math.isfinite(minutes) and minutes > 0):
        raise SettingsError(f"--restart-minutes: must be a positive number, got {minutes!r}")
    if day_hours is not None and not (math.isfinite(day_hours) and day_hours > 0):
        raise SettingsError(f"--day-hours: must be a positive number, got {day_hours!r}")
    period = day_hours * 3600.0 if day_hours is not None else min(DAY_S, cycle_length(traffic))
    length = minutes * 60.0
    if length > period:
        raise SettingsError(f"--restart-minutes: the restart window must fit in a day of the recording, but "
                            f"got {minutes:g} min against a day of {period / 60:g} min")
    return quiet_windows(traffic, length_s=length, period_s=period, step_s=min(1.0, length / 10))
