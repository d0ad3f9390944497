"""What a finished study leaves behind (DESIGN §3), built from the Optuna storage alone:

    write_outputs(study, output_dir) -> dict   recommended/config.pbtxt, incumbent/config.pbtxt,
                                               summary.json, trials.csv; returns the summary
    summarize(study) -> dict                   the summary (best, incumbent, improvement, ...)
    recommended_config(study, summary) -> str  the user's config with only the tuned fields changed
    closing_table(summary) -> str              the terminal's closing table
    load_study(storage, name) / export(...)    for `tuner export`
    write_latency_records(remeasured, dir)     records/<trial_N|incumbent>.parquet: the re-measured
                                               configurations' per-request latencies at capacity

The study's user attributes (written by `tuner tune` when it creates the study) carry what the
outputs need besides the trials: the base config text, SLA, traffic, scoring and price.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path

import optuna
import pandas as pd
from optuna.trial import TrialState

from tuner import __version__, modelconfig
from tuner.errors import InputError, NoFeasibleConfigError, SettingsError
from tuner.evaluate import trial_config
from tuner.search import Remeasured, incumbent_trial, open_storage, top_trials
from tuner.settings import SearchSettings

SUMMARY = "summary.json"
TRIALS = "trials.csv"
RECOMMENDED = Path("recommended") / "config.pbtxt"
INCUMBENT = Path("incumbent") / "config.pbtxt"
RECORDS = Path("records")
PERCENTILES = ("p50", "p90", "p95", "p99", "max")


# --- the summary -------------------------------------------------------------------------------


def _entry(params: dict, attrs: dict, capacity_rps: float | None, scores: dict, scoring: str,
           trial: int | None, feasible: bool, capacity_speed: float | None = None) -> dict:
    """One configuration's figures; latency and fill rate at the scoring's operating point
    (capacity: at the capacity found; utilization: at the recorded load), both kept."""

    def block(prefix: str) -> dict:
        return {"latency_ms": {p: attrs.get(f"{prefix}latency_{p}_ms") for p in PERCENTILES},
                "fill_rate": attrs.get(f"{prefix}fill_rate"),
                "mean_batch_size": attrs.get(f"{prefix}mean_batch_size"),
                "queue_ms": attrs.get(f"{prefix}queue_ms"),
                "compute_ms": attrs.get(f"{prefix}compute_ms"),
                "error_rate": attrs.get(f"{prefix}error_rate")}

    at_load, at_capacity = block(""), block("capacity_")
    point = at_capacity if scoring == "capacity" and at_capacity["latency_ms"]["p99"] is not None else at_load
    return {
        "trial": trial,
        "params": dict(params),
        "feasible": bool(feasible),
        "capacity_rps": capacity_rps,
        "capacity_speed": capacity_speed,  # the replay speed of the recorded traffic at capacity
        "requests_per_dollar": scores.get(scoring),
        "scores": {"capacity": scores.get("capacity"), "utilization": scores.get("utilization")},
        "latency_ms": point["latency_ms"],
        "fill_rate": point["fill_rate"],
        "queue_ms": point["queue_ms"],
        "compute_ms": point["compute_ms"],
        "servers_needed": attrs.get("servers_needed"),
        "monthly_cost": attrs.get("monthly_cost"),
        "sla_reason": attrs.get("sla_reason") or "",
        "at_load": at_load,
        "at_capacity": at_capacity,
    }


def _from_trial(t: optuna.trial.FrozenTrial, scoring: str) -> dict:
    a = t.user_attrs
    scores = {"capacity": a.get("score_capacity"), "utilization": a.get("score_utilization")}
    feasible = bool(a.get("feasible")) and all(c <= 0 for c in t.constraints.values())
    return _entry(a.get("config") or t.params, a, a.get("capacity_rps"), scores, scoring, t.number, feasible,
                  a.get("capacity_speed"))


def _from_remeasured(r: dict, scoring: str) -> dict:
    e = _entry(r["params"], r.get("attrs", {}), r.get("capacity_rps"), r.get("scores", {}), scoring,
               r.get("trial"), r.get("feasible_runs", 0) > 0 and r.get("median", 0) > 0, r.get("capacity_speed"))
    e["requests_per_dollar"] = r.get("median")  # the median over the repeats: what was compared
    e["repeats"] = {"values": r.get("values"), "spread": r.get("spread"),
                    "feasible_runs": r.get("feasible_runs")}
    return e


def trial_counts(study: optuna.Study) -> dict:
    trials = study.get_trials(deepcopy=False)
    states = [t.state for t in trials]
    feasible = [t for t in trials if t.state == TrialState.COMPLETE and t.user_attrs.get("feasible")
                and all(c <= 0 for c in t.constraints.values())]
    return {"total": len(trials), "complete": states.count(TrialState.COMPLETE),
            "feasible": len(feasible), "failed": states.count(TrialState.FAIL),
            "pruned": states.count(TrialState.PRUNED), "running": states.count(TrialState.RUNNING)}


def summarize(study: optuna.Study) -> dict:
    meta = study.user_attrs
    scoring = meta.get("scoring", "capacity")
    sla = meta.get("sla") or {}
    remeasured = [_from_remeasured(r, scoring) for r in meta.get("remeasured") or []]
    ranked = sorted((r for r in remeasured if r["feasible"]), key=lambda r: r["requests_per_dollar"] or 0,
                    reverse=True)
    if ranked:
        best = ranked[0]
    else:
        top = top_trials(study, 1)
        best = _from_trial(top[0], scoring) if top else None
    inc_runs = [r for r in remeasured if r["trial"] is not None and _is_incumbent(study, r["trial"])]
    inc_trial = incumbent_trial(study)
    incumbent = inc_runs[0] if inc_runs else (_from_trial(inc_trial, scoring) if inc_trial else None)

    improvement = None
    if best and incumbent and incumbent["feasible"] and (incumbent["requests_per_dollar"] or 0) > 0:
        improvement = best["requests_per_dollar"] / incumbent["requests_per_dollar"] - 1.0

    summary: dict = {
        "tuner_version": __version__,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "study_name": study.study_name,
        "storage": meta.get("storage"),
        "study_file": meta.get("study_file"),
        "model": meta.get("model"),
        "scoring": scoring,
        "sla": sla,
        "traffic": meta.get("traffic") or {},
        "price_per_hour": (meta.get("price") or {}).get("price_per_hour"),
        "price": meta.get("price") or {},
        "feasible": best is not None,
        "best": best,
        "incumbent": incumbent,
        "improvement": improvement,
        "top": ranked or ([best] if best else []),
        "trials": trial_counts(study),
    }
    if best is None:
        closest = _closest(study, scoring)
        summary["closest"] = closest
        what = f"p{sla.get('percentile', 99):g} <= {sla.get('latency_ms')} ms, errors <= " \
               f"{sla.get('max_error_rate', 0.001):.2%}"
        summary["message"] = (
            f"no configuration met the SLA ({what})"
            + (f"; closest: trial {closest['trial']} {_params_text(closest['params'])}"
               f" ({closest['sla_reason'] or 'SLA not met'})" if closest else "")
        )
    elif improvement is None:
        summary["message"] = "the incumbent did not meet the SLA: the recommendation is the first that does"
    else:
        summary["message"] = f"{improvement:+.1%} requests per dollar over the incumbent"
    return summary


def _is_incumbent(study: optuna.Study, number: int) -> bool:
    return bool(study.trials[number].user_attrs.get("incumbent"))


def _closest(study: optuna.Study, scoring: str) -> dict | None:
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.constraints]
    if not done:
        return None
    t = min(done, key=lambda t: max(t.constraints.values()))
    entry = _from_trial(t, scoring)
    entry["violation"] = max(t.constraints.values())
    return entry


def _params_text(params: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())


# --- the config --------------------------------------------------------------------------------


def recommended_config(study: optuna.Study, summary: dict) -> str:
    """The base config with only the tuned fields changed, under a comment header."""
    if not summary.get("best"):
        raise NoFeasibleConfigError(summary.get("message") or "no configuration met the SLA")
    base_text = study.user_attrs.get("base_config")
    if not base_text:
        raise InputError(f"study {study.study_name!r} holds no base config (was it made by `tuner tune`?)")
    base = modelconfig.parse(base_text, "<base config>")
    space = SearchSettings(preferred_batch_size=study.user_attrs.get("preferred_batch_size", "none"))
    config = trial_config(base, summary["best"]["params"], space)
    modelconfig.validate(config, "recommended config")
    return _header(summary, base, config) + modelconfig.to_text(
        config, comments_from=study.user_attrs.get("base_config_source"))


def _header(summary: dict, base, config) -> str:
    sla, traffic, best = summary["sla"], summary["traffic"], summary["best"]
    changed = [f"{name}: {old} -> {new}" for name, old, new in modelconfig.diff_fields(base, config)]
    lines = [
        f"Recommended by tuner {summary['tuner_version']} on {summary['date']} (study {summary['study_name']!r})",
        f"SLA: p{sla.get('percentile', 99):g} latency <= {sla.get('latency_ms')} ms, "
        f"error rate <= {sla.get('max_error_rate', 0.001):.2%}",
        f"traffic: {traffic.get('path')} at speed {traffic.get('speed', 1.0):g}"
        + (f", window {traffic['window']}" if traffic.get("window") else ""),
        f"score ({summary['scoring']}): {_fmt(best['requests_per_dollar'])} requests per dollar"
        f" at ${_fmt(summary.get('price_per_hour'))}/h; capacity {_fmt(best['capacity_rps'])} req/s",
        "improvement over the incumbent: "
        + (f"{summary['improvement']:+.1%}" if summary.get("improvement") is not None else "n/a (incumbent missed the SLA)"),
        "changed: " + ("; ".join(changed) if changed else "nothing (the incumbent is best)"),
    ]
    return "".join(f"# {line}\n" for line in lines) + "\n"


# --- tables ------------------------------------------------------------------------------------


def trials_frame(study: optuna.Study) -> pd.DataFrame:
    """One row per trial: parameters, measurements, state."""
    skip = {"host", "pid", "config"}
    rows = []
    for t in study.get_trials(deepcopy=False):
        row = {"number": t.number, "state": t.state.name, **t.params,
               "value": t.value, "sla_violation": max(t.constraints.values()) if t.constraints else None,
               "duration_s": t.duration.total_seconds() if t.duration else None}
        for key, value in t.user_attrs.items():
            if key not in skip:
                row[key] = value
        scoring = study.user_attrs.get("scoring", "capacity")
        row["requests_per_dollar"] = t.user_attrs.get(f"score_{scoring}")
        rows.append(row)
    return pd.DataFrame(rows)


def closing_table(summary: dict) -> str:
    """Top configurations and the incumbent: parameters, capacity, SLA percentile, fill rate,
    Triton's queue and compute time, requests per dollar, improvement over the incumbent."""
    pct = f"p{summary['sla'].get('percentile', 99):g}"
    rows = list(summary.get("top") or [])[:5]
    inc = summary.get("incumbent")
    if inc and all(r.get("trial") != inc.get("trial") for r in rows):
        rows.append(inc)
    if not rows and summary.get("closest"):
        rows = [summary["closest"]]
    base = inc["requests_per_dollar"] if inc and inc["feasible"] and inc["requests_per_dollar"] else None
    table = []
    for r in rows:
        tag = "incumbent" if inc and r.get("trial") == inc.get("trial") else (
            "best" if summary.get("best") and r.get("trial") == summary["best"].get("trial") else "")
        spread = (r.get("repeats") or {}).get("spread")
        table.append({
            "": tag,
            "trial": r.get("trial"),
            **{k: v for k, v in r["params"].items()},
            "capacity req/s": _fmt(r.get("capacity_rps")),
            f"{pct} ms": _fmt(r["latency_ms"].get(pct)),
            "fill rate": _fmt(r.get("fill_rate")),
            "queue ms": _fmt(r.get("queue_ms")),
            "compute ms": _fmt(r.get("compute_ms")),
            "req/$": _fmt(r.get("requests_per_dollar")) if r["feasible"] else "SLA missed",
            "spread": f"{spread:.0%}" if isinstance(spread, (int, float)) else "",
            "vs incumbent": (f"{r['requests_per_dollar'] / base - 1:+.1%}"
                             if base and r["feasible"] and r.get("requests_per_dollar") else ""),
        })
    frame = pd.DataFrame(table).rename(columns={"max_batch_size": "batch", "max_queue_delay_microseconds": "delay us",
                                                "instance_count": "instances", "preferred_batch_size": "preferred"})
    return frame.to_string(index=False)


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, float):
        if abs(value) >= 1e5:
            return f"{value:,.0f}"
        return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


