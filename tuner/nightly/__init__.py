"""The nightly retuning job: `tuner nightly NIGHTLY.yaml`.

    settings  NIGHTLY.yaml -> NightlySettings (load_nightly)
    deployed  production's configuration: a config.pbtxt, or a vLLM-served model's model.json (its
              engine knobs, scored in output tokens per dollar); the proposal and its diff
    intake    tonight's traffic: the newest N hours of a file or directory
    drift     tonight's traffic against the previous run's (rate, burstiness, sizes)
    rule      the decision rule over the A/B confirmation replays (pure), with tuner.errors' exit codes
    lock      one run at a time
    rundir    the dated run directory, written to a staging dir and renamed
    history   the append-only history.jsonl and its table
    summary   the Markdown summary
    job       one night in order (run_night), over an Engine
    engine    the real Engine: a Triton server, replay and a warm-started Optuna study
"""

from tuner.nightly.history import format_history, read_history
from tuner.nightly.job import Engine, NightResult, SearchResult, check_history_output, run_night
from tuner.nightly.rule import ArmResult, Decision, decide
from tuner.nightly.settings import NightlySettings, load_nightly

__all__ = [
    "Decision",
    "Engine",
    "NightResult",
    "NightlySettings",
    "ArmResult",
    "SearchResult",
    "check_history_output",
    "decide",
    "format_history",
    "load_nightly",
    "read_history",
    "run_night",
]
