"""`search.strategy: model`, the one simulation-based strategy: rank the whole space in simulation,
measure only what it ranks best. `tuner tune` (`model_search`) and `tuner simulate` (`SpaceModel`) both
rank through here, so they rank the space the same way.

The model's execution time is profiled once (`tuner profile`, or a profile file the study names), Triton's
dynamic batcher is simulated on the recorded traffic for every configuration of the space
(`tuner.simulate`), and the real server measures the incumbent and the simulation's top
`search.model_top` configurations, as trials of the study (enqueued), with the same re-measurement as
any study: the recommendation is by measurement. The simulation's error on every measured point is
reported; when its median exceeds `search.model_error`, the simulation is not trusted to have found
the optimum, and the search goes on as a measured one (the study's sampler) for the rest of the trial
budget, with the simulation's next-ranked configurations enqueued first.

    check_simulatable(settings, base)                              UnmodelledError (exit 2) for a setting
                                                                   the simulation does not model
    model_space(settings, base=, traffic=, profile=) -> SpaceModel   the space, ready to simulate
        .rank() -> DataFrame                                       best first (the ranking)
        .against_incumbent(ranking) -> DataFrame                   the incumbent placed, the gain over it
    rank_space(...) -> DataFrame                                   both at once, as `tune` ranks
    met_sla_in_simulation(table) -> bool                           whether the best met the SLA
    model_search(study, settings, ranking, evaluate, ...) -> int   the measuring half (`tune`)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import pandas as pd
from optuna.trial import TrialState

from tuner import space
from tuner.search._loop import run_trials, spent
from tuner.settings import StudySettings
from tuner.simulate import CONFIG_KEYS, Profile, Simulator, batcher_config, check_modelled, study_space
from tuner.trial import is_feasible, record_of

__all__ = ["RANKING_TOLERANCE", "SpaceModel", "check_simulatable", "enqueue_ranked", "met_sla_in_simulation",
           "model_search", "model_space", "rank_space", "simulation_errors"]

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

    def incumbent_in_space(self) -> bool:
        """Whether the incumbent is one of the space's configurations (ranked with them)."""
        return self.incumbent in self.configs

    def against_incumbent(self, ranking: pd.DataFrame, *, tolerance: float | None = None) -> pd.DataFrame:
        """The ranking with the incumbent placed in it: simulated as rank 0 when it lies outside the
        space, tagged (`tag`: `incumbent`, `best`), and every row's gain over it (`vs_incumbent`,
        NaN when the incumbent misses the SLA)."""
        table = ranking.copy()
        if not self.incumbent_in_space():  # simulated for comparison, outside the space's ranking
            extra = self.simulator.rank([self.incumbent], tolerance=tolerance, **self.defaults)
            extra["rank"] = 0
            table = pd.concat([table, extra], ignore_index=True)
        config = batcher_config(self.incumbent, **self.defaults)
        mask = pd.Series(True, index=table.index)
        for knob in space.KNOBS:  # the incumbent's row: every knob as the simulation writes it
            value = getattr(config, knob.name)
            mask &= table[knob.name] == (space.sizes_text(value) if knob.sizes else value)
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


def enqueue_ranked(study: optuna.Study, ranking: pd.DataFrame, settings: StudySettings, *, count: int) -> list[dict]:
    """Enqueue the `count` best simulated configurations the study has not measured or queued yet
    (only those that met the SLA in simulation); returns them."""
    if count <= 0:
        return []
    known = {tuple(sorted(t.params.items())) for t in study.get_trials(deepcopy=False)}
    out = []
    for _, row in ranking[ranking["value"] > 0].iterrows():
        params = _params(row, settings)
        key = tuple(sorted(params.items()))
        if key in known:
            continue
        known.add(key)
        study.enqueue_trial(params, user_attrs={"simulated_rank": int(row["rank"])})
        out.append(params)
        if len(out) == count:
            break
    return out


