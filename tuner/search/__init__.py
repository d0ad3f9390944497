"""The Optuna study: its storage, the trial loop, the worker processes, the hosts sharing it, and
what it found.

    open_study / storage_url / check_storage / open_storage / load_study   _store: where a study lives
    check_resume                                                          ... and whether a run resumes it
    run_trials / make_sampler / spent / spent_done / add_incumbent   _loop: Optuna's optimize, with heartbeats
    trials_to_run / timed_out                                ... how many trials a run counts; its time limit
    run_workers                                              _workers: processes on this machine
    Host / exclusive / claim_finish / claim_incumbent        _hosts: several hosts on one study
    best_trial / top_trials / incumbent_trial / counts / tally   _results: what the study found
    remeasure / Repeats / repeats_as_dict                    ... and its re-measurement
    recommend / met_sla                                      ... and what it recommends
    check_simulatable / model_space / rank_space / model_search   _model: `search.strategy: model`, the
        / enqueue_ranked / simulation_errors / met_sla_in_simulation   one simulation-based strategy (`tune`
        / diverse_top / same_region / relative_error                 and `tuner simulate` both rank through it;
        / expected_speeds                                       where its capacity searches start;
        / order_agreement / Order                               what to measure, how its error is judged)

The evaluation is injected: `evaluate(params, hints) -> TrialRecord` (`tuner.trial.run` for the real
one, which drives a Triton server and a Locust replay).
"""

from tuner.search._hosts import Host, check_gpu, claim_finish, claim_incumbent, exclusive, this_host
from tuner.search._loop import (
    Evaluate,
    add_incumbent,
    make_sampler,
    requeue_interrupted,
    run_trials,
    spent,
    spent_done,
    timed_out,
    trials_to_run,
)
from tuner.search._model import (
    Order,
    SpaceModel,
    check_simulatable,
    describe_model_search,
    diverse_top,
    enqueue_ranked,
    expected_speeds,
    met_sla_in_simulation,
    model_search,
    model_space,
    order_agreement,
    rank_space,
    relative_error,
    same_region,
    simulation_errors,
)
from tuner.search._results import (
    Repeats,
    best_trial,
    config_of,
    counts,
    feasible_trials,
    finished_count,
    incumbent_trial,
    met_sla,
    recommend,
    remeasure,
    repeats_as_dict,
    tally,
    top_trials,
)
from tuner.search._store import (
    DEFAULT_STORAGE_FILE,
    JOURNAL_FILE,
    check_resume,
    check_storage,
    load_study,
    open_storage,
    open_study,
    storage_url,
)
from tuner.search._urls import is_journal, safe_url, without_password
from tuner.search._workers import OpenEvaluation, run_workers

__all__ = [
    "Order", "SpaceModel", "check_simulatable", "diverse_top", "enqueue_ranked", "expected_speeds",
    "describe_model_search", "met_sla_in_simulation", "model_search", "model_space", "order_agreement", "rank_space",
    "relative_error", "same_region", "simulation_errors",
    "DEFAULT_STORAGE_FILE", "JOURNAL_FILE", "Evaluate", "Host", "OpenEvaluation", "Repeats", "add_incumbent",
    "best_trial", "check_gpu", "check_resume", "check_storage", "claim_finish", "claim_incumbent", "config_of", "counts", "exclusive",
    "feasible_trials", "finished_count", "incumbent_trial", "is_journal", "load_study", "make_sampler",
    "met_sla", "open_storage", "open_study", "recommend", "remeasure", "repeats_as_dict", "requeue_interrupted",
    "run_trials", "run_workers", "safe_url", "spent", "spent_done", "storage_url", "tally", "this_host", "timed_out",
    "top_trials", "trials_to_run",
    "without_password",
]
