"""The trial loop: Optuna's `study.optimize` with the study's sampler, one objective, and the rules
around it, readable top to bottom in `run_trials`:

- each trial's configuration is drawn by `tuner.space.suggest`, measured by the injected `Evaluate`,
  and recorded (`tuner.trial.to_attrs`); its SLA violation at the recorded load is its constraint;
- a trial whose measurement the load generator could not keep on time (`unmeasured`), or whose server
  never reached steady state after the load (`unstable`), is FAIL with its reason (no score, not
  infeasible); a configuration the server refuses is FAIL; the study goes on. A setup
  failing several trials in a row (no server to talk to) stops it;
- the capacity search starts at the best capacity so far and is pruned once measurably below it (never
  the incumbent's: the baseline of every gain);
- a trial interrupted (Ctrl-C, SIGTERM) is FAIL and enqueued again when the study resumes (an
  interrupt is held back while Optuna creates or records a trial: `_interrupts`); a trial
  whose worker died (kill -9, a host lost) is found by Optuna's heartbeat after the grace period and
  enqueued again by `RetryHeartbeatStaleTrialCallback`, so the remaining workers measure it;
- the loop ends when the study holds `n_trials` trials (all workers together), the grid is used up,
  or the timeout passes; a worker then waits for trials still running elsewhere, so that a stale one
  is not left behind;
- every trial records where it was measured: host, process and GPU type (`_hosts.Host`). In a study
  open to several GPU types, each type's incumbent is measured by the host that claimed it, outside
  the queue (`add_incumbent`), since any host may take a queued trial.
"""

from __future__ import annotations

import importlib.util
import socket
import time
import warnings
from collections.abc import Callable

import optuna
from optuna.trial import TrialState

from tuner import space
from tuner.errors import ConfigError, ServerSetupError, SettingsError, TunerError
from tuner.localhost import pid_alive
from tuner.search._hosts import Host, this_host
from tuner.search._interrupts import InterruptGuard
from tuner.search._results import DUPLICATE, INTERRUPTED, best_trial
from tuner.search._store import beat_now, fail_dead_local_trials, open_storage
from tuner.search._urls import is_journal
from tuner.settings import SearchSettings, StudySettings
from tuner.trial import NO_VERDICT, Evaluate, Hints, TrialRecord, to_attrs

OnTrial = Callable[[optuna.trial.FrozenTrial], None]

MAX_FAILURES_IN_A_ROW = 3
RETRY_KEEPS = ("incumbent", "simulated_rank")  # what an interrupted trial's retry keeps of its attributes


class _TrialFailed(Exception):
    """A trial that ends FAIL while the study goes on (its reason is in its user attributes)."""


