"""`search.strategy: model`, the one simulation-based strategy: rank the whole space in simulation,
measure only what it ranks best. `tuner tune` (`model_search`) and `tuner simulate` (`SpaceModel`) both
rank through here, so they rank the space the same way.

The model's execution time is profiled once (`tuner profile`, or a profile file the study names), Triton's
dynamic batcher is simulated on the recorded traffic for every configuration of the space
(`tuner.simulate`), and the real server measures the incumbent and the simulation's top
`search.model_top` configurations, as trials of the study (enqueued), with the same re-measurement as
any study: the recommendation is by measurement. The simulation's error on every measured point is
reported; when its median exceeds `search.model_error`, or the measured order of two points contradicts
the simulated one by more than that, the simulation is not trusted to have found the optimum, and the
search goes on as a measured one (the study's sampler) for the rest of the trial budget, with the
simulation's next-ranked configurations enqueued first.

What is measured is diverse (`diverse_top`): the simulation's best first, then the best of each region
it has not measured yet among those it simulates within `search.model_error` of its best, not
near-copies of its best that would share its error.

    check_simulatable(settings, base)                              UnmodelledError (exit 2) for a setting
                                                                   the simulation does not model
    model_space(settings, base=, traffic=, profile=) -> SpaceModel   the space, ready to simulate
        .rank() -> DataFrame                                       best first (the ranking)
        .against_incumbent(ranking) -> DataFrame                   the incumbent placed, the gain over it
    rank_space(...) -> DataFrame                                   both at once, as `tune` ranks
    met_sla_in_simulation(table) -> bool                           whether the best met the SLA
    diverse_top(ranking, settings, count=, known=) -> [params]     what to measure: the best, then regions
    expected_speeds(ranking, settings) -> {params: speed}          where each measured capacity search starts
    relative_error(simulated, measured, upper=, pruned=) -> float  the error rule (infeasible = 100 %)
    order_agreement(simulated, low, high, tolerance=) -> Order     the measured order against the simulated
    model_search(study, settings, ranking, evaluate, ...) -> int   the measuring half (`tune`)
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import pandas as pd
from optuna.trial import TrialState

from tuner import space
from tuner.measurement import percentile_key
from tuner.search._loop import RETRY_KEEPS, drawn, run_trials, spent, superseded
from tuner.settings import StudySettings
from tuner.simulate import (
    CONFIG_KEYS,
    Profile,
    Simulator,
    batcher_config,
    check_modelled,
    config_row,
    study_space,
)
from tuner.trial import MEASURED, is_feasible, record_of

__all__ = ["RANKING_TOLERANCE", "Order", "SpaceModel", "check_simulatable", "diverse_top", "enqueue_ranked",
           "expected_speeds", "met_sla_in_simulation", "model_search", "model_space", "order_agreement", "rank_space",
           "relative_error", "same_region", "simulation_errors"]

# The capacity bisection's tolerance that orders the space. The study's own tolerance (5-15 %) is what
# a real measurement can afford; at it, configurations a few per cent apart end in the same bracket
# and tie, and the tie-break, not the simulation, picks which of them are measured (on
# examples/grid.yaml: (13-15, no delay) tied with the optimum (16, no delay) at 5 % and were measured
# instead; at 1 % the optimum ranked first or second for every profile). A simulated step costs
# milliseconds, so the order comes from a finer bisection; the figures beside it (capacity, scores)
# stay those of the study's tolerance, like for like with what the real server measures.
RANKING_TOLERANCE = 0.01


@dataclass(frozen=True)
class SpaceModel:
    """A study's space ready to simulate: its configurations (trial parameters), the values the study
    does not tune (the base config's), the simulator, and the incumbent's parameters."""

    settings: StudySettings
    configs: list[dict] = field(repr=False)
    defaults: dict
    simulator: Simulator = field(repr=False)
    incumbent: dict

    def values(self) -> dict[str, list]:
        """Each knob the space varies, with its values in order."""
        return {k: sorted({c[k] for c in self.configs}) for k in self.configs[0]} if self.configs else {}

    def rank(self, *, tolerance: float | None = None,
             on_config: Callable[[int, int], None] | None = None) -> pd.DataFrame:
        """Every configuration simulated (`Simulator.rank`, figures at `tolerance`, default the study's),
        best first in the order of a bisection to `RANKING_TOLERANCE` (its capacity in
        `ranking_capacity_rps`) where the figures' tolerance is coarser."""
        sim, defaults = self.simulator, self.defaults
        table = sim.rank(self.configs, tolerance=tolerance, on_config=on_config, **defaults)
        figures = tolerance if tolerance is not None else self.settings.search.capacity.tolerance
        if table.empty or figures <= RANKING_TOLERANCE:
            return table
        order = sim.rank(self.configs, tolerance=RANKING_TOLERANCE, **defaults)[[*CONFIG_KEYS, "capacity_rps"]]
        order = order.rename(columns={"capacity_rps": "ranking_capacity_rps"})
        ranked = order.merge(table.drop(columns="rank"), on=list(CONFIG_KEYS), how="left", validate="one_to_one")
        ranked.insert(0, "rank", range(1, len(ranked) + 1))
        return ranked[[*table.columns, "ranking_capacity_rps"]]

    def extrapolated(self) -> str | None:
        """A line when the space (or the incumbent) reaches batches of more rows than the profile timed,
        or the traffic has requests longer than it measured (`Simulator.unprofiled_lengths`): those
        executions' times are extrapolated, which the ranking does not show; None when the profile
        covers them."""
        timed = max(p.rows for p in self.simulator.profile.points)
        space_rows = max((c.get(space.MAX_BATCH_SIZE, 0) for c in self.configs), default=0)
        incumbent_rows = int(self.incumbent.get(space.MAX_BATCH_SIZE) or 0)
        beyond = [f"{what} {rows}" for what, rows in (("the space's largest max_batch_size", space_rows),
                                                      ("the incumbent's", incumbent_rows)) if rows > timed]
        rows = (f"the profile timed batches of up to {timed} rows; {' and '.join(beyond)}: executions above "
                f"{timed} rows are extrapolated from it (profile again with --max-batch-size to measure them)"
                if beyond else None)
        return "; ".join(line for line in (rows, self.simulator.unprofiled_lengths()) if line) or None

    def incumbent_defaults(self) -> dict:
        """The values the incumbent is simulated with: the base config's own, a preferred-size strategy
        the study fixes left out, as the server measures it (`space.apply` leaves the incumbent's config
        as it is)."""
        return {**self.defaults, "preferred": "none"}

    def incumbent_in_space(self) -> bool:
        """Whether the incumbent is one of the space's configurations (ranked with them, the same
        configuration: no fixed strategy makes the space's point another one)."""
        return self.incumbent in self.configs and self.incumbent_defaults() == self.defaults

    def against_incumbent(self, ranking: pd.DataFrame, *, tolerance: float | None = None) -> pd.DataFrame:
        """The ranking with the incumbent placed in it: simulated as rank 0 when it lies outside the
        space, tagged (`tag`: `incumbent`, `best`), and every row's gain over it (`vs_incumbent`,
        NaN when the incumbent misses the SLA)."""
        table = ranking.copy()
        if not self.incumbent_in_space():  # simulated for comparison, outside the space's ranking
            extra = self.simulator.rank([self.incumbent], tolerance=tolerance, **self.incumbent_defaults())
            extra["rank"] = 0
            table = pd.concat([table, extra], ignore_index=True)
        mask = pd.Series(True, index=table.index)
        if not self.incumbent_in_space():  # the incumbent's own row, not a point of the space like it
            mask &= table["rank"] == 0
        for name, value in config_row(batcher_config(self.incumbent, **self.incumbent_defaults()),
                                      self.incumbent).items():
            mask &= table[name] == value  # the incumbent's row, written as the ranking writes it
        value = float(table.loc[mask, "value"].iloc[0]) if mask.any() else 0.0
        table["tag"] = ["incumbent" if m else "" for m in mask]
        if table.loc[0, "value"] > 0:
            table.loc[0, "tag"] = "best, incumbent" if mask.iloc[0] else "best"
        table["vs_incumbent"] = table["value"] / value - 1.0 if value > 0 else math.nan
        return table


def check_simulatable(settings: StudySettings, base) -> None:
    """Refuse (UnmodelledError, exit 2) a base config that uses a setting the simulation does not
    model, before anything is profiled or measured; the instance count is the most the space tries."""
    tried = getattr(settings.search, space.INSTANCES)
    check_modelled(base, source=str(Path(settings.model_repository) / settings.model / "config.pbtxt"),
                   instances=tried.high if tried is not None else None)


def model_space(settings: StudySettings, *, base, traffic: pd.DataFrame, profile: Profile,
                every_batch_size: bool = True, price_per_hour: float | None = None) -> SpaceModel:
    """The study's space ready to simulate on `traffic` with `profile` (`check_simulatable` first).
    `every_batch_size`: each integer batch size the search can sample (else the grid's points);
    `price_per_hour`: a what-if price."""
    check_simulatable(settings, base)
    configs, defaults = study_space(settings, base, every_batch_size=every_batch_size)
    simulator = Simulator.for_study(settings, traffic, profile, price_per_hour=price_per_hour)
    return SpaceModel(settings, configs, defaults, simulator, space.from_config(base, settings.search))


def rank_space(settings: StudySettings, base, traffic: pd.DataFrame, *, profile: Profile,
               on_config: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """Every configuration of the study's space simulated, best first (`SpaceModel.rank`)."""
    return model_space(settings, base=base, traffic=traffic, profile=profile).rank(on_config=on_config)


def met_sla_in_simulation(table: pd.DataFrame) -> bool:
    """Whether the ranking's best configuration (of the space, not the incumbent outside it) met the SLA."""
    best = table.iloc[0]
    return bool(best["value"] > 0 and best["rank"] > 0)


def _params(row: pd.Series, settings: StudySettings) -> dict:
    return space.from_row(row, space.tuned(settings.search))


def same_region(a: dict, b: dict) -> bool:
    """Whether two configurations stand for one part of the space, as far as the simulation's error
    goes: the same instance count, preferred sizes and queue bound, and batch sizes less than a half
    octave apart (13 and 14, 16 and 22; not 16 and 23). The delay is left out: the delays of one batch
    size share the simulation's error about that size (the quick start's (16, 4-8 ms) measured alike).
    A distance, not fixed bins: bins put neighbours across their edge (13 | 14) in two regions."""
    for knob in space.KNOBS:
        if knob.name == space.QUEUE_DELAY or (knob.name not in a and knob.name not in b):
            continue
        x, y = a.get(knob.name), b.get(knob.name)
        if knob.name == space.MAX_BATCH_SIZE and x is not None and y is not None and x > 0 and y > 0:
            if abs(math.log2(x / y)) >= 0.5:
                return False
        elif x != y:
            return False
    return True


def diverse_top(ranking: pd.DataFrame, settings: StudySettings, *, count: int,
                known: Iterable[dict] = ()) -> list[dict]:
    """What to measure next, `count` configurations that met the SLA in simulation and are not `known`
    (measured or queued): the simulation's best first (when not known), then the best of each region
    (`same_region`) that neither the known nor the picks cover, among the configurations the simulation
    cannot tell from its best (simulated within `search.model_error`, the error it is allowed, of the
    best's value), then the rest in ranked order. So the measurements cover where the simulation may
    be wrong instead of spending the budget on near-copies of one point."""
    return [params for params, _ in _diverse_picks(ranking, settings, count=count, known=known)]


# why `_diverse_picks` chose a configuration, as the model strategy's note says it
_BEST, _REGION, _NEXT = "its best", "another region", "next in rank"


def _diverse_picks(ranking: pd.DataFrame, settings: StudySettings, *, count: int,
                   known: Iterable[dict] = ()) -> list[tuple[dict, str]]:
    """`diverse_top`'s picks, each with why it was chosen (`_BEST`, `_REGION` or `_NEXT`)."""
    if count <= 0:
        return []
    known = list(known)
    keys = {tuple(sorted(k.items())) for k in known}
    feasible = ranking[ranking["value"] > 0]
    if feasible.empty:
        return []
    rows = [_params(row, settings) for _, row in feasible.iterrows()]
    close = (feasible["value"] >= float(feasible["value"].iloc[0]) * (1.0 - settings.search.model_error)).tolist()
    fresh = [(p, c) for p, c in zip(rows, close, strict=True) if tuple(sorted(p.items())) not in keys]
    picks: list[tuple[dict, str]] = []
    if fresh and fresh[0][0] == rows[0]:  # the best is measured first, near-copy of the known or not
        picks.append((rows[0], _BEST))
    covered = [*known, rows[0]] if picks else list(known)
    for params, near_best in fresh:
        if len(picks) == count:
            return picks
        if near_best and not any(same_region(params, c) for c in covered):
            picks.append((params, _REGION))
            covered.append(params)
    chosen = [params for params, _ in picks]
    for params, _ in fresh:  # every region near the best covered: the ranking's order
        if len(picks) == count:
            break
        if params not in chosen:
            picks.append((params, _NEXT))
            chosen.append(params)
    return picks


def enqueue_ranked(study: optuna.Study, ranking: pd.DataFrame, settings: StudySettings, *, count: int) -> list[dict]:
    """Enqueue `count` simulated configurations the study has not measured or queued yet, chosen by
    `diverse_top` (only those that met the SLA in simulation), best first; returns them."""
    return [params for params, _ in _enqueue_picks(study, ranking, settings, count=count)]


def _enqueue_picks(study: optuna.Study, ranking: pd.DataFrame, settings: StudySettings, *, count: int
                   ) -> list[tuple[dict, str]]:
    """`enqueue_ranked`, each pick with why it was chosen (`_diverse_picks`)."""
    # queued trials too (their parameters not drawn yet): a resumed study still holds the picks it queued
    known = [params for t in study.get_trials(deepcopy=False) if (params := drawn(t))]
    ranks = {tuple(sorted(_params(row, settings).items())): int(row["rank"]) for _, row in ranking.iterrows()}
    picks = _diverse_picks(ranking, settings, count=count, known=known)
    for params, _ in picks:
        study.enqueue_trial(params, user_attrs={"simulated_rank": ranks[tuple(sorted(params.items()))]})
    return picks


def expected_speeds(ranking: pd.DataFrame, settings: StudySettings) -> dict[tuple, float]:
    """The replay speed at which each configuration that met the SLA in simulation stops meeting it,
    by its parameters (sorted items): the ranking's finest capacity (`ranking_capacity_rps`, else
    `capacity_rps`) as a speed."""
    out = {}
    fine = ranking["ranking_capacity_rps"] if "ranking_capacity_rps" in ranking else ranking["capacity_rps"]
    for (_, row), rps in zip(ranking.iterrows(), fine, strict=True):
        coarse, speed = row["capacity_rps"], row["capacity_speed"]
        if row["value"] > 0 and pd.notna(rps) and pd.notna(coarse) and pd.notna(speed) and coarse > 0 and speed > 0:
            out[tuple(sorted(_params(row, settings).items()))] = float(speed * rps / coarse)
    return out


def relative_error(simulated: float, measured: float, *, upper: float | None = None, pruned: bool = False) -> float:
    """The simulation's relative error on one point, by one rule for the strategy and the fidelity
    benchmark. Feasible in simulation but not on the server (`measured` 0): +100 %, not left out; the
    other way: -100 %. With `upper`, the measurement is a capacity bracket [measured, upper] (the last
    speed that met the SLA, the first that did not): 0 when the simulation falls inside it (the
    measurement cannot tell them apart), else the distance to the nearer edge. A pruned trial without a
    closed bracket is left out (NaN: say so); so is a point infeasible in both."""
    bracket = upper is not None and math.isfinite(upper) and measured > 0 and upper > measured
    if pruned and not bracket:
        return math.nan
    if bracket:
        if simulated < measured:
            return simulated / measured - 1.0
        return simulated / upper - 1.0 if simulated > upper else 0.0
    if measured > 0:
        return simulated / measured - 1.0
    return 1.0 if simulated > 0 else math.nan


@dataclass(frozen=True)
class Order:
    """The measured order of points against the simulated: Spearman's rho (NaN under 3 points or a
    constant column), the pairs compared, and those the server orders the other way by more than the
    tolerance (a pruned point counts by its bracket: only a bracket wholly on the wrong side)."""

    spearman: float
    pairs: int
    discordant: int

    def describe(self) -> str:
        """One line: the rank correlation and the pairs ordered the other way."""
        rho = "n/a" if math.isnan(self.spearman) else f"{self.spearman:.2f}"
        return f"Spearman {rho}, {self.discordant} of {self.pairs} pairs measured in the other order"


def order_agreement(simulated, low, high=None, *, tolerance: float = 0.0) -> Order:
    """Whether the server orders the points as the simulation does. `low`: each point's measured value
    (the lower edge for a pruned one), `high`: the upper edge (default `low`; inf for an open bracket).
    A pair the simulation orders a > b is discordant when b's lower edge beats a's upper edge by more
    than `tolerance` (relative). Spearman over `simulated` and `low`, ties averaged."""
    sim = [float(v) for v in simulated]
    lo = [float(v) for v in low]
    hi = lo if high is None else [float(v) if v is not None and not pd.isna(v) else math.inf for v in high]
    pairs = discordant = 0
    for i, j in itertools.combinations(range(len(sim)), 2):
        if sim[i] == sim[j]:
            continue
        a, b = (i, j) if sim[i] > sim[j] else (j, i)
        pairs += 1
        discordant += lo[b] > hi[a] * (1.0 + tolerance)
    s, m = pd.Series(sim), pd.Series(lo)
    rho = float(s.rank().corr(m.rank())) if len(sim) >= 3 and s.nunique() > 1 and m.nunique() > 1 else math.nan
    return Order(spearman=rho, pairs=pairs, discordant=discordant)


def simulation_errors(study: optuna.Study, ranking: pd.DataFrame, settings: StudySettings) -> pd.DataFrame:
    """Simulated against measured for every measured trial the simulation ranked: capacity, the SLA
    percentile at the load, and the scoring's requests per dollar, with the relative errors
    (`relative_error`: feasible in simulation, infeasible measured = +100 %; the simulation's capacity
    at its ranking's 1 % against the measured capacity bracket, pruned or complete). A trial with no
    verdict (unstable, unmeasured) is left out."""
    q = percentile_key(settings.sla.percentile)  # 100: max
    pct = f"latency_{q}_ms"
    tuned = [k.name for k in space.tuned(settings.search)]
    index = {tuple(_params(row, settings).values()): row for _, row in ranking.iterrows()}
    rows = []
    trials = study.get_trials(deepcopy=False)
    gone = superseded(trials)  # a configuration measured again: its retry stands
    for t in trials:
        if t.state not in (TrialState.COMPLETE, TrialState.PRUNED) or t.number in gone:
            continue
        record = record_of(t)
        key = tuple(t.params.get(k) for k in tuned)
        if record is None or key not in index or record.outcome != MEASURED:
            continue
        sim = index[key]
        pruned = t.state == TrialState.PRUNED
        score = t.user_attrs.get(f"score_{settings.scoring}")
        measured_value = (score or 0.0) if is_feasible(t) or (pruned and record.sla_met) else 0.0
        lower, upper = record.capacity_rps, record.capacity.upper_rps if record.capacity else None
        # the measured capacity is a bracket, at the study's tolerance: the simulation's estimate is its
        # finer one (the ranking's 1 % bisection), judged against the bracket, not against the bracket's
        # lower edge (that would charge the simulation with the measurement's own step, up to the tolerance)
        coarse = float(sim["capacity_rps"])
        fine = sim.get("ranking_capacity_rps")
        estimate = float(fine) if fine is not None and pd.notna(fine) else coarse
        capacity_scored = settings.scoring == "capacity"
        simulated_value = float(sim["value"]) * (estimate / coarse if capacity_scored and coarse > 0 else 1.0)
        # under capacity scoring the value follows the capacity, and so does its bracket
        value_upper = (measured_value * upper / lower if capacity_scored and upper and lower > 0
                       else None if pruned else measured_value)
        rows.append({
            "trial": t.number, **dict(zip(tuned, key, strict=True)), "pruned": pruned, "simulated_rank": int(sim["rank"]),
            "simulated_capacity_rps": estimate, "measured_capacity_rps": lower,
            "measured_capacity_upper_rps": upper,
            "simulated_sla_ms": sim.get(pct), "measured_sla_ms":
                record.at_load.latency_ms.get(q) if record.at_load else None,
            "simulated_value": simulated_value, "measured_value": float(measured_value),
            "measured_value_upper": value_upper,
        })
    table = pd.DataFrame(rows)
    if not table.empty:
        table["capacity_error"] = [
            relative_error(r.simulated_capacity_rps, r.measured_capacity_rps, upper=r.measured_capacity_upper_rps,
                           pruned=r.pruned) for r in table.itertuples()]
        table["value_error"] = [
            relative_error(r.simulated_value, r.measured_value, upper=r.measured_value_upper, pruned=r.pruned)
            for r in table.itertuples()]
    return table


# --- the measuring half (`tune`) -------------------------------------------------------------------


def model_search(study: optuna.Study, settings: StudySettings, ranking: pd.DataFrame, *, evaluate, trials: int,
                 host, on_trial: Callable[[optuna.trial.FrozenTrial], None] | None = None,
                 note: Callable[[str], None] = lambda _text: None, timeout_s: float | None = None,
                 on_plan: Callable[[int], None] = lambda _total: None) -> int:
    """Measure the incumbent and the simulation's top configurations (`diverse_top`); if the
    simulation's error on them is above `search.model_error`, or the server orders two of them the
    other way by more than that, search on with the sampler (the next simulated picks enqueued first).
    `on_plan(total)` is told the trials the study will hold before each of the two runs (the first: the
    picks; the fallback: `trials`). `timeout_s` holds for both runs together: no trial starts after it.
    Returns the trials run; the errors and the order are kept in the
    study's `model_search` attribute."""
    s = settings
    deadline = None if timeout_s is None else time.monotonic() + timeout_s  # one clock for both runs
    picks = _enqueue_ranked_within(study, ranking, s, trials=trials, upto=s.search.model_top)
    if picks:
        note("simulation's picks to measure: " + "; ".join(f"{space.describe(p)} ({why})" for p, why in picks))
    elif queued := [drawn(t) for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
                    if "simulated_rank" in t.user_attrs]:
        note("simulation's picks still to measure (queued by the run this one resumes): "
             + "; ".join(space.describe(p) for p in queued))
    first = min(trials, spent(study) + len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,))))
    speeds = expected_speeds(ranking, s)
    on_plan(first)
    # each capacity search starts around the simulated capacity: a right one is confirmed in two steps

    def estimate(params: dict) -> float | None:
        return speeds.get(tuple(sorted(params.items())))

    ran = run_trials(study, s, evaluate, n_trials=first, timeout_s=timeout_s, host=host, on_trial=on_trial,
                     estimate=estimate)
    errors = simulation_errors(study, ranking, s)
    verdict = _judge(errors, s)
    left = None if deadline is None else deadline - time.monotonic()
    room = trials > spent(study) and (left is None or left > 0)  # for a fallback: else nothing to decide
    if verdict["fallback"] and room and (again := _contradicted(study, errors)):
        # one failing replay would otherwise throw the simulation away for the rest of the budget, a
        # measured search (a host's stall fails a p99 as surely as a wrong profile does): its retry stands for it
        note("; ".join(space.describe(p) for p in again.values()) + ": met the SLA in simulation, not on the "
             "server at the recorded load: measured once more before the simulation is judged")
        for number, params in again.items():
            kept = {k: v for k, v in study.trials[number].user_attrs.items() if k in RETRY_KEEPS}
            study.enqueue_trial(params, user_attrs={"retry_of": number, **kept})
        ran += run_trials(study, s, evaluate, n_trials=first, timeout_s=left, host=host, on_trial=on_trial,
                          estimate=estimate)  # the originals no longer count (`spent`): the retries run
        errors = simulation_errors(study, ranking, s)
        verdict = _judge(errors, s)
    fallback = verdict["fallback"]
    study.set_user_attr("model_search", {"simulated": len(ranking), "measured": errors.to_dict("records"),
                                         "threshold": s.search.model_error, **verdict})
    if not errors.empty:
        note(_describe(verdict, len(errors), s.search.model_error))
    left = None if deadline is None else deadline - time.monotonic()
    if fallback and trials > spent(study) and (left is None or left > 0):
        # the simulation not trusted: no start from its capacities either
        _enqueue_ranked_within(study, ranking, s, trials=trials, upto=2 * s.search.model_top)
        on_plan(trials)
        ran += run_trials(study, s, evaluate, n_trials=trials, timeout_s=left, host=host, on_trial=on_trial)
    return ran


