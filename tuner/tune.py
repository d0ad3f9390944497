"""`tuner tune` as a library call: check the inputs, run the study, re-measure the best, write the
outputs and the report. The one place the whole flow is wired: evaluation (server + replay) ->
search -> export -> report. Progress goes to a `Progress` the caller gives (the CLI draws bars).

Several hosts may run `tune` on one study (a shared database): each measures trials on its own
server; the one that finds the search over first re-measures the top configurations and writes the
outputs, the others return `Handover` saying who does. `finish` re-measures on demand (`tuner
finish`), `outputs_from_storage` writes the outputs of a finished study on any machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import pandas as pd

from tuner import export, modelconfig, search, space
from tuner.cost import price_for
from tuner.errors import (
    ConfigError,
    InputError,
    OutputError,
    SettingsError,
    TrafficError,
    TunerError,
    UnmeasuredError,
    traffic_row,
)
from tuner.files import check_output_dir, write_atomic
from tuner.llm import engineargs
from tuner.measurement import percentile_key
from tuner.report import REPORT, SIMULATION, write_report
from tuner.settings import StudySettings, check_generative
from tuner.study import (
    base_engine,
    check_not_in_model,
    checked_base,
    model_files,
    recorded_study,
    stale_profile,
    study_traffic,
)
from tuner.traffic import busiest_window, mean_rps, peak_rps
from tuner.trial import Hints
from tuner.trial.run import session

__all__ = ["Handover", "Prepared", "Progress", "check_outputs_owner", "check_table", "check_traffic", "check_workers", "finish",
           "ignored_column_notes", "outputs_from_storage", "prepare", "tune"]

# requests slower than the SLA's percentile, at the least, in a step at the recorded load for its verdict not
# to hang on one or two of them (fewer: `tuner tune --check` says so)
STEADY_TAIL = 3.0


class Progress:
    """What `tune` reports while it works; the default says nothing (the CLI draws bars)."""

    def note(self, text: str) -> None:
        """A line worth telling before the work starts (where the study lives, a narrowed space)."""

    def trials(self, study: optuna.Study, total: int) -> None:
        """The trial loop starts (or resumes) on `study`, `total` trials in all."""

    def trial_done(self, study: optuna.Study) -> None:
        """A trial finished (here or in another worker)."""

    def profile_point(self, done: int, total: int, what: str) -> None:
        """The model strategy's profile measured `done` of at most `total` points (`what`: the last)."""

    def step(self, m) -> None:
        """One replay of a trial measured (at the load, or a capacity step at `m.speed`): progress within
        a trial, which lasts minutes where it is a generative model's."""

    def remeasure(self, total: int) -> None:
        """The re-measurement starts: `total` measurements."""

    def remeasured_one(self) -> None:
        """One re-measurement finished."""

    def close(self) -> None:
        """The work is over (also on an error)."""


@dataclass(frozen=True)
class Handover:
    """What a host that does not re-measure returns: who does (or which trial another host still
    measures), the trials measured here, and each host's share of the study."""

    study_name: str
    storage: str            # printable (password masked)
    by: dict                # host, pid, gpu; `running`: the trial another host still measures
    ran_here: int
    hosts: list = field(default_factory=list)   # export.hosts(study)

    def message(self, study_file: str = "STUDY.yaml") -> str:
        """One line for the terminal; its way out names the study file and the storage to finish with."""
        who = f"{self.by.get('host')} (pid {self.by.get('pid')}, {self.by.get('gpu')})"
        finish = f"tuner finish {study_file} --storage {self.storage}"
        if "running" in self.by:
            return (f"{who} still measures trial {self.by['running']}: the last host to finish re-measures the "
                    f"top configurations and writes the outputs; this host measured {self.ran_here} trial(s). "
                    f"If that host stops, run: {finish}")
        return (f"{who} re-measures the top configurations and writes the outputs (since {self.by.get('since')}); "
                f"this host measured {self.ran_here} trial(s). If it stops, run: {finish}")


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """A study checked and ready to run: everything known before a server starts."""

    settings: StudySettings           # the space may be narrowed to fit the traffic
    base: modelconfig.ModelConfig
    traffic: pd.DataFrame = field(repr=False)
    storage: str
    notes: tuple[str, ...] = ()
    profile: object = None            # the model strategy's profile file, read (None: measured in the run)
    engine: dict | None = None        # a vLLM-backend model's engine arguments, vLLM's values filled in
    model_files: dict = field(default_factory=dict)  # study.model_files: the model's files, by digest


