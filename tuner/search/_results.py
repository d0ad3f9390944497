"""What a study found: the best trials, the incumbent, the counts, and the re-measurement of the top
configurations (`Repeats`: one configuration measured again several times, interleaved with the
others, whose median decides the recommendation)."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from tuner import space
from tuner.settings import StudySettings
from tuner.trial import (
    NO_VERDICT,
    UNMEASURED,
    UNSTABLE,
    Evaluate,
    Hints,
    TrialRecord,
    is_feasible,
    record_of,
    to_attrs,
)


def feasible_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Every feasible trial (`tuner.trial.is_feasible`), best first."""
    done = [t for t in study.get_trials(deepcopy=False) if is_feasible(t)]
    return sorted(done, key=lambda t: t.value, reverse=True)


def best_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """The feasible trial with the highest score so far (None: none met the SLA)."""
    done = feasible_trials(study)
    return done[0] if done else None


def top_trials(study: optuna.Study, k: int) -> list[optuna.trial.FrozenTrial]:
    """The k best feasible trials with distinct configurations."""
    out, seen = [], set()
    for t in feasible_trials(study):
        key = tuple(sorted(t.params.items()))
        if key not in seen:
            seen.add(key)
            out.append(t)
        if len(out) == k:
            break
    return out


def incumbent_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """The measured trial of the model's own config (the last, if it was measured again)."""
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.user_attrs.get("incumbent")]
    return done[-1] if done else None


def config_of(trial: optuna.trial.FrozenTrial) -> space.Params:
    """The trial's configuration as measured (with the fields a strategy fixed), else its parameters."""
    record = record_of(trial)
    return dict(record.params) if record is not None and record.params else dict(trial.params)


def counts(study: optuna.Study) -> dict[str, int]:
    """Trials by what became of them."""
    return tally(study.get_trials(deepcopy=False))


# why a failed trial measured nothing of its configuration (its `error_kind`)
INTERRUPTED = "interrupted"  # Ctrl-C or SIGTERM: enqueued again when the study resumes
DUPLICATE = "duplicate"  # a grid point another trial measures or measured: not measured again


def tally(trials: Iterable[optuna.trial.FrozenTrial]) -> dict[str, int]:
    """Trials by what became of them: the one count of the summary and of each host's row."""
    trials = list(trials)
    states = [t.state for t in trials]
    unmeasured = sum(t.user_attrs.get("outcome") == UNMEASURED for t in trials)
    unstable = sum(t.user_attrs.get("outcome") == UNSTABLE for t in trials)
    # a grid point another trial measured (the incumbent's, or one two hosts drew at once): this trial
    # measured nothing (not a failure)
    duplicate = sum(t.state == TrialState.FAIL and t.user_attrs.get("error_kind") == DUPLICATE for t in trials)
    # stopped by Ctrl-C or SIGTERM, not by the configuration: measured again when the study resumes
    interrupted = sum(t.state == TrialState.FAIL and t.user_attrs.get("error_kind") == INTERRUPTED for t in trials)
    return {"total": len(trials), "complete": states.count(TrialState.COMPLETE),
            "feasible": sum(is_feasible(t) for t in trials), "unmeasured": unmeasured, "unstable": unstable,
            "failed": states.count(TrialState.FAIL) - unmeasured - unstable - duplicate - interrupted,
            "pruned": states.count(TrialState.PRUNED), "running": states.count(TrialState.RUNNING),
            "duplicate": duplicate, "interrupted": interrupted}


def finished_count(study: optuna.Study) -> int:
    """How many of the study's trials finished: complete, pruned or failed."""
    return sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
               for t in study.get_trials(deepcopy=False))


