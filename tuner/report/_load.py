"""Read a `tuner tune` output directory into one value the report and the notebook share.

The directory (README.md, "Outputs") holds `summary.json`, `trials.csv`, `recommended/config.pbtxt` and the
Optuna storage. Optional extras make the report richer and are looked for by name; a missing extra
turns its section into a one-line note instead of failing:
- `incumbent/config.pbtxt`, else the model's config in the study's model repository: the diff;
- `records/<name>.{parquet,csv}` with a `latency_ms` column (`incumbent`, `trial_<n>`): latency CDFs,
  else the measured percentiles stand in for them;
- the traffic profile (summary `traffic.path`, else the study YAML's): rate over time, peak, servers;
- `simulation.csv`, the simulated ranking of the whole space (the columns `tuner.simulate.Simulator.rank`
  and `tuner simulate --json` give): the simulated landscape and simulated vs measured. Without it the
  report has no such section (and no note: most studies have no simulation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import pandas as pd

from tuner import export, space
from tuner.errors import InputError, TunerError
from tuner.files import read_json_object
from tuner.formats import first_line
from tuner.measurement import percentile_key
from tuner.score import monthly_cost, servers_needed
from tuner.search import DEFAULT_STORAGE_FILE, open_storage, relative_error
from tuner.traffic import busiest_window, mean_rps, read_traffic
from tuner.traffic.windows import offsets
from tuner.trial import NO_VERDICT

SUMMARY = "summary.json"
TRIALS = "trials.csv"
RECOMMENDED, RECOMMENDED_ENGINE = export.RECOMMENDED, export.RECOMMENDED_ENGINE  # where `tuner tune` writes them
SIMULATION = "simulation.csv"
# the simulation's columns the report needs; the rest (latency, fill rate, feasibility) are optional
SIMULATION_COLUMNS = (space.MAX_BATCH_SIZE, space.QUEUE_DELAY, "capacity_rps", "score_capacity", "score_utilization")

# The columns the report reads, each with the names the tuner's trials.csv may give it
# (its own names first, then Optuna's `trials_dataframe()` names).
COLUMNS: dict[str, tuple[str, ...]] = {
    "number": ("number", "trial"),
    "state": ("state",),
    "capacity_rps": ("capacity_rps", "user_attrs_capacity_rps"),
    # the score per dollar under the study's scoring (a generative study's trials.csv: tokens_per_dollar)
    "requests_per_dollar": ("requests_per_dollar", "tokens_per_dollar", "user_attrs_requests_per_dollar", "value"),
    "score_capacity": ("scores.capacity", "score_capacity", "user_attrs_score_capacity"),
    "score_utilization": ("scores.utilization", "score_utilization", "user_attrs_score_utilization"),
    "latency_p50_ms": ("latency_ms.p50", "latency_p50_ms", "p50_ms", "user_attrs_latency_p50_ms"),
    "latency_p90_ms": ("latency_ms.p90", "latency_p90_ms", "p90_ms", "user_attrs_latency_p90_ms"),
    "latency_p95_ms": ("latency_ms.p95", "latency_p95_ms", "p95_ms", "user_attrs_latency_p95_ms"),
    "latency_p99_ms": ("latency_ms.p99", "latency_p99_ms", "p99_ms", "user_attrs_latency_p99_ms"),
    "latency_max_ms": ("latency_ms.max", "latency_max_ms", "max_ms", "user_attrs_latency_max_ms"),
    "fill_rate": ("fill_rate", "user_attrs_fill_rate"),
    # a generative model's: time to first token and per output token at the recorded load
    **{f"{what}_{q}_ms": (f"{what}_{q}_ms", f"user_attrs_{what}_{q}_ms")
       for what in ("ttft", "tpot") for q in ("p50", "p90", "p95", "p99", "max")},
    # at capacity (`tuner tune` keeps both: at the recorded load and at the capacity found)
    **{f"capacity_latency_{q}_ms": (f"capacity_latency_{q}_ms", f"user_attrs_capacity_latency_{q}_ms")
       for q in ("p50", "p90", "p95", "p99", "max")},
    "capacity_fill_rate": ("capacity_fill_rate", "user_attrs_capacity_fill_rate"),
    # the first speed that missed the SLA, as a rate: the capacity is a bracket [capacity_rps, this]
    "capacity_upper_rps": ("capacity_upper_rps", "user_attrs_capacity_upper_rps"),
    "feasible": ("feasible", "user_attrs_feasible"),
    # measured, unstable, unmeasured, ...: an unstable or unmeasured trial has no verdict (tuner.trial.NO_VERDICT)
    "outcome": ("outcome", "user_attrs_outcome"),
}


@dataclass(kw_only=True)
class StudyOutput:
    """Everything one report shows, read once."""

    path: Path
    summary: dict[str, Any]
    trials: pd.DataFrame               # one row per trial, canonical columns (COLUMNS) + params
    params: list[str]                  # tuned parameter columns of `trials`
    recommended_config: str            # the recommended config.pbtxt, or a vLLM-served model's model.json
    study: optuna.Study | None = None  # None when the storage could not be opened
    storage_url: str | None = None
    incumbent_config: str | None = None  # the incumbent's, of the same kind (`config_file`)
    traffic: pd.DataFrame | None = None  # the recorded traffic table (tuner.traffic.read_traffic)
    traffic_path: str | None = None
    latency_records: dict[str, pd.Series] = field(default_factory=dict)  # label -> latencies (ms)
    latency_repeats: dict[str, int] = field(default_factory=dict)  # label -> the repeats its records pool
    simulation: pd.DataFrame | None = None  # simulation.csv: the simulated ranking of the whole space
    notes: list[str] = field(default_factory=list)  # what was missing, said once each
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    # --- the numbers the report leads with --------------------------------------------------
    @property
    def sla(self) -> dict[str, float]:
        """The study's SLA from the summary: latency_ms, percentile and max_error_rate."""
        return sla_of(self.summary)

    @property
    def price_per_hour(self) -> float | None:
        """One server's price per hour, from the summary (None when it has none)."""
        value = self.summary.get("price_per_hour")
        return float(value) if value is not None else None

    @property
    def unit(self) -> str:
        """What the study's scores count per dollar: "requests", or a generative model's output "tokens"."""
        return "tokens" if self.summary.get("unit") == "tokens" else "requests"

    @property
    def config_file(self) -> str:
        """The file the recommendation is: config.pbtxt, or a vLLM-served model's model.json."""
        return RECOMMENDED_ENGINE.name if self.unit == "tokens" else RECOMMENDED.name

    @property
    def score_label(self) -> str:
        """The score's name in titles and axes."""
        return "output tokens per dollar" if self.unit == "tokens" else "requests per dollar"

    @property
    def score_short(self) -> str:
        """The score's name in a table header or a colour bar."""
        return "tokens/$" if self.unit == "tokens" else "req/$"

    @property
    def latency_name(self) -> str:
        """What the report's latency is: the request's, or for a generative study the TTFT (the TPOT when
        the SLA limits that and not TTFT, end to end when it limits neither), as `sla_of` reads the limit."""
        if self.unit != "tokens":
            return "latency"
        if _dig(self.summary, "sla.ttft_ms") is not None:
            return "TTFT"
        return "TPOT" if _dig(self.summary, "sla.tpot_ms") is not None else "end to end"

    def per_dollar(self, which: str) -> float | None:
        """best/incumbent's score under the study's scoring (`per_dollar`; older summaries:
        `requests_per_dollar`)."""
        value = _dig(self.summary, f"{which}.per_dollar")
        return value if value is not None else _dig(self.summary, f"{which}.requests_per_dollar")

    @property
    def latency_column(self) -> str:
        """The trials column of the SLA's percentile (p99 by default): a generative study's TTFT, TPOT or
        end to end (its latency column)."""
        stem = {"latency": "latency", "TTFT": "ttft", "TPOT": "tpot", "end to end": "latency"}[self.latency_name]
        key = f"{stem}_{percentile_key(self.sla['percentile'])}_ms"  # 100: the max, as the tuner keeps it
        return key if key in self.trials else f"{stem}_p99_ms"

    @property
    def latency_key(self) -> str:
        """The percentile `latency_column` holds, as the summary's latency blocks key it (p99; max for
        sla.percentile 100): what the report's axes, markers and tables read and say."""
        return self.latency_column.split("_")[-2]

    def peak_rps(self) -> float | None:
        """The load's busiest second: the most requests in any one second of the profile at the study's
        speed (or the summary's figure)."""
        if "peak" not in self._cache:
            self._cache["peak"] = self._peak_rps()
        return self._cache["peak"]

    def _peak_rps(self) -> float | None:
        for key in ("peak_rps", "traffic.peak_rps"):
            value = _dig(self.summary, key)
            if value is not None:
                return float(value)
        if self.traffic is None or self.traffic.empty:
            return None
        # requests in the busiest second at the study's speed, as `tuner tune` counts it
        return float(busiest_window(self.traffic, self.speed)[1])

    def load_mean_rps(self) -> float | None:
        """The load's mean rate: the profile's mean rate at the study's speed (or the summary's figure),
        the rate a capacity (the fastest replay that met the SLA, as its mean rate) compares with."""
        traffic = self.summary.get("traffic") or {}
        if traffic.get("load_mean_rps") is not None:
            return float(traffic["load_mean_rps"])
        if traffic.get("mean_rps") is not None:  # a summary before load_mean_rps: the rate at speed 1
            return float(traffic["mean_rps"]) * self.speed
        if self.traffic is None or self.traffic.empty:
            return None
        return mean_rps(self.traffic) * self.speed

    def load_rates(self) -> str:
        """The load's rates as `tuner tune`'s closing note words a capacity's, "mean 10.2 req/s, busiest
        second 238 req/s" (what is unknown left out): a capacity is a mean rate, the servers needed
        compare it with the load's mean, never with its busiest second."""
        mean, busiest = self.load_mean_rps(), self.peak_rps()
        return ", ".join(text for value, text in ((mean, f"mean {mean or 0:,.1f} req/s"),
                                                  (busiest, f"busiest second {busiest or 0:,.0f} req/s"))
                         if value is not None)

    @property
    def speed(self) -> float:
        """The replay speed that stands for the traffic's real load (traffic.speed, default 1)."""
        value = _dig(self.summary, "traffic.speed")
        return float(value) if isinstance(value, (int, float)) and value > 0 else 1.0

    def servers_and_cost(self, which: str) -> tuple[int, float] | None:
        """Servers the load needs (its busiest second included) and their monthly bill, for
        best/incumbent: the tuner's own figures when the summary has them, else the load's mean rate
        over the capacity's, as the tuner counts them (a capacity is a mean rate: its replay's busiest
        second passed the SLA too)."""
        servers, cost = _dig(self.summary, f"{which}.servers_needed"), _dig(self.summary, f"{which}.monthly_cost")
        if servers is not None and cost is not None:
            return int(servers), float(cost)
        capacity = _dig(self.summary, f"{which}.capacity_rps")
        load, price = self.load_mean_rps(), self.price_per_hour
        if not capacity or load is None or price is None:
            return None
        servers = servers_needed(load, float(capacity))
        return servers, monthly_cost(servers, price)

    def summary_latency(self, which: str, at: str = "load") -> dict[str, float]:
        """best/incumbent latency percentiles at the recorded load or at capacity (a generative study's
        TTFT or TPOT: `latency_name`)."""
        # a generative figure's latency_ms is its end-to-end time (trial.record.Figures.of_tokens)
        key = {"latency": "latency_ms", "TTFT": "ttft_ms", "TPOT": "tpot_ms", "end to end": "latency_ms"}[self.latency_name]
        block = _dig(self.summary, f"{which}.at_{at}.{key}") or _dig(self.summary, f"{which}.{key}")
        return {k: float(v) for k, v in (block or {}).items() if v is not None}

    def repeats_measured(self, which: str | int) -> tuple[int, int] | None:
        """How many of a re-measured configuration's repeats were measured, and of how many (a repeat
        with no verdict, lost to Ctrl-C, say, counts in neither its medians nor its records): for
        best/incumbent or a trial number among the summary's re-measured entries; None when the
        configuration was not re-measured."""
        entries = [self.summary.get(w) for w in ("best", "incumbent")] + list(self.summary.get("top") or [])
        entry = self.summary.get(which) if isinstance(which, str) else next(
            (e for e in entries if isinstance(e, dict) and e.get("trial") == which), None)
        repeats = entry.get("repeats") if isinstance(entry, dict) else None
        if not isinstance(repeats, dict) or repeats.get("values") is None:
            return None
        measured = len(repeats["values"])
        return measured, measured + int(repeats.get("unmeasured_runs") or 0)

    def trial_attr(self, number: int | None, key: str) -> Any:
        """A user attribute of one trial in the storage (None without storage or attribute)."""
        if self.study is None or number is None:
            return None
        try:
            return self.study.trials[int(number)].user_attrs.get(key)
        except (IndexError, ValueError, TypeError):
            return None

    def top_trials(self, k: int = 3, *, incumbent: bool = True) -> pd.DataFrame:
        """The k best complete, feasible trials by requests per dollar (a pruned trial's capacity
        search stopped early, so its score is a lower bound); without the incumbent's trial when
        `incumbent` is False (where the incumbent is drawn under its own name)."""
        t = self.trials
        ok = t[(t["state"] == "COMPLETE") & t["feasible"] & t["requests_per_dollar"].notna()]
        top = ok.sort_values("requests_per_dollar", ascending=False).head(k)
        number = _dig(self.summary, "incumbent.trial")
        return top if incumbent or number is None else top[top["number"] != number]