def prepare(settings: StudySettings, storage: str | None = None, *, dry_run: bool = False) -> Prepared:
    """Check everything the study needs before a server starts (bad input: exit 2 here, with
    nothing written; the output directory is made last, once every check passed, and not even that
    in a `dry_run`): the model's config, the traffic (as the replay will plan it), the space, the
    profile, the remote server, the storage (a `dry_run` reaches a database server), the output
    directory (another study's outputs are never replaced)."""
    base_path = Path(settings.model_repository) / settings.model / "config.pbtxt"
    base = checked_base(settings)
    engine = base_engine(settings, base)  # a vLLM-backend model: vLLM batches, its engine knobs are tuned
    if engine is None:
        space.check_tunable(base, str(base_path), search=settings.search)
    check_generative(settings, generative=engine is not None)
    settings = dataclasses.replace(settings, search=space.study_space(settings.search, vllm=engine is not None,
                                                                      source=settings.source or "<study>"))
    if engine is not None:
        engine = engineargs.resolved(engine, engineargs.device_class(settings.cost.gpu))
        if settings.search.strategy == "model":
            raise SettingsError(f"{settings.source or '<study>'}: search.strategy: model simulates Triton's dynamic "
                                f"batcher; {settings.model} is batched by vLLM: use search.strategy: measure")
    traffic = study_traffic(settings)
    price_for(settings.cost, source=settings.source)
    if engine is not None:
        _check_engine_gpus(settings, engine)
    settings, notes = check_traffic(settings, base, traffic, engine=engine)
    incumbent = space.from_config(base, settings.search, engine=engine)
    space.check_choices(incumbent, settings.search, whose="the incumbent's")
    off = space.outside(incumbent, settings.search)
    if off:
        notes.append(f"the incumbent's {'; '.join(off)} lies outside the search: it is measured as the "
                     f"baseline, the search does not explore around it")
    if settings.search.strategy == "model":  # before a profile is read or measured
        search.check_simulatable(settings, base)
    profile = _study_profile(settings)
    _check_remote(settings)
    url = search.storage_url(settings, storage)
    # the default storage lives in the output directory: an output that is a file is said as one, first
    check_output_dir(settings.output, "output directory", create=False)
    # a storage the user named is a path they gave
    search.check_storage(url, connect=dry_run, write=bool(storage or settings.storage))
    check_not_in_model(settings.output, settings, label=f"output directory {settings.output}")
    check_outputs_owner(settings.output, settings.name)
    check_output_dir(settings.output, "output directory", create=not dry_run)  # made last: all checked
    notes.insert(0, f"study {settings.name!r} in {search.safe_url(url)}")
    prepared = Prepared(settings=settings, base=base, traffic=traffic, storage=url, notes=tuple(notes),
                        profile=profile, engine=engine, model_files=model_files(settings))
    if dry_run:  # the real run checks this as it opens the study: the dry run says now what it will say
        resume = search.check_resume(settings, url, identity=identity(prepared), host=search.this_host())
        if resume:
            prepared = dataclasses.replace(prepared, notes=(*prepared.notes, resume))
    return prepared


def check_traffic(settings: StudySettings, base: modelconfig.ModelConfig, traffic: pd.DataFrame, *,
                  engine: dict | None = None) -> tuple[StudySettings, list[str]]:
    """The study's traffic checked as every trial's replay would take it (a request above the model's
    max_batch_size, a row the replay refuses, nothing in the measured window: one line, exit 2), and the
    settings with the space narrowed to take its largest request, with a note saying so. What tune,
    simulate and profile check alike, so that a ranking or a profile is never of traffic tune refuses."""
    notes = []
    if engine is None:
        largest, where = _largest_request(traffic)
        if largest > base.max_batch_size:
            base_path = Path(settings.model_repository) / settings.model / "config.pbtxt"
            raise ConfigError(
                f"{base_path}: max_batch_size is {base.max_batch_size}, but the traffic has requests of "
                f"{largest} rows ({where}): Triton refuses a request larger than max_batch_size")
    _check_replayable(settings, base, traffic, engine=engine)
    if engine is None:
        notes += ignored_column_notes(settings, base, traffic)
        narrowed, note = space.fit_to_rows(settings.search, largest, where=where,
                                           source=settings.source or "<study>")
        if note:
            notes.append(note)
        settings = dataclasses.replace(settings, search=narrowed)
    return settings, notes


def ignored_column_notes(settings: StudySettings, base: modelconfig.ModelConfig, traffic: pd.DataFrame) -> list[str]:
    """A note for each shape column of the traffic that no request the replay sends takes (a `seq_len`
    where the model's inputs have fixed dims): the lengths it records are not what the trials send."""
    from tuner.replay import ignored_columns

    config = json.loads(modelconfig.to_json(base))
    return [f"{settings.traffic.path}: column '{column}' is not sent: no input of {settings.model} has a "
            f"variable dim it sizes (each request takes the dims config.pbtxt gives)"
            for column in ignored_columns(config, traffic.columns)]