# --- re-measurement ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Repeats:
    """One configuration measured again `len(records)` times."""

    params: space.Params
    trial: int
    incumbent: bool
    records: tuple[TrialRecord, ...]
    scoring: str

    def values(self) -> list[float]:
        """Requests per dollar of each repeat under the study's scoring (0: missed the SLA)."""
        return [r.value(self.scoring) for r in self.measured]

    @property
    def measured(self) -> tuple[TrialRecord, ...]:
        """The repeats that say something (an unmeasured or unstable one does not)."""
        return tuple(r for r in self.records if r.outcome not in NO_VERDICT)

    @property
    def median(self) -> float:
        """The median requests per dollar of the measured repeats (0 when none was measured)."""
        values = self.values()
        return statistics.median(values) if values else 0.0

    @property
    def observed_spread(self) -> float:
        """(max - min) / median of the repeats' requests per dollar."""
        v = self.values()
        return (max(v) - min(v)) / self.median if v and self.median > 0 else math.inf

    @property
    def bracket_width(self) -> float | None:
        """How wide the capacity search's bracket was (upper / lower - 1, median over the repeats):
        a capacity is known no better than that, however alike the repeats came out."""
        return self.median_of(lambda r: r.capacity.width if r.capacity else None)

    @property
    def spread(self) -> float:
        """The uncertainty of the median: the repeats' spread, never less than the bracket's width
        under capacity scoring (repeated bisections land on the same points: their spread is 0)."""
        width = self.bracket_width if self.scoring == "capacity" else None
        return max(self.observed_spread, width or 0.0)

    def ranges(self) -> list[tuple[float, float] | None]:
        """Each measured repeat's own range of requests per dollar: from its score (under capacity scoring
        at its bracket's lower edge, the last passing speed) to its score at its own first failing speed
        (`TrialRecord.score_upper`; its score alone under another scoring or with an open bracket); None
        for a repeat that missed the SLA (`values` 0)."""
        return [(v, r.score_upper(self.scoring) or v) if v else None
                for r, v in zip(self.measured, self.values(), strict=True)]

    def median_of(self, pick: Callable[[TrialRecord], float | None]) -> float | None:
        """The median of what `pick` reads from each measured repeat (None when it reads nothing)."""
        values = [x for x in (pick(r) for r in self.measured) if x is not None]
        return statistics.median(values) if values else None


def remeasure(study: optuna.Study, evaluate: Evaluate, settings: StudySettings,
              *,
              progress: Callable[[], None] | None = None) -> list[Repeats]:
    """Measure the top configurations (and the incumbent) again, interleaved in mirrored rounds (A B C,
    C B A, A B C, ...), so that drift on the machine hits them alike: over each two rounds every
    configuration sits at the same mean position, which a linear drift cannot tell apart (A B C A B C
    would favour A). The configuration at a round's end starts the next one on the server as it is,
    without a reload or a warm-up (`tuner.trial.run`); the incumbent is placed there. Each run starts its
    capacity search at the lower edge of the trial's capacity bracket and probes its upper edge next: a
    bracket that still holds is confirmed in two steps (A/B at the edges, no bisection); one that moved
    is searched as usual."""
    candidates = top_trials(study, settings.search.top_k)
    if not candidates:  # nothing met the SLA: nothing to recommend, nothing to compare
        return []
    incumbent = incumbent_trial(study)
    if incumbent is not None and all(t.params != incumbent.params for t in candidates):
        candidates.append(incumbent)
    runs: dict[int, list[TrialRecord]] = {t.number: [] for t in candidates}
    for k in range(settings.search.remeasure_repeats):
        for t in candidates if k % 2 == 0 else candidates[::-1]:
            start = t.user_attrs.get("capacity_speed") or None
            upper = t.user_attrs.get("capacity_upper_speed") or None
            runs[t.number].append(evaluate(config_of(t), Hints(start_speed=start, upper_speed=upper)))
            if progress:
                progress()
    return [Repeats(config_of(t), t.number, incumbent is not None and t.params == incumbent.params,
                    tuple(runs[t.number]), settings.scoring) for t in candidates]


