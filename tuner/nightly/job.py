"""One night, top to bottom: lock, tonight's traffic, drift, warm-started search, A/B confirmation,
decision, the dated run directory, and last the history line.

The search and the replays are reached through an `Engine` (see `engine.py` for the real one: a
Triton server, Locust replay and an Optuna study), so this file holds only the order of things and the
rules around them: what is enqueued, when confirmation is skipped, what is written where.
"""

from __future__ import annotations

import dataclasses
import json
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import pandas as pd
from tqdm import tqdm

from tuner import space
from tuner.cost import Price, price_for
from tuner.errors import EXIT_SLA_UNMET, InputError
from tuner.files import check_output_dir
from tuner.llm import engineargs
from tuner.modelconfig import ModelConfig
from tuner.nightly import drift as drift_mod
from tuner.nightly import history, lock, rundir
from tuner.nightly.deployed import Deployed, Proposal, read_deployed
from tuner.nightly.intake import newest_traffic
from tuner.nightly.rule import UNIT_WORDS, ArmResult, Decision, decide, keep, pair_gains
from tuner.nightly.settings import NightlySettings, read_study_for
from tuner.nightly.summary import markdown_summary
from tuner.settings import StudySettings
from tuner.soak import last_soak
from tuner.traffic import TIMESTAMP, write_traffic

TRAFFIC_FILE = "traffic.parquet"
# what a night writes in its output directory, each with how to tell the one a night wrote: any other
# file of these names is the user's, never replaced or appended to
OUTPUT_NAMES = {lock.LOCK_NAME: lock.is_lock, history.HISTORY_NAME: history.is_history,
                rundir.LATEST: rundir.is_latest, rundir.RUNS: rundir.is_runs}


@dataclass(frozen=True)
class SearchResult:
    """What tonight's search found: the best feasible parameters and score, the counts, production's score."""

    best: dict | None                 # parameters of the best feasible trial; None: none met the SLA
    best_per_dollar: float | None = None  # its score: requests, or a generative model's output tokens, per dollar
    trials: int = 0
    feasible: int = 0
    # production's own trial in tonight's search (None: not measured; 0: it broke the SLA)
    production_per_dollar: float | None = None
    timed_out: bool = False           # search.timeout_s passed before the planned trials all started


class Engine(Protocol):
    """How a night reaches the server: a warm-started search and single replays of a configuration."""

    def search(self, enqueue: list[dict], trials: int, workdir: Path, *, production: dict,
               timeout_s: float | None = None) -> SearchResult:
        """Run the enqueued parameter sets first, then `trials` more, on tonight's traffic, starting no
        trial once `timeout_s` has passed (the one running then finishes); report the best and
        production's own trial."""

    def replay(self, params: dict, arm: str) -> ArmResult:
        """Apply `params` to production's config on the server and replay tonight's traffic once."""


class EngineFactory(Protocol):
    """(study, production config, tonight's traffic file, staging dir, production's engine arguments
    (a vLLM-backend model's model.json; None for an encoder)) -> a context manager giving an Engine."""

    def __call__(self, study: StudySettings, production: ModelConfig, traffic_path: Path, /, *,
                 staging: Path, engine: dict | None = None) -> AbstractContextManager[Engine]: ...


@dataclass(frozen=True)
class NightResult:
    """What a night did: the decision, its run directory, both configurations, the pairs, the history line."""

    decision: Decision
    run_dir: Path
    production: dict
    candidate: dict | None
    pairs: list[tuple[ArmResult, ArmResult]] = field(default_factory=list)
    entry: dict = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """The exit code of the night's decision."""
        return self.decision.exit_code


def _same(a: dict | None, b: dict | None) -> bool:
    return a is not None and b is not None and {k: a.get(k) for k in b} == b


def _pending_proposal(nights: list[dict], candidate: dict, production: dict) -> dict | None:
    """The latest proposal made while production ran its current config, if it is this very change."""
    for night in reversed(nights):
        if not _same(night.get("production"), production):
            return None  # production changed since: older proposals are history
        if night.get("decision") == "change":
            return night if _same(night.get("candidate"), candidate) else None
    return None


def _rejected_last_night(previous: dict | None, candidate: dict, production: dict) -> dict | None:
    """Last night confirmed this very candidate against this production, and kept production."""
    if (previous and previous.get("decision") == "keep" and previous.get("gains")
            and _same(previous.get("candidate"), candidate) and _same(previous.get("production"), production)):
        return previous
    return None