def sla_of(summary: dict[str, Any]) -> dict[str, float]:
    """A summary's SLA as latency_ms, percentile and max_error_rate (defaults for what it lacks)."""
    sla = summary.get("sla") or {}
    if not isinstance(sla, dict):
        sla = {}
    # a generative study's latency is its TTFT (else TPOT, else end to end): `StudyOutput.latency_name`
    limit = next((sla[k] for k in ("ttft_ms", "tpot_ms", "e2e_ms", "latency_ms") if sla.get(k) is not None),
                 float("nan"))
    return {
        "latency_ms": float(limit),
        "percentile": float(sla.get("percentile", 99.0)),
        "max_error_rate": float(sla.get("max_error_rate", 0.001)),
    }


def load_output(path: str | Path) -> StudyOutput:
    """Read a `tuner tune` output directory; InputError (exit 2) when it is not one."""
    path = Path(path)
    if not path.is_dir():
        raise InputError(f"{path}: not a directory (expected a `tuner tune` output directory)")
    for required in (SUMMARY, TRIALS):
        if not (path / required).is_file():
            if (path / DEFAULT_STORAGE_FILE).is_file():  # a study begun here, stopped before its outputs
                raise InputError(f"{path}: the study begun here is not finished ({required} is not written yet): "
                                 "run the same `tuner tune` again to finish it, or `tuner finish` for a study "
                                 "several hosts searched")
            raise InputError(f"{path}: not a study output directory: {required} is missing")
    summary = _read_summary(path / SUMMARY)
    trials = _read_trials(path / TRIALS, summary)
    params = [c for c in trials.columns if c in (*space.NAMES, *space.ENGINE_NAMES) or c.startswith("param.")]
    recommended = export.recommended_path(path)
    out = StudyOutput(
        path=path,
        summary=summary,
        trials=trials,
        params=params,
        recommended_config=recommended.read_text() if recommended.is_file() else "",
    )
    if not out.recommended_config:
        out.notes.append(f"{recommended.relative_to(path)} is missing: no config diff")
    out.study, out.storage_url = _open_study(path, summary, out.notes)
    if out.study is not None:
        _fill_from_study(out.trials, out.study, summary)
    if out.unit == "tokens":  # Triton does not batch a vLLM-served model: no fill rate to show
        out.trials["fill_rate"] = float("nan")
    out.incumbent_config = _incumbent_config(path, summary, out.notes)
    out.traffic, out.traffic_path = _traffic(path, summary, out.notes)
    out.latency_records = _latency_records(path, out)
    out.simulation = _simulation(path / SIMULATION, out.notes)
    return out