def _contradicted(study: optuna.Study, errors: pd.DataFrame) -> dict[int, dict]:
    """The measured configurations the simulation ranked feasible that failed the SLA on the server,
    each measured once only so far (a retry is not measured again): trial number -> configuration."""
    if errors.empty:
        return {}
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    rows = errors[(errors["measured_value"] <= 0) & (errors["simulated_value"] > 0)]
    return {int(n): drawn(trials[int(n)]) for n in rows["trial"] if "retry_of" not in trials[int(n)].user_attrs}


def _judge(errors: pd.DataFrame, s: StudySettings) -> dict:
    """Whether to trust the simulation: the median absolute error of the scoring's figure (capacity, or
    the requests per dollar) within `search.model_error`, and no pair of points measured in the other
    order by more than it. Figures for the study's `model_search` attribute."""
    column = "capacity_error" if s.scoring == "capacity" else "value_error"
    known = errors[column].dropna() if not errors.empty else pd.Series(dtype=float)
    median = float(known.abs().median()) if len(known) else None
    # the simulated order is the ranking's (its fine bisection), not the figures' (ties at the study's tolerance)
    order = (order_agreement(-errors["simulated_rank"], errors["measured_value"], errors["measured_value_upper"],
                             tolerance=s.search.model_error) if not errors.empty else Order(math.nan, 0, 0))
    infeasible = int(((errors["measured_value"] <= 0) & (errors["simulated_value"] > 0)).sum()) if len(errors) else 0
    return {"median_error": median, "compared": len(known), "left_out": len(errors) - len(known),
            "infeasible_measured": infeasible, "spearman": None if math.isnan(order.spearman) else order.spearman,
            "pairs": order.pairs, "discordant": order.discordant,
            "fallback": median is None or median > s.search.model_error or order.discordant > 0}