def _search_gain(found: SearchResult) -> float | None:
    """The best trial over production's trial in tonight's search, when both have a score."""
    best, prod = found.best_per_dollar, found.production_per_dollar
    if best is None or not prod:
        return None
    return best / prod - 1.0


def _previous_traffic(output: Path, previous: dict | None) -> pd.DataFrame | None:
    if not previous or not previous.get("run_dir"):
        return None
    path = output / previous["run_dir"] / TRAFFIC_FILE
    try:
        return pd.read_parquet(path)
    except (OSError, ValueError):
        return None  # a previous run directory removed by hand: no drift baseline tonight


def tonight(study: StudySettings, traffic_path: str | Path) -> StudySettings:
    """The study pointed at tonight's traffic, whole (the night's window is already cut)."""
    traffic = dataclasses.replace(study.traffic, path=str(traffic_path), start_s=None, duration_s=None,
                                  busiest_s=None, since=None, until=None)
    return dataclasses.replace(study, traffic=traffic)


@dataclass(frozen=True)
class _Night:
    """What a night runs on, checked: the study (its space narrowed to take tonight's largest request),
    production's configuration, tonight's traffic and its files, the check's notes."""

    study: StudySettings
    deployed: Deployed
    traffic: pd.DataFrame
    files: list[Path]
    price: Price                  # one server's, as every score divides by it
    notes: tuple[str, ...] = ()


def _read_night(settings: NightlySettings) -> _Night:
    """Everything a night reads and checks before it writes or starts anything, for `--check` and the
    run alike (bad input: one line, nothing made): the study with its overrides as `tuner tune --check`
    checks it (its price, tonight's traffic as every replay takes it, a remote server's URL),
    production's config, tonight's traffic."""
    from tuner.tune import check_traffic  # here: `tuner nightly --history` does not import Optuna

    study = read_study_for(settings)
    price = price_for(study.cost, source=study.source)  # an unknown GPU: refused here, not by the first trial's score
    deployed = read_deployed(study, settings.production)  # checked as the run checks it
    traffic, files = newest_traffic(settings.traffic.path, settings.traffic.hours, study.model,
                                    pattern=settings.traffic.pattern)
    engine = (None if deployed.engine is None  # as tune checks its incumbent: vLLM's values filled in
              else engineargs.resolved(deployed.engine, engineargs.device_class(study.cost.gpu)))
    study, notes = check_traffic(tonight(study, settings.traffic.path), deployed.config, traffic, engine=engine)
    if study.server.launcher == "remote":
        from tuner.server.remote import check_remote

        check_remote(study.server.url, [study.model])  # what its launcher will refuse, refused now
    return _Night(study, deployed, traffic, files, price, tuple(notes))


def check_night(settings: NightlySettings) -> list[tuple[str, str]]:
    """The dry run of a night, as (what, value) rows: everything the run checks before it starts a
    server (`_read_night`) and the output directory; nothing is started or written."""
    night = _read_night(settings)
    study, deployed, traffic = night.study, night.deployed, night.traffic
    check_output(settings.output, create=False)
    span = float(traffic[TIMESTAMP].iloc[-1] - traffic[TIMESTAMP].iloc[0]) if len(traffic) > 1 else 0.0
    server = study.server.launcher + (f" {study.server.image}" if study.server.launcher == "docker" else "") + (
        f" {study.server.url}" if study.server.launcher == "remote" else "")
    return [
        ("study", f"{settings.study} (model {study.model}, scoring {study.scoring}, {UNIT_WORDS[deployed.unit]})"),
        ("production", f"{deployed.path}: {space.describe(deployed.params)}"),
        ("traffic", f"{len(traffic)} requests over {span:,.0f} s (the last {settings.traffic.hours:g} h) "
                    f"from {len(night.files)} file(s) in {settings.traffic.path}"),
        ("search", f"{settings.search.trials} trials after last night's best and production's"
                   + (f", none started after {settings.search.timeout_s:g} s" if settings.search.timeout_s else "")),
        ("confirm", f"{settings.confirm.pairs} pairs, margin {settings.confirm.margin:.0%}, rule {settings.confirm.rule}"),
        ("cost", night.price.describe()),
        ("server", server),
        ("output", settings.output),
        *(("note", note) for note in night.notes),
    ]


def check_output(output: str | Path, *, create: bool) -> Path:
    """The output directory, once a night can write there and nothing of a night's names in it is
    someone else's (the run's check and `--check`'s, one check); made with `create`."""
    return check_output_dir(output, "output", create=create, ours=OUTPUT_NAMES)