def traffic_rate(traffic: pd.DataFrame, bins: int = 200) -> pd.DataFrame:
    """Requests per second over time, in bins of at least one second."""
    t = offsets(traffic)
    span = float(t.max()) if len(t) else 0.0
    width = max(1.0, span / bins)
    index = (t // width).astype(int)
    counts = pd.Series(1, index=index).groupby(level=0).sum()
    counts = counts.reindex(range(int(index.max()) + 1 if len(t) else 0), fill_value=0)
    return pd.DataFrame({"t_s": counts.index * width, "rps": counts.to_numpy() / width, "bin_s": width})


# --- pieces ------------------------------------------------------------------------------------

def _dig(data: dict[str, Any], dotted: str) -> Any:
    """summary["best"]["latency_ms"]["p99"] for "best.latency_ms.p99", also flat "best.x" keys."""
    if dotted in data:
        return data[dotted]
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _read_summary(path: Path) -> dict[str, Any]:
    summary = read_json_object(path)
    # best is null when no configuration met the SLA: still a study worth a report
    for key in ("best", "incumbent"):
        if key not in summary or not isinstance(summary[key], (dict, type(None))):
            raise InputError(f"{path}: key {key!r} is missing or not an object")
    return summary


def _read_trials(path: Path, summary: dict[str, Any]) -> pd.DataFrame:
    try:
        raw = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read as CSV: {exc}") from None
    frame = pd.DataFrame(index=raw.index)
    for name, candidates in COLUMNS.items():
        found = next((c for c in candidates if c in raw.columns), None)
        frame[name] = raw[found] if found else pd.NA
    if frame["number"].isna().all():
        frame["number"] = range(len(raw))
    for column in raw.columns:
        name = column.removeprefix("params_").removeprefix("param.").removeprefix("params.")
        if name in (*space.NAMES, *space.ENGINE_NAMES) and name not in frame:
            frame[name] = raw[column]
    numeric = [c for c in COLUMNS if c not in ("state", "feasible", "outcome")]
    frame[numeric] = frame[numeric].apply(pd.to_numeric, errors="coerce")
    if frame["requests_per_dollar"].isna().all():  # the score under the study's scoring
        frame["requests_per_dollar"] = frame[f"score_{summary.get('scoring') or 'capacity'}"]
    frame["state"] = frame["state"].fillna("COMPLETE").astype(str).str.upper().str.removeprefix("TRIALSTATE.")
    frame["feasible"] = _feasible(frame, raw, summary)
    frame["no_verdict"] = frame["outcome"].isin(NO_VERDICT)  # neither feasible nor infeasible: not judged
    return frame


def _feasible(frame: pd.DataFrame, raw: pd.DataFrame, summary: dict[str, Any]) -> pd.Series:
    """The verdict `tuner tune` wrote (`tuner.trial.is_feasible`, the one definition); a table
    without it has no feasible trial."""
    return frame["feasible"].map(lambda v: str(v).strip().lower() == "true").astype(bool)


ATTRS = {  # canonical column -> the trial user attribute the tuner keeps it under
    "capacity_rps": "capacity_rps", "score_capacity": "score_capacity",
    "score_utilization": "score_utilization", "fill_rate": "fill_rate",
    **{f"latency_{q}_ms": f"latency_{q}_ms" for q in ("p50", "p90", "p95", "p99", "max")},
}


def _fill_from_study(trials: pd.DataFrame, study: optuna.Study, summary: dict[str, Any]) -> None:
    """Columns trials.csv left empty, from the trials' user attributes in the storage."""
    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    numbers = trials["number"]
    for column, attr in ATTRS.items():
        if trials[column].isna().all():
            values = [by_number[n].user_attrs.get(attr) if n in by_number else None for n in numbers]
            trials[column] = pd.to_numeric(pd.Series(values, index=trials.index), errors="coerce")
    if trials["requests_per_dollar"].isna().all():
        scoring = summary.get("scoring") or study.user_attrs.get("scoring") or "capacity"
        trials["requests_per_dollar"] = trials[f"score_{scoring}"]


def _storage_url(path: Path, summary: dict[str, Any]) -> str | None:
    url = summary.get("storage")
    if isinstance(url, str) and url:
        return url
    for pattern, scheme in (("*.db", "sqlite"), ("*.sqlite3", "sqlite"), ("*.sqlite", "sqlite"),
                            ("*.journal", "journal"), ("*.log", "journal")):
        found = sorted(path.glob(pattern))
        if found:
            return f"sqlite:///{found[0].resolve()}" if scheme == "sqlite" else str(found[0].resolve())
    return None


def _open_study(path: Path, summary: dict[str, Any], notes: list[str]) -> tuple[optuna.Study | None, str | None]:
    url = _storage_url(path, summary)
    if url is None:
        notes.append("no Optuna storage in the output directory: no search history or importance")
        return None, None
    if "://" not in url and not Path(url).is_file():
        notes.append(f"the Optuna storage {url} does not exist: no search history or importance")
        return None, url
    try:
        storage = open_storage(url)  # as `tuner tune` opens it (journal file lock, SQLite timeout)
        names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
        name = summary.get("study_name") or summary.get("study")
        if not isinstance(name, str) or name not in names:
            if len(names) != 1:
                notes.append(f"{url}: holds studies {names}; summary.json names none of them")
                return None, url
            name = names[0]
        return optuna.load_study(study_name=name, storage=storage), url
    except (TunerError, optuna.exceptions.OptunaError, ValueError, OSError) as exc:
        notes.append(f"cannot open the Optuna storage {url}: {exc}")
        return None, url


def _study_yaml(path: Path, summary: dict[str, Any]):
    """The study settings, from the path summary.json names or a copy in the output directory."""
    from tuner.settings import read_study

    for candidate in (summary.get("study_file"), path / "study.yaml"):
        if candidate and Path(candidate).is_file():
            try:
                return read_study(candidate)
            except TunerError:
                return None
    return None


def _incumbent_config(path: Path, summary: dict[str, Any], notes: list[str]) -> str | None:
    """The incumbent's config.pbtxt (a vLLM-served model's model.json): the output's copy, else the study's
    model repository's."""
    name = RECOMMENDED_ENGINE.name if summary.get("unit") == "tokens" else RECOMMENDED.name
    candidates = [path / "incumbent" / name] + ([_dig(summary, "incumbent.config_path")] if name == "config.pbtxt" else [])
    settings = _study_yaml(path, summary)
    if settings is not None:
        model = Path(settings.model_repository) / settings.model
        if name == "config.pbtxt":
            candidates.append(model / name)
        else:
            from tuner.llm.engineargs import version_dir

            candidates.append(version_dir(model) / name)
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate).read_text()
    notes.append(f"incumbent/{name} was not found: no config diff")
    return None


