"""search.model_search: one time limit for the picks' run and the fallback's (no trial starts after it)."""

from __future__ import annotations

import optuna
import pandas as pd

from tuner.search import _model
from tuner.settings import StudySettings, TrafficSettings


def _search(monkeypatch, *, picks_take_s: float, timeout_s: float | None) -> list[float | None]:
    """model_search with the picks' run taking `picks_take_s` seconds of a fake clock and a simulation
    that is not trusted (nothing to compare: the fallback runs); the time limits each run was given."""
    clock = [1000.0]
    given: list[float | None] = []

    def run_trials(study, settings, evaluate, *, n_trials, timeout_s=None, **_):
        given.append(timeout_s)
        clock[0] += picks_take_s if len(given) == 1 else 0.0
        return 1

    monkeypatch.setattr(_model.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(_model, "run_trials", run_trials)
    monkeypatch.setattr(_model, "_enqueue_ranked_within", lambda *a, **k: [])
    monkeypatch.setattr(_model, "expected_speeds", lambda *a, **k: {})
    monkeypatch.setattr(_model, "simulation_errors", lambda *a, **k: pd.DataFrame())
    study = optuna.create_study(direction="maximize")
    settings = StudySettings(name="t", model_repository=".", model="m", traffic=TrafficSettings(path="t.csv"))
    _model.model_search(study, settings, pd.DataFrame(), evaluate=None, trials=8, host=None,
                        timeout_s=timeout_s)
    assert study.user_attrs["model_search"]["fallback"]  # the case this is about: two runs
    return given


def test_the_fallback_gets_what_is_left_of_the_time_limit_not_a_new_one(monkeypatch):
    # each run started its own timeout_s clock: a 600-s limit could run 1,200 s
    assert _search(monkeypatch, picks_take_s=450.0, timeout_s=600.0) == [600.0, 150.0]


def test_no_fallback_trial_starts_after_the_time_limit(monkeypatch):
    assert _search(monkeypatch, picks_take_s=601.0, timeout_s=600.0) == [600.0]
    assert _search(monkeypatch, picks_take_s=601.0, timeout_s=None) == [None, None]  # no limit: both run
