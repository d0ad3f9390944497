"""The nightly job's YAML (NIGHTLY.yaml) as validated, frozen dataclasses.

It names a study YAML (model, server, SLA, cost, search space) and says what changes each night: where
the newest traffic is, which config.pbtxt production runs (a model vLLM serves: which model.json), the
trial budget, and the confirmation.
Read by the study's loader (tuner.settings.read_settings), so unknown keys and wrong types are named the
same way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from tuner.errors import SettingsError
from tuner.nightly.deployed import study_for_model
from tuner.nightly.rule import RULES
from tuner.settings import StudySettings, read_settings, read_study, resolve_path, with_overrides


@dataclass(frozen=True)
class NightTraffic:
    """Tonight's traffic (`traffic:`): its file or directory, the hours kept, the glob of the files read."""

    # a traffic file (.csv/.parquet), a Triton trace (.json), or a directory of them
    path: str
    hours: float = 24.0          # keep the last N hours by timestamp
    pattern: str = "*"           # which files of a directory to read (glob)


@dataclass(frozen=True)
class NightSearch:
    """The nightly search (`search:`): its trial budget and optional time limit."""

    trials: int = 8              # trials after the enqueued ones (previous best, production)
    # seconds: no trial starts after this (the one running then finishes), as Optuna's timeout
    timeout_s: float | None = None


@dataclass(frozen=True)
class Confirm:
    """The confirmation (`confirm:`): the production/candidate pairs replayed, the margin and the rule."""

    pairs: int = 3               # production/candidate replays, alternated A/B/A/B...
    margin: float = 0.05         # the candidate must beat production's score (requests or tokens per dollar) by this
    rule: str = "all_replays"    # all_replays | every_pair (see tuner/nightly/rule.py)


@dataclass(frozen=True)
class Drift:
    """The drift check (`drift:`): the relative change above which a traffic figure has drifted."""

    threshold: float = 0.2       # a relative change above this is flagged as drift


@dataclass(frozen=True, kw_only=True)
class NightlySettings:
    """A nightly YAML: its study, tonight's traffic, production's config, the search, confirmation, drift."""

    study: str                    # the study YAML
    traffic: NightTraffic
    # dotted study keys replaced for the nightly run, e.g. {"server.launcher": "docker"}: each value as
    # YAML gave it (null, a number, a list, a mapping), read as the study file's own value would be
    study_overrides: dict[str, object] = field(default_factory=dict)
    output: str = "nightly"       # root: runs/<date>/, history.jsonl, the lock
    # production's config.pbtxt, or a vLLM-backend model's model.json (default: the study model's own)
    production: str | None = None
    search: NightSearch = field(default_factory=NightSearch)
    confirm: Confirm = field(default_factory=Confirm)
    drift: Drift = field(default_factory=Drift)
    source: str = ""


def load_nightly(path: str | Path) -> NightlySettings:
    """The nightly YAML at `path`, validated, its relative paths resolved against its folder."""
    return read_settings(path, NightlySettings, resolve=_resolve, check=check)


def read_study_for(settings: NightlySettings) -> StudySettings:
    """The study the nightly YAML names (its errors name the study file), with the overrides, held to its
    model's kind (a vLLM-backend model's: its engine knobs, its token SLA)."""
    study = read_study(settings.study)
    if settings.study_overrides:
        try:
            study = with_overrides(study, settings.study_overrides)
        except SettingsError as exc:
            raise SettingsError(f"{settings.source}: study_overrides: {exc}") from None
    return study_for_model(study)


def production_config_path(settings: NightlySettings, study: StudySettings) -> Path:
    """Production's config.pbtxt: the nightly YAML's `production`, else the study model's own (a
    vLLM-backend model's `production` may name its model.json: the study model's config.pbtxt then)."""
    if settings.production and not settings.production.lower().endswith(".json"):
        return Path(settings.production)
    return Path(study.model_repository) / study.model / "config.pbtxt"


def _resolve(s: NightlySettings, base: Path, source: str) -> NightlySettings:
    def resolve(key: str, value: str | None) -> str | None:
        return resolve_path(value, base, key=key, source=source)

    return dataclasses.replace(
        s,
        study=resolve("study", s.study),
        output=resolve("output", s.output),
        production=resolve("production", s.production),
        traffic=dataclasses.replace(s.traffic, path=resolve("traffic.path", s.traffic.path)),
    )


def check(s: NightlySettings, source: str) -> None:
    """Raise SettingsError for a value a night cannot run with (paths, budgets, the confirmation)."""
    if not s.study:
        raise SettingsError(f"{source}: study: must name a study YAML")
    if not s.traffic.path:
        raise SettingsError(f"{source}: traffic.path: must name a file or directory")
    for key, value in (("traffic.hours", s.traffic.hours), ("search.trials", s.search.trials),
                       ("search.timeout_s", s.search.timeout_s), ("drift.threshold", s.drift.threshold)):
        if value is not None and value <= 0:
            raise SettingsError(f"{source}: {key}: must be > 0, got {value!r}")
    if s.confirm.pairs < 3:
        raise SettingsError(f"{source}: confirm.pairs: must be >= 3, got {s.confirm.pairs}")
    if s.confirm.margin < 0:
        raise SettingsError(f"{source}: confirm.margin: must be >= 0, got {s.confirm.margin}")
    if s.confirm.rule not in RULES:
        raise SettingsError(f"{source}: confirm.rule: must be one of {', '.join(RULES)}, "
                            f"got {s.confirm.rule!r}")