def _traffic(path: Path, summary: dict[str, Any], notes: list[str]) -> tuple[pd.DataFrame | None, str | None]:
    source = _dig(summary, "traffic.path") or summary.get("traffic_path")
    if not source:
        settings = _study_yaml(path, summary)
        source = settings.traffic.path if settings is not None else None
    if not source or not Path(source).is_file():
        notes.append("the traffic profile was not found: no rate over time, peak or servers needed")
        return None, source
    try:
        return read_traffic(source), str(source)
    except TunerError as exc:
        notes.append(f"cannot read the traffic profile: {exc}")
        return None, str(source)


def _latency_records(path: Path, out: StudyOutput) -> dict[str, pd.Series]:
    """records/: the incumbent's and the top trials' latencies (the incumbent's trial once: `tuner tune`
    writes its records under both names); how many repeats each pools into `out.latency_repeats`."""
    labels = {"incumbent": "incumbent"}
    for number in out.top_trials(3, incumbent=False)["number"]:
        labels[f"trial_{int(number)}"] = f"trial {int(number)}"
    records: dict[str, pd.Series] = {}
    for stem, label in labels.items():
        for suffix in (".parquet", ".csv"):
            file = path / "records" / f"{stem}{suffix}"
            if not file.is_file():
                continue
            try:
                frame = pd.read_parquet(file) if suffix == ".parquet" else pd.read_csv(file)
                records[label] = frame["latency_ms"].dropna()
                out.latency_repeats[label] = int(frame["repeat"].nunique()) if "repeat" in frame else 1
            except (KeyError, ValueError, OSError) as exc:
                out.notes.append(f"{file}: cannot read latencies: {exc}")
            break
    return records