def check_history_output(output: str | Path) -> None:
    """`--history` of a directory: one a night wrote, or an empty one (no night yet); a directory of other
    files and no history is not a nightly output (a mistyped path would read as an empty, healthy history):
    InputError naming what it holds."""
    if history.history_path(output).exists():
        return
    others = sorted(p.name for p in Path(output).iterdir() if p.name not in OUTPUT_NAMES)
    if others:
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise InputError(f"{output}: not a nightly output directory (no {history.HISTORY_NAME}; it holds {shown}): "
                         f"give NIGHTLY.yaml or the output directory its nights write")


def run_night(settings: NightlySettings, engine_factory: EngineFactory,
              now: datetime | None = None) -> NightResult:
    """What one nightly run decided, after it has written its run directory and its history line."""
    night = _read_night(settings)  # bad input refused here: no server started, nothing written
    study, deployed, traffic, files = night.study, night.deployed, night.traffic, night.files
    # production's config as trial parameters, in the study's space (the search's own reading)
    production = deployed.params
    keys = set(production)
    unit = deployed.unit
    output = Path(settings.output)
    started = now or datetime.now(UTC)
    stamp = rundir.night_stamp(started)
    t_start = time.monotonic()

    check_output(output, create=True)
    with lock.run_lock(output):
        rundir.clear_stale_staging(output)
        nights = history.read_history(output)
        previous = nights[-1] if nights else None
        drift = drift_mod.drift_table(_previous_traffic(output, previous), traffic, settings.drift.threshold)
        with rundir.staging(output, stamp) as staging:
            traffic_path = write_traffic(traffic, staging / TRAFFIC_FILE)

            # warm start: last night's best and production are the first trials
            enqueue = []
            for params in ((previous or {}).get("best"), production):
                if params and set(params) == set(keys) and params not in enqueue:
                    enqueue.append(dict(params))

            with engine_factory(study, deployed.config, traffic_path, staging=staging, engine=deployed.engine) as engine:
                found = engine.search(enqueue, settings.search.trials, staging / "search", production=production,
                                      timeout_s=settings.search.timeout_s)
                decision, pairs = _decide_night(engine, settings, found, production=production, nights=nights, drift=drift)
            candidate = found.best
            proposal = None
            if decision.decision == "change":
                proposal = deployed.proposal(candidate, study.search)
                _write_proposal(staging / "proposed", proposal, _header(stamp, study, decision, deployed=deployed, proposal=proposal))

            sla = f"{_sla(study)}, errors <= {study.sla.max_error_rate:.2%}"
            soak = last_soak(study.output)
            drift.to_csv(staging / "drift.csv", index=False)
            (staging / "drift.txt").write_text(drift_mod.format_drift(drift) + "\n")
            _write_pairs(staging / "confirmation.csv", pairs)
            (staging / "summary.md").write_text(markdown_summary(
                stamp=stamp, model=study.model, decision=decision, production=production,
                candidate=candidate, pairs=pairs, drift=drift, sla=sla, scoring=study.scoring, unit=unit,
                percentile=study.sla.percentile, proposal=proposal, soak=soak,
                search=_search_line(found, settings, planned=len(enqueue) + settings.search.trials)))
            rate = float(drift.loc[drift["metric"] == "rate_rps", "current"].iloc[0])
            entry = {
                "night": stamp,
                "decision": decision.decision,
                "reason": decision.reason,
                "exit_code": decision.exit_code,
                "production": production,
                "candidate": candidate,
                "best": candidate,
                # named by the unit (requests, or a generative model's output tokens) so nobody reads one as the other
                "unit": unit,
                f"best_{unit}_per_dollar": found.best_per_dollar,
                f"production_{unit}_per_dollar": found.production_per_dollar,
                "gain": decision.median_gain,
                "min_gain": decision.min_gain,
                "gains": list(decision.gains),
                "trials": found.trials,
                "search_timeout_s": settings.search.timeout_s,
                "search_timed_out": found.timed_out,
                "rate_rps": rate,
                # what every score above divides by: a price table changed between nights moves them all
                "price_per_hour": night.price.price_per_hour,
                "requests": int(len(traffic)),
                "drifted": drift_mod.drifted(drift),
                "last_soak": soak,
                "traffic_files": [str(f) for f in files],
                "production_config": str(deployed.path),
                **({"proposed": f"proposed/{proposal.name}", "changed": list(proposal.changed)} if proposal else {}),
                "duration_s": round(time.monotonic() - t_start, 1),
            }
            (staging / rundir.DECISION).write_text(json.dumps(entry, indent=2, default=str) + "\n")
            final = rundir.publish(staging, output, stamp)
        entry["run_dir"] = str(final.relative_to(output))
        # last: a run killed before this line leaves the history as it was
        history.append_night(output, entry)
    return NightResult(decision, final, production, candidate, pairs, entry)


