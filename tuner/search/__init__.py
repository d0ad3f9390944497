"""The Optuna study: its storage, the trial loop, the worker processes, and what it found.

    open_study / storage_url / open_storage / load_study     _storage: where a study lives
    run_trials / make_sampler / hints / spent                _loop: Optuna's optimize, with heartbeats
    run_workers                                              _workers: processes on this machine
    best_trial / top_trials / incumbent_trial / counts       _results: what the study found
    remeasure / recommend / Repeats / repeats_as_dict        ... and its re-measurement

The evaluation is injected: `evaluate(params, hints) -> TrialRecord` (`tuner.evaluate` for the real
one, which drives a Triton server and a Locust replay).
"""

from tuner.search._loop import (
    Evaluate,
    hints,
    make_sampler,
    requeue_interrupted,
    run_trials,
    spent,
)
from tuner.search._results import (
    Repeats,
    best_trial,
    config_of,
    counts,
    feasible_trials,
    finished_count,
    incumbent_trial,
    recommend,
    remeasure,
    repeats_as_dict,
    top_trials,
)
from tuner.search._store import (
    DEFAULT_STORAGE_FILE,
    JOURNAL_FILE,
    is_journal,
    load_study,
    open_storage,
    open_study,
    safe_url,
    storage_url,
)
from tuner.search._workers import OpenEvaluation, run_workers

__all__ = [
    "DEFAULT_STORAGE_FILE", "JOURNAL_FILE", "Evaluate", "OpenEvaluation", "Repeats", "best_trial", "config_of", "counts", "feasible_trials",
    "finished_count", "hints", "incumbent_trial", "is_journal", "load_study", "make_sampler", "open_storage",
    "open_study", "recommend", "remeasure", "repeats_as_dict", "requeue_interrupted", "run_trials",
    "run_workers", "safe_url", "spent", "storage_url", "top_trials",
]