def preferred_label(value: Any, batch: int) -> str:
    """A trial's preferred_batch_size (a strategy name or sizes) as the simulation writes it:
    `default` for none, else the sizes joined by commas."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value in ("none", "default", ""):
        return "default"
    if isinstance(value, str) and value in space.STRATEGIES:
        sizes = space.preferred_sizes(value, int(batch))
        return ",".join(map(str, sizes)) if sizes else "default"
    text = str(value).strip("()[] ")
    return ",".join(part.strip() for part in text.split(",") if part.strip()) or "default"


def simulated_vs_measured(out: StudyOutput) -> pd.DataFrame:
    """One row per measured trial that the simulation has (same max_batch_size and delay, and the same
    instance count, queue size and preferred sizes where both tell them): trial number, parameters, and
    capacity, the SLA's latency percentile at the recorded load, fill rate and the scoring's requests
    per dollar, `measured_*` beside `simulated_*`; and `capacity_error` as the model strategy judges it
    (`tuner.search.relative_error`: the simulation's finest capacity, its ranking's, against the
    measured bracket, no error inside it)."""
    sim, t = out.simulation, out.trials
    if sim is None:
        return pd.DataFrame()
    scoring = out.summary.get("scoring") or "capacity"
    # the simulation's figure of the same percentile as the measured one, else none (its p99 is no max)
    sim_latency = f"latency_{out.latency_key}_ms"
    measured = t[t["state"].isin(("COMPLETE", "PRUNED")) & t[out.latency_column].notna()]
    x, y, more = space.MAX_BATCH_SIZE, space.QUEUE_DELAY, (space.INSTANCES, space.QUEUE_SIZE)
    keys = [k for k in more if k in measured.columns and k in sim.columns]
    rows = []
    for _, trial in measured.iterrows():
        mbs, delay = trial.get(x), trial.get(y)
        if pd.isna(mbs) or pd.isna(delay):
            continue
        match = sim[(sim[x] == int(mbs)) & (sim[y] == int(delay))]
        for key in keys:
            match = match[match[key] == trial[key]]
        if space.PREFERRED in match.columns and len(match) > 1:
            label = preferred_label(trial.get(space.PREFERRED), int(mbs))
            same = match[match[space.PREFERRED].astype(str) == label]
            match = same if len(same) else match
        if match.empty:
            continue
        order = [c for c in more if c in match.columns]
        s = match.sort_values(order).iloc[0] if order else match.iloc[0]  # else Triton's defaults first
        feasible = bool(trial["feasible"])
        measured_capacity = float(trial["capacity_rps"]) if feasible and pd.notna(trial["capacity_rps"]) else 0.0
        upper = float(trial["capacity_upper_rps"]) if pd.notna(trial["capacity_upper_rps"]) else None
        # the estimate the strategy judged: the ranking's 1 % bisection where the simulation kept it
        fine = s["ranking_capacity_rps"] if "ranking_capacity_rps" in s and pd.notna(s["ranking_capacity_rps"]) \
            else s["capacity_rps"]
        simulated_capacity = float(fine) if pd.notna(fine) else 0.0
        rows.append({
            "number": int(trial["number"]),
            **{p: trial[p] for p in out.params},
            "measured_feasible": feasible,
            "simulated_feasible": bool(s["feasible"]) if "feasible" in s and pd.notna(s["feasible"])
            else bool(pd.notna(s[f"score_{scoring}"]) and s[f"score_{scoring}"] > 0),
            "measured_capacity_rps": measured_capacity,
            "measured_capacity_upper_rps": upper if upper is not None else math.nan,
            "simulated_capacity_rps": simulated_capacity,
            "capacity_error": relative_error(simulated_capacity, measured_capacity, upper=upper,
                                             pruned=trial["state"] == "PRUNED"),
            "measured_latency_ms": float(trial[out.latency_column]),
            "simulated_latency_ms": float(s[sim_latency]) if sim_latency in s and pd.notna(s[sim_latency]) else math.nan,
            "measured_fill_rate": float(trial["fill_rate"]) if pd.notna(trial["fill_rate"]) else math.nan,
            "simulated_fill_rate": float(s["fill_rate"]) if "fill_rate" in s and pd.notna(s["fill_rate"]) else math.nan,
            "measured_requests_per_dollar": float(trial[f"score_{scoring}"]) if feasible
            and pd.notna(trial[f"score_{scoring}"]) else 0.0,
            "simulated_requests_per_dollar": float(s[f"score_{scoring}"]) if pd.notna(s[f"score_{scoring}"]) else 0.0,
        })
    return pd.DataFrame(rows)


def _simulation(path: Path, notes: list[str]) -> pd.DataFrame | None:
    """simulation.csv when the directory has one (None, and a note if it cannot be used)."""
    if not path.is_file():
        return None
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as exc:
        notes.append(f"{path}: cannot read as CSV ({first_line(exc)}): no simulated landscape")
        return None
    missing = [c for c in SIMULATION_COLUMNS if c not in frame.columns]
    if missing:
        notes.append(f"{path}: no column {missing[0]!r} (expected the columns of tuner simulate's ranking): "
                     f"no simulated landscape")
        return None
    if frame.empty:
        notes.append(f"{path}: no configurations: no simulated landscape")
        return None
    return frame
