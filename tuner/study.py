"""The study's inputs, read from its settings: the traffic it replays and the model's current config.

    study_traffic(settings)   the profile the study replays (the file, cut to the study's window)
    base_config(settings)     the model's config.pbtxt in the study's repository: the incumbent, and
                              the base every trial's configuration changes only the tuned fields of
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from tuner import modelconfig
from tuner.modelconfig import ModelConfig
from tuner.settings import StudySettings
from tuner.traffic import busiest_window, read_traffic, window

__all__ = ["base_config", "study_traffic"]


def study_traffic(settings: StudySettings) -> pd.DataFrame:
    """The profile the study replays: the file, cut to the study's window if it names one."""
    t = settings.traffic
    df = read_traffic(t.path)
    if t.busiest_s is not None:
        start, _ = busiest_window(df, t.busiest_s)
        df = window(df, start, t.busiest_s)
    elif t.start_s is not None or t.duration_s is not None:
        df = window(df, t.start_s, t.duration_s)
    return df


def base_config(settings: StudySettings) -> ModelConfig:
    """The model's current config.pbtxt in the study's repository (the incumbent)."""
    return modelconfig.load(Path(settings.model_repository) / settings.model / "config.pbtxt")