# --- files -------------------------------------------------------------------------------------


def write_outputs(study: optuna.Study, output_dir: str | Path) -> dict:
    """Write the outputs of a finished study; the summary says whether anything met the SLA."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(study)
    trials_frame(study).to_csv(out / TRIALS, index=False)
    base_text = study.user_attrs.get("base_config_source") or study.user_attrs.get("base_config")
    if base_text:
        (out / INCUMBENT).parent.mkdir(parents=True, exist_ok=True)
        (out / INCUMBENT).write_text(base_text)
    if summary["best"]:
        (out / RECOMMENDED).parent.mkdir(parents=True, exist_ok=True)
        (out / RECOMMENDED).write_text(recommended_config(study, summary))
    (out / SUMMARY).write_text(json.dumps(summary, indent=2, default=_json_default) + "\n")
    return summary


def write_latency_records(remeasured: list[Remeasured], output_dir: str | Path) -> list[Path]:
    """The per-request latencies at capacity of each re-measured configuration, all repeats together
    (`repeat` says which), for the report's latency CDFs. Only this run's measurements: files of an
    earlier run of the same study are replaced, never mixed in."""
    out = Path(output_dir) / RECORDS
    for stale in [*out.glob("trial_*.parquet"), *out.glob("incumbent.parquet")]:
        stale.unlink()
    written = []
    for r in remeasured:
        frames = [pd.DataFrame({"repeat": i, "latency_ms": list(result.latencies_ms)})
                  for i, result in enumerate(r.results) if result.latencies_ms]
        if not frames:
            continue
        out.mkdir(parents=True, exist_ok=True)
        records = pd.concat(frames, ignore_index=True)
        for name in [f"trial_{r.trial}.parquet"] + (["incumbent.parquet"] if r.incumbent else []):
            records.to_parquet(out / name, index=False)
            written.append(out / name)
    return written


def _json_default(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)


def load_study(storage: str, name: str | None) -> optuna.Study:
    """A study from any Optuna storage (URL or journal file); `name` may be omitted if it holds one."""
    if "://" not in storage and not Path(storage).is_file():
        raise SettingsError(f"{storage}: no such storage file")
    backend = open_storage(storage)
    names = [s.study_name for s in optuna.get_all_study_summaries(backend)]
    if name is None:
        if len(names) != 1:
            raise SettingsError(f"{storage}: holds {len(names)} studies ({', '.join(names) or 'none'}): "
                                f"name one with --study")
        name = names[0]
    if name not in names:
        raise SettingsError(f"{storage}: no study named {name!r} (it holds: {', '.join(names) or 'none'})")
    return optuna.load_study(study_name=name, storage=backend)


def storage_of(output_dir: str | Path) -> tuple[str, str | None]:
    """The storage and study name a `tuner tune` output directory records."""
    out = Path(output_dir)
    if not out.is_dir():
        raise SettingsError(f"{out}: no such output directory")
    summary_path = out / SUMMARY
    if summary_path.is_file():
        try:
            summary = json.loads(summary_path.read_text())
        except json.JSONDecodeError as exc:
            raise SettingsError(f"{summary_path}: not JSON: {exc}") from None
        if summary.get("storage"):
            return summary["storage"], summary.get("study_name")
    journal = out / "study.journal"
    if journal.is_file():
        return str(journal), None
    raise SettingsError(f"{out}: no summary.json or study.journal: not a `tuner tune` output directory")


def export(storage: str, name: str | None, output: str | Path) -> Path:
    """Write the recommended config of a finished study to `output`."""
    study = load_study(storage, name)
    text = recommended_config(study, summarize(study))
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