def _check_replayable(settings: StudySettings, base: modelconfig.ModelConfig, traffic: pd.DataFrame, *,
                      engine: dict | None = None) -> None:
    """Refuse up front what every trial's replay would refuse or find empty: a row the replay's
    plan refuses (a shape the model does not take, a request above the replay's size limit; for a
    generative model: no token columns, a model that does not stream, a request longer than the
    engine's context), and traffic with no request in the first replay's measured window (one row,
    equal timestamps, a warm-up as long as the traffic)."""
    from tuner.replay import plan_generate, plan_requests
    from tuner.trial.generate import check_context
    from tuner.trial.step import check_measured, step_windows

    config = json.loads(modelconfig.to_json(base))
    if engine is None:
        plan_requests({"name": settings.model}, config, traffic)  # the replay's own check, row by row
    else:
        plan_generate({**config, "name": settings.model}, traffic)
        context = engineargs.context_tokens(engine)
        if context is not None:
            check_context(traffic, context, model=settings.model)
    path, speed = settings.traffic.path, settings.traffic.speed
    stamps = traffic["timestamp"]
    if stamps.nunique() < 2:
        raise TrafficError(f"{path}: {len(traffic)} request(s), all at one timestamp: a replay measures "
                           f"requests spread over time; no requests due in the measured window")
    check_measured(step_windows(traffic, settings), speed, source=str(path))


def _study_profile(settings: StudySettings):
    """The model strategy's profile file, read and checked now (None: measured in the run)."""
    if settings.search.strategy != "model" or not settings.search.profile:
        return None
    from tuner.simulate import read_profile

    return read_profile(settings.search.profile, model=settings.model)


def _check_remote(settings: StudySettings) -> None:
    """A remote server must be what the run's launcher will take: Triton's HTTP endpoint at the URL (not
    its metrics or gRPC port), in explicit model-control mode, the study's model loaded and ready."""
    if settings.server.launcher != "remote":
        return
    from tuner.server.remote import check_remote

    check_remote(settings.server.url, [settings.model])


PROFILE = "profile.csv"  # the model strategy's, measured in the run
# what a study writes into its output directory
OUTPUT_NAMES = (export.SUMMARY, export.TRIALS, export.RECOMMENDED, export.RECOMMENDED_ENGINE, export.INCUMBENT,
                export.RECORDS, REPORT, PROFILE, SIMULATION)


def check_outputs_owner(output: str | Path, name: str) -> None:
    """Refuse to write study `name`'s outputs where another study's are (its summary, recommended
    config and per-request records, which cannot be made again): one output directory, one study.
    The summary names the study that wrote the outputs; the default storage in the directory names
    the studies begun there."""
    out = Path(output)
    others = {_summary_study(out / export.SUMMARY)}
    default = out / search.DEFAULT_STORAGE_FILE
    with contextlib.suppress(OSError):  # a place the OS refuses: the output check says why
        if default.is_file() and default.stat().st_size > 0:
            others |= _studies_in(f"sqlite:///{default}")
    ours = name in others
    others.discard(None)
    others.discard(name)
    if others:
        raise OutputError(f"output directory {out}: holds the outputs of study {sorted(others)[0]!r}, not "
                          f"{name!r}: give each study its own --output (outputs are never replaced by "
                          f"another study's)")
    if not ours:  # no study began here: a file of an output's name is someone's own, not ours to replace
        with contextlib.suppress(OSError):
            taken = [str(p) for p in OUTPUT_NAMES if (out / p).exists()
                     and not (p == PROFILE and _is_tuner_profile(out / p))]  # `tuner profile`'s is ours
            if taken:
                raise OutputError(f"output directory {out}: holds {', '.join(taken)}, which no tuner study "
                                  f"wrote there (no {export.SUMMARY} or {search.DEFAULT_STORAGE_FILE} of "
                                  f"study {name!r}): name a new or empty --output (nothing was changed)")


def _is_tuner_profile(path: Path) -> bool:
    """Whether `path` is a profile tuner wrote (its format line first)."""
    from tuner.simulate import FORMAT_LINE

    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.readline().rstrip("\n") == FORMAT_LINE
    except OSError:
        return False


def _summary_study(path: Path) -> str | None:
    try:
        return json.loads(path.read_text()).get("study_name")
    except (OSError, ValueError, AttributeError):  # none, or not a summary this tuner wrote
        return None


def _studies_in(url: str) -> set[str]:
    try:
        return {s.study_name for s in optuna.get_all_study_summaries(search.open_storage(url))}
    except TunerError:
        return set()


def _input_rows(p: Prepared) -> list[tuple[str, str]]:
    """What the replay sends each input of the model, a row each (a vLLM model's prompts are the
    generative replay's: no rows)."""
    if p.engine is not None:
        return []
    from tuner.replay import describe_inputs

    config = {**json.loads(modelconfig.to_json(p.base)), "name": p.settings.model}
    return [("input", line) for line in describe_inputs(config, p.traffic)]