def met_sla(remeasured: dict) -> bool:
    """Whether a re-measured configuration (as `repeats_as_dict` stores it) met the SLA: in most of its
    measured repeats (a tie is not most: two repeats of which one missed fail it, as a step's repeats that
    straddle the limit do), and by its median requests per dollar."""
    measured = len(remeasured.get("values") or [])
    return 2 * remeasured.get("feasible_runs", 0) > measured and (remeasured.get("median") or 0) > 0


def recommend(remeasured: list[dict]) -> list[dict]:
    """The recommendation rule: the re-measured configurations (as `repeats_as_dict` stores them, what
    `tuner export` reads back) that met the SLA, best first by median requests per dollar (a tie with
    the incumbent goes to the incumbent: a change that gains nothing is not made; other ties keep the
    re-measurement's order); the first is the recommendation, none when none met the SLA."""
    return sorted((r for r in remeasured if met_sla(r)), key=lambda r: (r["median"], bool(r.get("incumbent"))),
                  reverse=True)


# figures stored as floats that count whole things: a busiest second's requests (at the load's speed and
# at the capacity's), and the monthly cost of a whole number of servers
_COUNTED = ("peak_rps", "capacity_peak_rps", "monthly_cost")


def _middle_word(values: list) -> bool | str:
    """The re-measured configuration's flag or word from its repeats', as a count's median: a flag the
    lower middle repeat had (most repeats': a tie is False, a bracket converged only if most did); a word
    most repeats had, a tie the one that says something (a limit one of two repeats met is kept)."""
    if all(isinstance(v, bool) for v in values):
        return statistics.median_low(values)
    counted = Counter(values).most_common()
    return max((v for v, n in counted if n == counted[0][1]), key=bool)


def repeats_as_dict(r: Repeats) -> dict:
    """JSON-able, kept in the study's storage so that `tuner export` can rebuild the summary: the
    medians of every figure a trial records (`tuner.trial.to_attrs`), under the same names (a flag or a
    word: `_middle_word`), and each
    repeat's own range of requests per dollar (`Repeats.ranges`, under "ranges")."""
    attrs = [to_attrs(x) for x in r.measured]
    keys = sorted({k for a in attrs for k, v in a.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
    medians = {}
    for key in keys:
        values = [a[key] for a in attrs if isinstance(a.get(key), (int, float)) and not isinstance(a.get(key), bool)]
        if values:
            # a count stays one a repeat had (the lower middle one): the median of 1 and 2 servers, or of two
            # busiest seconds' requests, is 1.5, which no run measured and no one can deploy
            whole = key in _COUNTED or all(isinstance(v, int) for v in values)
            medians[key] = statistics.median_low(values) if whole else statistics.median(values)
    # flags and words (a bracket's converged and limited_by): dropped, they came back as their defaults and
    # the summary said a converged bracket had not converged and lost a load generator's limit
    for key in sorted({k for a in attrs for k, v in a.items() if isinstance(v, (bool, str))} - medians.keys()):
        medians[key] = _middle_word([a[key] for a in attrs if isinstance(a.get(key), (bool, str))])
    return {
        "trial": r.trial,
        "params": {k: list(v) if isinstance(v, tuple) else v for k, v in r.params.items()},
        "incumbent": r.incumbent,
        "values": r.values(),
        "ranges": [list(span) if span else None for span in r.ranges()],  # aligned with "values"
        "median": r.median,
        "spread": r.spread if math.isfinite(r.spread) else None,
        "observed_spread": r.observed_spread if math.isfinite(r.observed_spread) else None,
        "bracket_width": r.bracket_width,
        "feasible_runs": sum(x.meets_sla for x in r.measured),
        "unmeasured_runs": len(r.records) - len(r.measured),
        "capacity_rps": r.median_of(lambda x: x.capacity_rps or None),
        "capacity_speed": r.median_of(lambda x: x.capacity_speed or None),
        "scores": {name: r.median_of(lambda x, n=name: x.scores.get(n)) for name in ("capacity", "utilization")},
        "attrs": medians,
    }