def make_sampler(search: SearchSettings) -> optuna.samplers.BaseSampler:
    """The study's sampler (`search.sampler`), seeded."""
    seed = search.seed
    if search.sampler == "tpe":
        # few startup trials: the incumbent plus a handful of random ones, then TPE
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(5, max(2, search.trials // 4)))
    if search.sampler == "gp":
        if importlib.util.find_spec("torch") is None:  # Optuna's GP sampler is built on PyTorch
            raise SettingsError("search.sampler: gp needs PyTorch, which is not installed "
                                "(pip install torch), or choose tpe, random or grid")
        return _InRangeGPSampler(seed=seed, n_startup_trials=min(5, max(2, search.trials // 4)))
    if search.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if search.sampler == "grid":
        return _GridSampler(space.grid(search), seed=seed)
    raise SettingsError(f"search.sampler: unknown sampler {search.sampler!r}")


class _InRangeGPSampler(optuna.samplers.GPSampler):
    """Optuna's GP sampler, fitted on the trials whose values lie in their distributions (in their
    ranges, on their steps). The incumbent is enqueued with the model's own values, which may lie
    outside the search (max_batch_size 64 above a range of 4..32): the GP places it outside the box it
    searches, and once it is the best trial the acquisition search starts from it and fails an
    assertion (Optuna 5.1, optim_mixed._discrete_line_search). Optuna has no public way to hide trials
    from a sampler: where the study holds such a trial, the GP samples on an in-memory copy of the others."""

    def sample_relative(self, study: optuna.Study, trial: optuna.trial.FrozenTrial,
                        search_space: dict) -> dict:
        inside = optuna.create_study(directions=study.directions, sampler=optuna.samplers.RandomSampler())
        left_out = False
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING)):
            if t.number == trial.number:
                continue
            try:
                inside.add_trial(t)  # Optuna's own check refuses a value outside its distribution
            except ValueError:
                left_out = True
        if not left_out:
            return super().sample_relative(study, trial, search_space)
        # the trial being drawn, in the copy: the GP notes its draw there (for other workers' draws it
        # notes it on the study; here they see it once its values are suggested, a moment later)
        inside.ask()
        return super().sample_relative(inside, inside.get_trials(deepcopy=False)[-1], search_space)


class _GridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler, whose `after_trial` reads a grid id that an enqueued trial (the
    incumbent, a retried one) lacks (KeyError in Optuna 5.0): such a trial skips it, and the loop's
    own callback stops the study once the grid is used up."""

    def after_trial(self, study, trial, state, values) -> None:
        if "grid_id" in trial.system_attrs:
            super().after_trial(study, trial, state, values)


def _hints(study: optuna.Study, settings: StudySettings, *, expected: float | None = None,
           incumbent: bool = False) -> Hints:
    """Start the capacity search around the `expected` capacity speed when there is one, else where
    the best configuration so far reached; prune against the best, except the `incumbent`."""
    best = best_trial(study)
    # the incumbent is the baseline every gain is measured against: its search runs to its bracket,
    # whichever trials came first (a resumed study measures it again after the others, or another worker)
    beat = (best.user_attrs.get("capacity_rps") or None) if (
        best and settings.scoring == "capacity" and not incumbent) else None
    if expected:
        return Hints.around(expected, settings.search.capacity.tolerance, beat_rps=beat)
    if best is None:
        return Hints()
    return Hints(start_speed=best.user_attrs.get("capacity_speed") or None, beat_rps=beat)


def spent(study: optuna.Study) -> int:
    """Trials that count against the budget, all workers together: every trial begun, except those
    failed and enqueued again (an interruption, a dead worker: their retry counts instead), those
    interrupted before a configuration was drawn, and the duplicates a grid study skipped."""
    return len(_counted(study))


def trials_to_run(search: SearchSettings, trials: int, *, incumbent: space.Params | None) -> int:
    """The trials a run of `trials` counts (`spent`) when it has run them all: a grid study ends once
    its grid is used up, at its points and the incumbent, which is one of them where its values are
    (that point is then a duplicate, not measured again: not counted). In a study open to several GPU
    types each type's incumbent is measured outside the grid (`add_incumbent`): one counted here."""
    if search.sampler != "grid":
        return trials
    on_grid = (incumbent is not None and not search.mixed_gpus
               and all(incumbent.get(name) in values for name, values in space.grid(search).items()))
    return min(trials, space.grid_size(search) + (0 if on_grid else 1))


def timed_out(study: optuna.Study, planned: int, *, timeout_s: float | None, started: float) -> bool:
    """Whether the time limit stopped a run begun at `started` (`time.monotonic()`): fewer trials
    counted than `planned` (`trials_to_run`: a used-up grid is no early stop), with the limit passed."""
    return (timeout_s is not None and spent(study) < planned
            and time.monotonic() - started >= timeout_s)


def spent_done(study: optuna.Study) -> int:
    """The trials of `spent` that finished (complete, pruned or failed): what a progress bar of the
    budget shows done (a trial interrupted and measured again counts once, when its retry ends)."""
    return sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL) for t in _counted(study))


def superseded(trials: list[optuna.trial.FrozenTrial]) -> set[int]:
    """The numbers of the trials measured again by a later trial (an interrupted trial's retry, a dead
    worker's, a simulated pick the server contradicted): the later trial stands for the configuration."""
    numbers = {t.user_attrs["retry_of"] for t in trials if "retry_of" in t.user_attrs}
    with warnings.catch_warnings():  # marked experimental in Optuna
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        numbers |= {optuna.storages.RetryHeartbeatStaleTrialCallback.retried_trial_number(t) for t in trials}
    return numbers - {None}


def _counted(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    trials = study.get_trials(deepcopy=False)
    retried = superseded(trials)
    return [t for t in trials if t.state != TrialState.WAITING and t.number not in retried
            and t.user_attrs.get("error_kind") != DUPLICATE
            and not (t.user_attrs.get("error_kind") == INTERRUPTED and not drawn(t))]


def requeue_interrupted(study: optuna.Study) -> list[int]:
    """Enqueue once more every trial an interruption failed (and, in a journal file, which has no
    heartbeats, the RUNNING trials of this host's dead processes). Returns their numbers."""
    dead = []
    if _is_journal_study(study):
        storage = open_storage(study.user_attrs["storage"])
        dead = fail_dead_local_trials(study, storage, socket.gethostname(), alive=pid_alive)
    trials = study.get_trials(deepcopy=False)
    retried = superseded(trials)
    again = []
    for t in trials:
        params = drawn(t)
        if t.state != TrialState.FAIL or t.number in retried or not params:
            continue
        if t.user_attrs.get("error_kind") != INTERRUPTED and t.number not in dead:
            continue
        # the retry is what the trial was: the incumbent, a simulated pick (`search.strategy: model` counts them)
        kept = {k: t.user_attrs[k] for k in RETRY_KEEPS if k in t.user_attrs}
        study.enqueue_trial(params, user_attrs={"retry_of": t.number, **kept})
        again.append(t.number)
    return again


def drawn(trial: optuna.trial.FrozenTrial) -> dict:
    """The configuration a trial measured or was to measure: its parameters, or those it was enqueued
    with (the incumbent, a retry) when it was interrupted before asking for them. Empty for a trial
    interrupted before the sampler drew anything: it measured nothing, and there is nothing to retry."""
    return trial.params or dict(trial.system_attrs.get("fixed_params") or {})


def _is_journal_study(study: optuna.Study) -> bool:
    """Whether the study's storage is a journal file (an earlier tuner's), not an Optuna URL."""
    return is_journal(str(study.user_attrs.get("storage") or "://"))


def add_incumbent(study: optuna.Study, settings: StudySettings, record: TrialRecord, *, host: Host) -> None:
    """Record the incumbent measured on `host` (a mixed-GPU study: one per GPU type) as a finished
    trial, its configuration in its attributes (it may lie outside the search's ranges)."""
    measured = record.outcome not in NO_VERDICT
    trial = optuna.trial.create_trial(
        state=TrialState.COMPLETE if measured else TrialState.FAIL,
        value=record.value(settings.scoring) if measured else None,
        user_attrs={**to_attrs(record), "incumbent": True, **host.as_dict()})
    if measured:
        trial.set_constraint("sla", record.violation)
    study.add_trial(trial)


def run_trials(study: optuna.Study, settings: StudySettings, evaluate: Evaluate, *, n_trials: int,
               timeout_s: float | None = None, on_trial: OnTrial | None = None, host: Host | None = None,
               estimate: Callable[[dict], float | None] | None = None,
               note: Callable[[str], None] | None = None) -> int:
    """Run trials until the study holds `n_trials` (all workers together), the grid is used up, or
    `timeout_s` passes; then wait for trials other workers still run, said through `note` once per
    trial waited for. Returns the trials run here. `estimate`: a configuration's expected capacity
    speed (the simulation's), where known: its capacity search starts around it (`Hints.around`)
    instead of at the best trial's speed."""
    deadline = time.monotonic() + timeout_s if timeout_s else None
    host = host or this_host()
    ran = 0
    said: set[int] = set()  # the trials of other workers a wait was said for
    failures = 0  # setup failures in a row

    guard = InterruptGuard()

    def objective(trial: optuna.Trial) -> float:
        # drawn before an interrupt may land (one arriving in `ask` or here is held until `open`): a
        # trial begun has its configuration, so an interrupted one is retried as it was drawn. A grid
        # point's id is given in `ask`: a trial interrupted before its draw would hold the point, unmeasured
        params = draw(trial)
        try:
            with guard.open():
                return measured(trial, params)
        except KeyboardInterrupt:
            if "error_kind" not in trial.user_attrs:
                trial.set_user_attr("error", INTERRUPTED)
                trial.set_user_attr("error_kind", INTERRUPTED)
            raise

    def draw(trial: optuna.Trial) -> space.Params:
        beat_now(trial)  # before anything is drawn: a worker killed from here on leaves a trial found stale
        for key, value in host.as_dict().items():
            trial.set_user_attr(key, value)
        with warnings.catch_warnings():  # an incumbent outside the ranges: tuner says so itself
            warnings.filterwarnings("ignore", message="Fixed parameter")
            return space.suggest(trial, settings.search)

    def measured(trial: optuna.Trial, params: space.Params) -> float:
        nonlocal failures, ran
        twin = _twin(study, trial.number, trial.params) if isinstance(study.sampler, _GridSampler) else None
        if twin is not None:  # two hosts drew one grid point at once: the earlier trial measures it
            trial.set_user_attr("error", f"trial {twin} measures this configuration")
            trial.set_user_attr("error_kind", DUPLICATE)
            raise _TrialFailed(DUPLICATE)
        try:
            record = evaluate(params, _hints(study, settings, expected=estimate(params) if estimate else None,
                                             incumbent=bool(trial.user_attrs.get("incumbent"))))
        except TunerError as exc:
            trial.set_user_attr("error", str(exc)[:500])
            trial.set_user_attr("error_kind", "config" if isinstance(exc, (ConfigError, ServerSetupError))
                                else type(exc).__name__)
            failures += 1
            if failures >= MAX_FAILURES_IN_A_ROW:
                raise  # the setup's fault, not the configurations': stop
            raise _TrialFailed(str(exc)) from exc
        failures = 0
        ran += 1
        for key, value in to_attrs(record).items():
            trial.set_user_attr(key, value)
        if record.outcome in NO_VERDICT:  # unmeasured or unstable: no score, no constraint, the study goes on
            raise _TrialFailed(record.note)
        trial.set_constraint("sla", record.violation)
        if record.pruned:
            raise optuna.TrialPruned()
        return record.value(settings.scoring)

    def stop_at_budget(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        with guard.open():
            if on_trial is not None:
                on_trial(trial)
        if spent(study) >= n_trials or _grid_used_up(study, settings):
            study.stop()
        # the time limit, as Optuna's `timeout` means it (checked after each trial), on this module's clock
        if deadline is not None and time.monotonic() >= deadline:
            study.stop()

    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # a failed trial is said by tuner, in one line
    try:
        with guard, warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            while True:
                waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
                if waiting or (spent(study) < n_trials and not _grid_used_up(study, settings)):
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        break
                    study.optimize(objective, catch=(_TrialFailed,), callbacks=[stop_at_budget])
                optuna.storages.fail_stale_trials(study)  # a dead worker's trial: failed, enqueued again
                if study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
                    continue
                running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                if not running or _is_journal_study(study):
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    break
                if note is not None:
                    _say_waiting(running, said, note=note, grace_s=settings.search.grace_period_s)
                with guard.open():
                    time.sleep(min(settings.search.heartbeat_s, 5))  # another worker's trial: alive or stale?
    finally:
        optuna.logging.set_verbosity(verbosity)
    return ran


def _say_waiting(running: list[optuna.trial.FrozenTrial], said: set[int], *, note: Callable[[str], None],
                 grace_s: float) -> None:
    """Say, once each, the trials another worker still measures that this one waits for (a wait can last
    up to the grace period, a dead host's trial: without a word it looks like a hang)."""
    new = [t for t in running if t.number not in said]
    if not new:
        return
    said.update(t.number for t in new)
    who = "; ".join(f"trial {t.number} by {t.user_attrs.get('host', 'another host')} (pid {t.user_attrs.get('pid', '?')}"
                    f"{', ' + t.user_attrs['gpu'] if t.user_attrs.get('gpu') else ''})" for t in new)
    note(f"waiting for {who}: every trial ends before the re-measurement (a host that stopped is failed "
         f"{grace_s:g} s after its last heartbeat, search.grace_period_s)")


def _grid_used_up(study: optuna.Study, settings: StudySettings) -> bool:
    """Every grid point begun: measured, or being measured (by any worker, on any host). Optuna's own
    test waits for the running ones, and meanwhile a free worker would draw a running point again."""
    if not isinstance(study.sampler, optuna.samplers.GridSampler):
        return False
    begun = {t.system_attrs["grid_id"] for t in study.get_trials(deepcopy=False)
             if t.state != TrialState.WAITING and "grid_id" in t.system_attrs}
    return len(begun) >= space.grid_size(settings.search)


def _twin(study: optuna.Study, number: int, params: dict) -> int | None:
    """A trial that measured these parameters, or an earlier one measuring them now (the earlier of
    two drawn at once keeps it, whichever looks first). A running trial's configuration is what it
    was enqueued with until it suggests it (`drawn`): a retry taken from the queue a moment before a
    grid draw of the same point has no parameters yet, and both measured it (CI: a resumed two-worker
    study measured its interrupted point twice)."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)):
        if t.number != number and drawn(t) == params and (t.state != TrialState.RUNNING or t.number < number):
            return t.number
    return None