def simulation_errors(study: optuna.Study, ranking: pd.DataFrame, settings: StudySettings) -> pd.DataFrame:
    """Simulated against measured for every measured trial the simulation ranked: capacity, the SLA
    percentile at the load, and the scoring's requests per dollar, with the relative errors."""
    pct = f"latency_p{settings.sla.percentile:g}_ms"
    tuned = [k.name for k in space.tuned(settings.search)]
    index = {tuple(_params(row, settings).values()): row for _, row in ranking.iterrows()}
    rows = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        record = record_of(t)
        key = tuple(t.params.get(k) for k in tuned)
        if record is None or key not in index:
            continue
        sim = index[key]
        measured_value = t.user_attrs.get(f"score_{settings.scoring}") if is_feasible(t) else 0.0
        rows.append({
            "trial": t.number, **dict(zip(tuned, key, strict=True)),
            "simulated_capacity_rps": float(sim["capacity_rps"]), "measured_capacity_rps": record.capacity_rps,
            "simulated_sla_ms": sim.get(pct), "measured_sla_ms":
                record.at_load.latency_ms.get(pct[len("latency_"):-len("_ms")]) if record.at_load else None,
            "simulated_value": float(sim["value"]), "measured_value": measured_value or 0.0,
        })
    table = pd.DataFrame(rows)
    if not table.empty:
        table["capacity_error"] = table["simulated_capacity_rps"] / table["measured_capacity_rps"].where(
            table["measured_capacity_rps"] > 0) - 1.0
        table["value_error"] = table["simulated_value"] / table["measured_value"].where(
            table["measured_value"] > 0) - 1.0
    return table


# --- the measuring half (`tune`) -------------------------------------------------------------------


def model_search(study: optuna.Study, settings: StudySettings, ranking: pd.DataFrame, *, evaluate, trials: int,
                 host, on_trial: Callable[[optuna.trial.FrozenTrial], None] | None = None,
                 note: Callable[[str], None] = lambda _text: None, timeout_s: float | None = None) -> int:
    """Measure the incumbent and the simulation's top configurations; if the simulation's error on
    them is above `search.model_error`, search on with the sampler (the next-ranked enqueued first).
    Returns the trials run; the errors are kept in the study's `model_search` attribute."""
    s = settings
    _enqueue_ranked_within(study, ranking, s, trials=trials)
    first = min(trials, spent(study) + len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,))))
    ran = run_trials(study, s, evaluate, n_trials=first, timeout_s=timeout_s, host=host, on_trial=on_trial)
    errors = simulation_errors(study, ranking, s)
    column = "capacity_error" if s.scoring == "capacity" else "value_error"
    median = float(errors[column].abs().median()) if not errors.empty and errors[column].notna().any() else None
    fallback = median is None or median > s.search.model_error
    study.set_user_attr("model_search", {
        "simulated": len(ranking), "measured": errors.to_dict("records"), "median_error": median,
        "threshold": s.search.model_error, "fallback": fallback})
    if median is not None:
        note(f"simulation error on the {len(errors)} measured configurations: median {median:.1%} "
             f"({'above' if fallback else 'within'} search.model_error {s.search.model_error:.0%})")
    if fallback and trials > spent(study):
        _enqueue_ranked_within(study, ranking, s, trials=trials)
        ran += run_trials(study, s, evaluate, n_trials=trials, timeout_s=timeout_s, host=host, on_trial=on_trial)
    return ran


def _enqueue_ranked_within(study: optuna.Study, ranking: pd.DataFrame, s: StudySettings, *, trials: int) -> None:
    """Enqueue the simulation's next `model_top`, no more than the budget has room for beyond the trials
    begun and those queued (a queued trial always runs: `run_trials` empties the queue)."""
    waiting = len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
    room = max(0, trials - spent(study) - waiting)
    enqueue_ranked(study, ranking, s, count=min(s.search.model_top, room))