def describe_model_search(info: dict) -> str:
    """The strategy's verdict on its simulation, as the study's `model_search` attribute keeps it (the
    line the run printed; the report quotes it rather than judging again by other rules)."""
    return _describe(info, len(info.get("measured") or ()), float(info.get("threshold") or 0.0))


def _describe(verdict: dict, measured: int, threshold: float) -> str:
    median = verdict["median_error"]
    text = f"simulation error on the {measured} measured configurations: " + (
        f"median {median:.1%} ({'above' if median > threshold else 'within'} search.model_error {threshold:.0%})"
        if median is not None else "none to compare")
    if verdict["infeasible_measured"]:
        text += f"; {verdict['infeasible_measured']} feasible in simulation, not on the server (counted as 100 %)"
    if verdict["left_out"]:
        text += f"; {verdict['left_out']} left out (pruned, the bracket open, or infeasible in both)"
    rho = "n/a" if verdict["spearman"] is None else f"{verdict['spearman']:.2f}"
    return (text + f"; order: Spearman {rho}, {verdict['discordant']} of {verdict['pairs']} pairs measured in the "
            f"other order by more than {threshold:.0%}" + (" (the simulation's order is not trusted)"
                                                            if verdict["discordant"] else ""))


def _enqueue_ranked_within(study: optuna.Study, ranking: pd.DataFrame, s: StudySettings, *, trials: int,
                           upto: int) -> list[tuple[dict, str]]:
    """Enqueue the simulation's next picks (`diverse_top`) until the study holds `upto` of them, no more
    than the budget has room for beyond the trials begun and those queued (a queued trial always runs:
    `run_trials` empties the queue). The picks a resumed study holds (queued, measured, or interrupted
    and queued again) count: it measures what the run it resumes would have, not `model_top` more."""
    waiting = len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
    room = max(0, trials - spent(study) - waiting)
    return _enqueue_picks(study, ranking, s, count=min(upto - len(_picked(study)), room))


def _picked(study: optuna.Study) -> set[tuple]:
    """The simulation's picks the study holds, each configuration once (an interrupted pick's retry and
    a dead worker's keep its `simulated_rank`)."""
    return {tuple(sorted(drawn(t).items())) for t in study.get_trials(deepcopy=False)
            if "simulated_rank" in t.user_attrs}