def check_table(p: Prepared, *, workers: int = 1, given: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """What a study would do, as (what, value) rows: the dry run's answer (nothing is started). `given`:
    the command-line flags (`--trials`, `--timeout`) whose values the settings hold for this run, named
    where the rows would otherwise name the study's keys."""
    s = p.settings
    price = price_for(s.cost, source=s.source)
    knobs = [f"{k.name} {_span(k.range_of(s.search))}" for k in space.tuned(s.search)]
    server = s.server.launcher + (f" {s.server.image} (the Docker engine and the image are checked when a run "
                                  f"starts, not here)" if s.server.launcher == "docker" else "") + (
        f" {s.server.url}" if s.server.launcher == "remote" else "")
    span = float(p.traffic["timestamp"].iloc[-1] - p.traffic["timestamp"].iloc[0]) if len(p.traffic) > 1 else 0.0
    incumbent = space.from_config(p.base, s.search, engine=p.engine)
    return [
        ("model", f"{s.model} in {s.model_repository} " + (
            f"(max_batch_size {p.base.max_batch_size})" if p.engine is None else
            f"(vLLM batches: its engine arguments in {engineargs.ENGINE_FILE}, context {engineargs.context_tokens(p.engine)})")),
        ("incumbent", space.describe(incumbent)),
        ("traffic", f"{s.traffic.path}: {len(p.traffic)} requests over {span:,.0f} s, at speed "
                    f"{s.traffic.speed:g}: mean {mean_rps(p.traffic) * s.traffic.speed:.1f} req/s, busiest second "
                    f"{peak_rps(p.traffic, s.traffic.speed):.0f} req/s"),
        *_input_rows(p),
        ("space", "; ".join(knobs) + f" ({space.grid_size(s.search)} grid points)"),
        *_refused_points(p),
        ("search", _describe_search(s.search, profile=_profile_plan(p), incumbent=incumbent, given=given)),
        ("SLA", f"{export.sla_limits(dataclasses.asdict(s.sla))}, errors <= {s.sla.max_error_rate:.2%}"),
        *_step_rows(p),
        ("cost", f"{price.describe()}; scoring: {s.scoring}, "
                 + ("output tokens" if p.engine is not None else "requests") + " per dollar"),
        ("server", server + (f" ({workers} workers, a server each)" if workers > 1 else "")),
        ("storage", search.safe_url(p.storage)),
        ("output", s.output),
        *[("note", note) for note in p.notes[1:]],
    ]


def _refused_points(p: Prepared) -> list[tuple[str, str]]:
    """A vLLM-backend study's grid points that vLLM refuses (`engineargs.check`'s rules: batched tokens under
    the sequences, or under the context without chunked prefill), as a row: a trial that draws one is
    recorded refused, not measured, and a space of nothing else measures only the incumbent."""
    if p.engine is None:
        return []
    grid = space.grid(p.settings.search)
    refused, reason = 0, ""
    for values in itertools.product(*grid.values()):
        try:
            space.apply_engine(p.engine, dict(zip(grid, values, strict=True)))
        except ConfigError as exc:
            refused, reason = refused + 1, reason or str(exc).split(": ", 1)[-1]
    if not refused:
        return []
    total = space.grid_size(p.settings.search)
    share = f"all {total}" if refused == total else f"{refused} of the {total}"
    return [("refused", f"{share} grid points: vLLM refuses them (e.g. {reason}); a trial that draws one is "
                        f"recorded refused, not measured")]


def _step_rows(p: Prepared) -> list[tuple[str, str]]:
    """How many requests the SLA's percentile is read from at the recorded load: a measurement step is the
    traffic's busiest `step_duration_s` (the capacity search's steps at higher speeds hold more). Few
    requests above the percentile make its verdict hang on one or two slow ones (benchmarks/
    load_latency_repeats.py: one measurement's p99 of 253 requests moved 8 % from its median, 23 % at the p90)."""
    s = p.settings
    step_s, q = s.search.capacity.step_duration_s, s.sla.percentile
    n = busiest_window(p.traffic, step_s * s.traffic.speed)[1] if len(p.traffic) else 0
    if n == 0:
        return []
    above = round((n - 1) * (100 - q) / 100, 6)  # the percentile's place from the slowest (linear interpolation)
    k = int(above) + 1
    where = (f"lies between their {_ordinal(k)} and {_ordinal(k + 1)} slowest" if above % 1 else
             "is their slowest" if k == 1 else f"is their {_ordinal(k)} slowest")
    rows = [("step", f"the busiest {step_s:g} s at each speed; at the recorded load {n} requests, whose {percentile_key(q)} "
                     f"{where}")]
    if above < STEADY_TAIL:
        rows.append(("note", f"at the recorded load a step holds {n} requests, whose {percentile_key(q)} {where}: a slow request "
                             f"or two decide the SLA's verdict; a longer search.capacity.step_duration_s steadies it"))
    return rows


def _ordinal(k: int) -> str:
    return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


def _earlier_profile(p: Prepared):
    """The profile `tuner profile STUDY` or an earlier run left in OUTPUT/profile.csv (None: none, or the
    study names its own), and what to say when it is another version of the model's (None: it is this
    one's): the one decision `_simulate` acts on and `tune --check` reports."""
    s = p.settings
    out = Path(s.output) / PROFILE
    if s.search.profile or not _is_tuner_profile(out):
        return None, None
    from tuner.simulate import read_profile

    earlier = read_profile(out, model=s.model)
    return earlier, stale_profile(earlier.model_digest, s, p.base, where=str(out))


def _profile_plan(p: Prepared) -> str:
    """Where the model strategy's profile will come from, as `_simulate` decides it."""
    s = p.settings
    if s.search.strategy != "model" or s.search.profile:
        return s.search.profile or ""
    earlier, stale = _earlier_profile(p)
    if earlier is None:
        return "measured first (OUTPUT/profile.csv)"
    out = Path(s.output) / PROFILE
    return f"measured again ({out} is another version of the model's)" if stale else \
        f"{out} (measured before; remove it to measure again)"


def _describe_search(search_settings, *, profile: str = "", incumbent: space.Params | None = None,
                     given: frozenset[str] = frozenset()) -> str:
    remeasure = f"top {search_settings.top_k} re-measured {search_settings.remeasure_repeats}x"
    if search_settings.timeout_s:  # no trial starts after it (--timeout says it for one run)
        where = "--timeout" if "--timeout" in given else "search.timeout_s"
        remeasure += f"; no trial started after {search_settings.timeout_s:g} s ({where})"
    if search_settings.strategy != "model":
        return f"{search_settings.sampler}, {_trials_text(search_settings, incumbent, given=given)}, {remeasure}"
    profile = profile or search_settings.profile or "measured first (OUTPUT/profile.csv)"
    return (f"model: profile {profile}; the whole space simulated, the incumbent and the simulation's top "
            f"{search_settings.model_top} measured; past a median error of {search_settings.model_error:.0%}, "
            f"{search_settings.sampler} up to {search_settings.trials} trials; {remeasure}")


def _trials_text(search_settings, incumbent: space.Params | None, *, given: frozenset[str] = frozenset()) -> str:
    """The trials the run will count (`search.trials_to_run`): a grid study's stop at its grid's end."""
    n = search.trials_to_run(search_settings, search_settings.trials, incumbent=incumbent)
    if n == search_settings.trials:
        return f"{n} trials"
    points = space.grid_size(search_settings)
    which = " and the incumbent" if n > points else ", the incumbent one of them"
    where = "--trials" if "--trials" in given else "search.trials"
    return f"{n} trials ({points} grid points{which}; {where} {search_settings.trials})"


def _span(r) -> str:
    if dataclasses.is_dataclass(r):
        return f"{r.low}..{r.high}" + (" (log)" if r.log else f" step {r.step}" if r.step != 1 else "")
    return "|".join(map(str, r)).lower()  # choices: preferred-size strategies, chunked prefill's true|false


def _check_engine_gpus(settings: StudySettings, engine: dict) -> None:
    """A price from the table is one GPU's times `cost.gpus_per_server`: an engine spread over more
    GPUs than that would be scored at a fraction of its server's price (its tokens per dollar
    multiplied). A price of the user's own (`cost.price_per_hour`) is the whole server's, and a CPU
    instance's price has no GPUs to count."""
    cost = settings.cost
    needed, how = engineargs.gpus(engine)
    if cost.price_per_hour is None and cost.gpu.lower() != "cpu" and needed > cost.gpus_per_server:
        raise SettingsError(
            f"{settings.source or '<study>'}: cost.gpus_per_server is {cost.gpus_per_server}, but "
            f"{settings.model}'s {engineargs.ENGINE_FILE} runs its engine on {needed} GPUs ({how}): the server's "
            f"price counts them, set cost.gpus_per_server: {needed}")


def _largest_request(traffic: pd.DataFrame) -> tuple[int, str]:
    if "batch_size" not in traffic.columns or traffic.empty:
        return 1, "every request has 1 row"
    i = int(traffic["batch_size"].to_numpy().argmax())
    return int(traffic["batch_size"].iloc[i]), traffic_row(traffic, i)


def identity(p: Prepared) -> dict:
    """What the study's trials were measured against: a resumed study must match it."""
    s = p.settings
    knobs = {k.name: (dataclasses.asdict(r) if dataclasses.is_dataclass(r) else list(r))
             for k in space.tuned(s.search) for r in [k.range_of(s.search)]}
    return {
        "model": s.model,
        "base_config": modelconfig.to_text(p.base),
        "traffic": f"{len(p.traffic)} requests, hash {int(pd.util.hash_pandas_object(p.traffic, index=False).sum()) & (2**63 - 1):x}",
        "speed": s.traffic.speed,
        "sla": dataclasses.asdict(s.sla),
        "price_per_hour": price_for(s.cost, source=s.source).price_per_hour,
        "scoring": s.scoring,
        "space": {**knobs, "preferred_batch_size": s.search.preferred_batch_size,
                  "grid_per_octave": s.search.grid_per_octave},
        "measurement": {"capacity": dataclasses.asdict(s.search.capacity), "warmup_s": s.replay.warmup_s,
                        "protocol": s.replay.protocol, "lag_budget_ms": s.replay.lag_budget_ms},
        **({"engine": p.engine} if p.engine is not None else {}),  # a vLLM-backend model's model.json, resolved
        "model_files": p.model_files,  # its code and weights: a changed model.py is another model
    }


def _metadata(p: Prepared) -> dict:
    s = p.settings
    return {
        "scoring": s.scoring,
        "model": s.model,
        # absolute: the closing `tuner replay` line, printed by finish or report from any directory, must find it
        "study_file": str(Path(s.source).resolve()) if Path(s.source).is_file() else s.source,
        "storage": search.without_password(p.storage),  # written into the summary: no secret
        "base_config": modelconfig.to_text(p.base),
        "base_config_source": (Path(s.model_repository) / s.model / "config.pbtxt").read_text(),
        "preferred_batch_size": s.search.preferred_batch_size,
        # a generative study's SLA is in tokens: the encoder's latency limit it leaves at its default is none
        "sla": {**dataclasses.asdict(s.sla), **({"latency_ms": None} if p.engine is not None else {})},
        "lag_budget_ms": s.replay.lag_budget_ms,
        "step_duration_s": s.search.capacity.step_duration_s,
        "traffic": {**dataclasses.asdict(s.traffic), "requests": len(p.traffic),
                    # the busiest second and the mean at the study's speed; mean_rps: the recording's own (speed 1)
                    "peak_rps": peak_rps(p.traffic, s.traffic.speed),
                    "load_mean_rps": mean_rps(p.traffic) * s.traffic.speed, "mean_rps": mean_rps(p.traffic)},
        "price": price_for(s.cost, source=s.source).as_dict(),
        **({"base_engine": engineargs.read(Path(s.model_repository) / s.model)} if p.engine is not None else {}),
    }


def tune(settings: StudySettings, trials: int, *, timeout_s: float | None = None, storage: str | None = None,
         workers: int = 1, progress: Progress | None = None) -> dict | Handover:
    """Run the study (resuming it if its storage holds it, joining it if other hosts run it), then,
    on the host that finds the search over first, re-measure the best and write the outputs; returns
    the summary, or on the other hosts a `Handover`. UnmeasuredError after writing the outputs when
    no trial could be measured."""
    progress = progress or Progress()
    check_workers(settings, workers)
    new_output = not os.path.lexists(settings.output)
    try:
        return _tune(settings, trials, timeout_s=timeout_s, storage=storage, workers=workers, progress=progress)
    except InputError:
        if new_output:  # refused before anything was written: no empty directory left behind
            _remove_empty_tree(Path(settings.output))
        raise


def check_workers(settings: StudySettings, workers: int) -> None:
    """Refuse more than one worker where the study cannot give each its own server (each worker
    measures on a server of its own)."""
    if workers <= 1:
        return
    if settings.search.strategy == "model":
        raise SettingsError("search.strategy model measures a handful of configurations on one server: "
                            "--workers must be 1")
    if settings.server.launcher == "remote":
        raise SettingsError(f"--workers {workers}: server.launcher remote drives one running server "
                            f"({settings.server.url}), which the workers would each reconfigure under the others' "
                            "measurements: --workers must be 1 (run tuner tune on several hosts sharing the "
                            "study's --storage instead, each with its own server)")


def _remove_empty_tree(path: Path) -> None:
    """Remove `path` if it holds nothing but empty directories (a refusal's leftovers)."""
    with contextlib.suppress(OSError):  # a path the OS refuses was never made
        if not path.is_dir() or any(f.is_file() or f.is_symlink() for f in path.rglob("*")):
            return
        for folder in sorted(path.rglob("*"), key=lambda d: len(d.parts), reverse=True):
            folder.rmdir()
        path.rmdir()


def _tune(settings: StudySettings, trials: int, *, timeout_s: float | None, storage: str | None, workers: int,
          progress: Progress) -> dict | Handover:
    p = prepare(settings, storage)
    s = p.settings
    host = search.this_host()
    incumbent = space.from_config(p.base, s.search, engine=p.engine)
    with search.exclusive(p.storage, s.name):  # hosts starting at once: one creates, each checks
        study = search.open_study(s, p.storage, sampler=search.make_sampler(s.search), incumbent=incumbent,
                                  metadata=_metadata(p), identity=identity(p), host=host)
        search.requeue_interrupted(study)
        own_incumbent = s.search.mixed_gpus and search.claim_incumbent(study, host)
    # once the storage opened: a storage that cannot be reached is its one line, not notes of a study first
    for note in p.notes:
        progress.note(note)
    if s.replay.workers == 0:  # the load generator's processes follow from this host's own limit
        from tuner.replay import calibrate

        progress.note(f"load generator: {calibrate(s.replay.protocol).describe()}")
    total = search.trials_to_run(s.search, trials, incumbent=incumbent)
    open_evaluation = functools.partial(session, s, str(Path(s.output) / "server"))
    # in this process: its replays shown on the bar (workers' processes draw no bar: theirs is the plain one)
    open_here = functools.partial(session, s, str(Path(s.output) / "server"), on_measure=progress.step)
    ran = 0
    handover = None
    model_based = s.search.strategy == "model"
    ranking = _simulate(p, progress) if model_based else None
    planned = [total]  # the model strategy says how many it measures once it has picked them

    def plan(n: int) -> None:
        planned.append(n)
        progress.trials(study, n)

    started = time.monotonic()
    try:
        if not model_based:
            progress.trials(study, total)
        if workers <= 1:
            with open_here() as evaluate_trial:
                if own_incumbent:
                    search.add_incumbent(study, s, evaluate_trial(incumbent, Hints()), host=host)
                if model_based:
                    ran = search.model_search(study, s, ranking, evaluate=evaluate_trial, trials=trials, host=host,
                                              on_trial=lambda _t: progress.trial_done(study), note=progress.note,
                                              timeout_s=timeout_s, on_plan=plan)
                else:
                    ran = search.run_trials(study, s, evaluate_trial, n_trials=trials, timeout_s=timeout_s, host=host,
                                            on_trial=lambda _t: progress.trial_done(study), note=progress.note)
                progress.trial_done(study)  # trials other hosts ended while this one waited count too
                _record_time_limit(study, s, timeout_s=timeout_s, planned=planned[-1], started=started)
                handover = _claim(study, p, host)
                repeats = None if handover else _remeasure(study, evaluate_trial, s, progress=progress)
        else:
            if own_incumbent:
                with open_evaluation() as evaluate_trial:
                    search.add_incumbent(study, s, evaluate_trial(incumbent, Hints()), host=host)
            before = {t.number for t in study.get_trials(deepcopy=False)}
            search.run_workers(s, open_evaluation, p.storage, n_trials=trials, workers=workers, timeout_s=timeout_s,
                               poll=lambda: progress.trial_done(study))
            ran = sum(t.number not in before and t.user_attrs.get("host") == host.name
                      for t in study.get_trials(deepcopy=False))
            _record_time_limit(study, s, timeout_s=timeout_s, planned=total, started=started)
            handover = _claim(study, p, host)
            if not handover:
                with open_evaluation() as evaluate_trial:
                    repeats = _remeasure(study, evaluate_trial, s, progress=progress)
    finally:
        progress.close()
    if handover:  # the trials this host measured: its own incumbent too (a mixed-GPU study's, outside the loop)
        return dataclasses.replace(handover, ran_here=ran + bool(own_incumbent))
    return _write(study, s, repeats)


def _record_time_limit(study: optuna.Study, s: StudySettings, *, timeout_s: float | None, planned: int,
                       started: float) -> None:
    """Keep in the study whether the time limit stopped this run's search (`search.timed_out`), for
    the summary to say (`export.summarize`: `search_timed_out`, as the nightly job's); a later run that
    ran its trials clears it."""
    stopped = search.timed_out(study, planned, timeout_s=timeout_s, started=started)
    limit = f"{'search.timeout_s' if timeout_s == s.search.timeout_s else '--timeout'} {timeout_s:g} s" \
        if timeout_s else None
    study.set_user_attr("search_time_limit", {"limit": limit, "timeout_s": timeout_s, "timed_out": stopped,
                                              "trials": search.spent(study), "planned": planned})


def _simulate(p: Prepared, progress: Progress) -> pd.DataFrame:
    """The model-based strategy's first half: the profile (the study's file, else measured now on a
    server of its own and kept in OUTPUT/profile.csv) and the whole space simulated and ranked
    (OUTPUT/simulation.csv, which the report draws)."""
    from tuner.simulate import read_profile, write_profile

    s = p.settings
    out = Path(s.output)
    earlier, stale = _earlier_profile(p)
    if s.search.profile:
        profile = p.profile or read_profile(s.search.profile, model=s.model)
        progress.note(f"profile: {s.search.profile}: {profile.describe()}")
        if note := stale_profile(profile.model_digest, s, p.base, where=f"search.profile {s.search.profile}"):
            progress.note(f"note: {note}")
    elif earlier is not None and not stale:
        profile = earlier
        progress.note(f"profile: {out / PROFILE} (measured before; remove it to measure again): "
                      f"{profile.describe()}")
    else:
        if stale:  # tuner's own file in its output: measured again, for this model
            progress.note(f"note: {stale}: measuring it again")
        from tuner.profiler import measure_profile
        from tuner.server import make_launcher
        from tuner.simulate import length_column

        started = time.monotonic()
        progress.note("profile: the model warmed up as a trial is, then each execution size timed")
        with make_launcher(s, log_dir=str(out / "server" / "profile")) as launcher:
            run = measure_profile(launcher, s, p.traffic, base=p.base, length_column=length_column(p.traffic),
                                  on_progress=progress.profile_point)
        progress.close()
        write_profile(run.profile, out / PROFILE)
        # ranked with the profile as written (6 significant digits), as `tuner simulate --profile` reads it:
        # one ranking, ties and all
        profile = read_profile(out / PROFILE, model=s.model)
        progress.note(f"profile: measured in {time.monotonic() - started:.0f} s, {out / PROFILE}: "
                      f"{profile.describe()}")
    started = time.monotonic()
    model = search.model_space(s, base=p.base, traffic=p.traffic, profile=profile)
    if model.extrapolated():
        progress.note(f"note: {model.extrapolated()}")
    ranking = model.rank()
    if capped := model.simulator.capped_by_traffic(ranking):  # as `tuner simulate` says it
        progress.note(f"note: {capped}")
    write_atomic(out / SIMULATION, ranking.to_csv(index=False))
    progress.note(f"simulation: {len(ranking)} configurations ranked in {time.monotonic() - started:.1f} s")
    return ranking


def _claim(study: optuna.Study, p: Prepared, host: search.Host) -> Handover | None:
    with search.exclusive(p.storage, p.settings.name):
        by = search.claim_finish(study, host)
    if by is None:
        return None
    return Handover(study.study_name, search.safe_url(p.storage), by, 0, export.hosts(study))


def _write(study: optuna.Study, s: StudySettings, repeats) -> dict:
    summary = export.write_outputs(study, s.output)
    if repeats is not None:  # None: a resumed study had nothing new, the records of its last run stand
        export.write_latency_records(repeats, s.output)
    try:
        summary["report"] = str(write_report(s.output))
    except TunerError as exc:  # the study's outputs stand without the report; say why it is missing
        summary["report_error"] = str(exc)
    counts = summary["trials"]
    if counts["unmeasured"] + counts["unstable"] and not counts["complete"] and not counts["pruned"]:
        raise UnmeasuredError(export.unmeasured_advice(summary))
    return summary


def finish(settings: StudySettings, *, storage: str | None = None, progress: Progress | None = None) -> dict:
    """Re-measure the top configurations of a study other hosts searched, on this host's server, and
    write the outputs (`tuner finish`): for a study whose finishing host stopped, or to re-measure on
    a chosen host. The study must exist and match the study file (and this host's GPU type)."""
    progress = progress or Progress()
    p = prepare(settings, storage)
    s = p.settings
    host = search.this_host()
    with search.exclusive(p.storage, s.name):
        study = search.open_study(s, p.storage, sampler=search.make_sampler(s.search), identity=identity(p),
                                  host=host, create=False)
        search.claim_finish(study, host, force=True)
    try:
        with session(s, str(Path(s.output) / "server")) as evaluate_trial:
            repeats = _remeasure(study, evaluate_trial, s, progress=progress, again=True)
    finally:
        progress.close()
    return _write(study, s, repeats)


def outputs_from_storage(storage: str, name: str | None, output: str | Path, *,
                         settings: StudySettings | None = None) -> dict:
    """Write the outputs of a study from its storage alone, on any machine that reaches it (no
    server): recommended config, summary, trials table and report. The per-request latencies of the
    re-measurement stay with the host that measured them (the report goes without their CDFs). An
    output inside the model's directory is refused as tune refuses it: the model's as `settings` (the
    study file given) or the study file the storage names say, where this host has it."""
    study = search.load_study(storage, name)
    export.check_finished(study)
    settings = settings or recorded_study(study.user_attrs.get("study_file"))
    if settings is not None:
        check_not_in_model(output, settings, label=f"output directory {output}")
    check_outputs_owner(output, study.study_name)
    check_output_dir(output, "output directory")
    summary = export.write_outputs(study, output)
    try:
        summary["report"] = str(write_report(output))
    except TunerError as exc:
        summary["report_error"] = str(exc)
    return summary


def _remeasure(study: optuna.Study, evaluate_trial, settings: StudySettings, *, progress: Progress,
               again: bool = False):
    # a study run again with no new trial keeps its re-measurement (unless asked `again`)
    if (not again and study.user_attrs.get("remeasured_at") == search.finished_count(study)
            and "remeasured" in study.user_attrs):
        return None
    top = search.top_trials(study, settings.search.top_k)
    incumbent = search.incumbent_trial(study)
    n = len(top) + (1 if top and incumbent and all(t.params != incumbent.params for t in top) else 0)
    progress.remeasure(n * settings.search.remeasure_repeats)
    repeats = search.remeasure(study, evaluate_trial, settings, progress=progress.remeasured_one)
    host = search.this_host()
    study.set_user_attr("remeasured", [search.repeats_as_dict(r) for r in repeats])
    study.set_user_attr("remeasured_at", search.finished_count(study))
    study.set_user_attr("remeasured_on", host.as_dict())
    return repeats