def _search_line(found: SearchResult, settings: NightlySettings, *, planned: int) -> str | None:
    """What the summary says of a search its time limit stopped (nothing of one that ran its trials)."""
    if not found.timed_out:
        return None
    return (f"search: stopped by its time limit (search.timeout_s {settings.search.timeout_s:g} s) after "
            f"{found.trials} of {planned} trials; no trial started after it")


def _decide_night(engine: Engine, settings: NightlySettings, found: SearchResult, *, production: dict,
                  nights: list[dict], drift: pd.DataFrame) -> tuple[Decision, list[tuple[ArmResult, ArmResult]]]:
    """Whether tonight's best needs a confirmation at all, and if so the A/B replays and the rule."""
    candidate = found.best
    previous = nights[-1] if nights else None
    if candidate is None:
        return keep(f"SLA unmeetable: none of {found.trials} trials (production's config included) met "
                    f"the SLA on tonight's traffic", EXIT_SLA_UNMET), []
    if _same(candidate, production):
        return keep("production's config is still the best the search found"), []
    pending = _pending_proposal(nights, candidate, production)
    if pending is not None:
        return keep(f"the same change was proposed on {pending.get('night')} and production has not "
                    f"applied it yet; not proposed again"), []
    rejected = _rejected_last_night(previous, candidate, production)
    if rejected is not None and not drift_mod.drifted(drift):
        return keep(f"the confirmation on {rejected.get('night')} rejected this same candidate and the "
                    f"traffic has not drifted since; not confirmed again"), []
    gain = _search_gain(found)
    if gain is not None and gain < settings.confirm.margin:
        return keep(f"the search's best beat production by only {gain:+.2%} "
                    f"(margin {settings.confirm.margin:.0%}); no confirmation needed"), []
    pairs: list[tuple[ArmResult, ArmResult]] = []
    with tqdm(total=2 * settings.confirm.pairs, desc="confirmation A/B", unit="replay", leave=False) as bar:
        for _ in range(settings.confirm.pairs):
            a = engine.replay(production, "production")
            bar.update()
            b = engine.replay(candidate, "candidate")
            bar.update()
            pairs.append((a, b))
    return decide(pairs, settings.confirm.margin, settings.confirm.pairs, rule=settings.confirm.rule), pairs


def _header(stamp: str, study: StudySettings, decision: Decision, *, deployed: Deployed, proposal: Proposal) -> str:
    """What the proposal is, as lines (a config.pbtxt's comment header; model.json holds none: the summary says it)."""
    return "\n".join([f"Proposed by tuner nightly on {stamp} for model {study.model} (production: {deployed.path})",
                      f"SLA: {_sla(study)}, error rate <= "
                      f"{study.sla.max_error_rate:.2%}; scoring: {study.scoring} ({UNIT_WORDS[deployed.unit]})",
                      f"confirmation: {decision.reason}",
                      "changed: " + "; ".join(proposal.changed)])


def _sla(study: StudySettings) -> str:
    """The SLA's latency limits as every output writes them (an encoder's latency; TTFT and TPOT)."""
    from tuner.export import sla_limits  # here: `tuner nightly --history` does not import Optuna

    return sla_limits(dataclasses.asdict(study.sla))


def _write_proposal(folder: Path, proposal: Proposal, header: str) -> None:
    """proposed/<file> and its diff (config.diff, model.diff); a config.pbtxt opens with the header as comments."""
    folder.mkdir()
    text = proposal.text
    if proposal.name != engineargs.ENGINE_FILE:
        text = "".join(f"# {line}\n" for line in header.splitlines()) + "\n" + text
    (folder / proposal.name).write_text(text)
    (folder / f"{Path(proposal.name).stem}.diff").write_text(proposal.diff)


def _write_pairs(path: Path, pairs: list[tuple[ArmResult, ArmResult]]) -> None:
    rows = []
    for k, ((p, c), gain) in enumerate(zip(pairs, pair_gains(pairs), strict=True), 1):
        for r in (p, c):
            row = {"pair": k, **{f.name: getattr(r, f.name) for f in dataclasses.fields(r) if f.name != "detail"}}
            row.update({f"detail.{key}": v for key, v in r.detail.items()})
            rows.append(row)
        rows[-1]["gain"] = gain
    pd.DataFrame(rows).to_csv(path, index=False)
