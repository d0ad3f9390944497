"""What a finished study leaves behind, built from the Optuna storage alone:

    write_outputs(study, output_dir) -> dict   recommended/config.pbtxt (a vLLM-backend model's:
                                               recommended/model.json), incumbent/config.pbtxt,
                                               summary.json, trials.csv; returns the summary
    summarize(study) -> dict                   the summary (best, incumbent, improvement, ...)
    recommended_config(study, summary) -> str  the user's config with only the tuned fields changed
    closing_table(summary) -> str              the terminal's closing table
    hosts(study) -> list[dict]                 who measured the study: host, GPU type, trials each
    export(storage, name, output)              for `tuner export`
    write_latency_records(repeats, dir)        records/<trial_N|incumbent>.parquet: the re-measured
                                               configurations' per-request latencies at capacity

Every file is written whole or not at all (`tuner.files.write_atomic`). The study's user attributes
(written by `tuner tune` when it creates the study) carry what the outputs need besides the trials:
the base config text, SLA, traffic, scoring and price.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import io
import json
import math
import os
from pathlib import Path

import optuna
import pandas as pd

from tuner import __version__, modelconfig, space
from tuner.errors import InputError, NoFeasibleConfigError, OutputError, SettingsError
from tuner.files import check_replaceable, check_writable, os_reason, read_json_object, write_atomic
from tuner.formats import figure
from tuner.llm import engineargs
from tuner.llm.engine_metrics import OVERRUN_LIMIT
from tuner.llm.engine_watch import BATCH_FIGURES
from tuner.measurement import percentile_key
from tuner.measurement_tokens import WINDOW_LIVES, short_window
from tuner.paths import writable_file
from tuner.search import (
    DEFAULT_STORAGE_FILE,
    JOURNAL_FILE,
    Repeats,
    config_of,
    counts,
    finished_count,
    incumbent_trial,
    load_study,
    met_sla,
    recommend,
    tally,
    top_trials,
    without_password,
)
from tuner.settings import SearchSettings
from tuner.study import check_not_in_model, check_not_input, recorded_study
from tuner.trial import NO_VERDICT, TrialRecord, from_attrs, is_feasible, record_of

__all__ = ["RECOMMENDED", "RECOMMENDED_ENGINE", "SUMMARY", "TRIALS", "check_command", "check_finished", "closing_table", "export",
           "hosts", "hosts_table", "recommended_config", "recommended_entry", "recommended_engine", "recommended_path", "recommended_text",
           "sla_limits", "storage_of", "study_unit", "summarize", "trials_frame", "unmeasured_advice",
           "write_latency_records", "write_outputs"]

# the rounding of one score computed two ways (a range's edge from the speeds, the score from the rate):
# scores that differ by less, relatively, are the same score
_ROUNDING = 1e-9

SUMMARY = "summary.json"
TRIALS = "trials.csv"
RECOMMENDED = Path("recommended") / "config.pbtxt"
RECOMMENDED_ENGINE = Path("recommended") / "model.json"  # a vLLM-backend model's (tuner.llm.engineargs.ENGINE_FILE)
INCUMBENT = Path("incumbent") / "config.pbtxt"
INCUMBENT_ENGINE = Path("incumbent") / "model.json"  # a vLLM-backend model's engine arguments as the study found them
RECORDS = Path("records")
PERCENTILES = ("p50", "p90", "p95", "p99", "max")


# --- the summary -------------------------------------------------------------------------------


def _block(record: TrialRecord, at: str) -> dict:
    figures = record.at_load if at == "load" else (record.capacity.at_capacity if record.capacity else None)
    if figures is None:
        return {"latency_ms": {p: None for p in PERCENTILES}, "fill_rate": None,
                "mean_batch_size": None, "queue_ms": None, "compute_ms": None, "error_rate": None}
    block = {"latency_ms": _percentiles(figures.latency_ms), "fill_rate": figures.fill_rate,
             "mean_batch_size": figures.mean_batch_size, "queue_ms": figures.queue_ms,
             "compute_ms": figures.compute_ms, "error_rate": figures.error_rate}
    if figures.generative:  # latency_ms is then end to end
        block.update(ttft_ms=_percentiles(figures.ttft_ms), tpot_ms=_percentiles(figures.tpot_ms),
                     output_tokens_per_s=figures.output_tokens_per_s, total_tokens_per_s=figures.total_tokens_per_s,
                     goodput_rps=figures.goodput_rps, streamed_tokens_per_s=figures.streamed_tokens_per_s,
                     engine={name: getattr(figures, name) for name in BATCH_FIGURES})  # the engine's own batching
    return block


def _percentiles(values: dict) -> dict:
    out = {p: values.get(p) for p in PERCENTILES}
    out.update({k: v for k, v in values.items() if k not in out})  # the SLA's own percentile
    return out


def _entry(record: TrialRecord, scoring: str, trial: int | None, *, feasible: bool) -> dict:
    """One configuration's figures; latency and fill rate at the scoring's operating point
    (capacity: at the capacity found; utilization: at the recorded load), both kept."""
    at_load, at_capacity = _block(record, "load"), _block(record, "capacity")
    point = at_capacity if scoring == "capacity" and at_capacity["latency_ms"].get("p99") is not None else at_load
    b = record.capacity
    return {
        "trial": trial,
        "params": {k: list(v) if isinstance(v, tuple) else v for k, v in record.params.items()},
        "outcome": record.outcome,
        "feasible": bool(feasible),
        "capacity_rps": record.capacity_rps or None,
        "capacity_speed": record.capacity_speed or None,  # the replay speed of the recorded traffic at capacity
        "step_warmup_s": record.step_warmup_s,  # a generative trial's: traffic replayed before each capacity window
        "capacity_bracket": ({"lower_rps": b.rps, "upper_rps": b.upper_rps, "converged": b.converged,
                              "limited_by": b.limited_by, "peak_rps": b.peak_rps} if b is not None and b.rps else None),
        "unit": record.unit,  # what the score counts: requests, or a generative model's output tokens
        "per_dollar": record.scores.get(scoring),
        f"{record.unit}_per_dollar": record.scores.get(scoring),
        "scores": {"capacity": record.scores.get("capacity"), "utilization": record.scores.get("utilization")},
        "latency_ms": point["latency_ms"],
        "fill_rate": point["fill_rate"],
        "queue_ms": point["queue_ms"],
        "compute_ms": point["compute_ms"],
        **{k: point[k] for k in ("ttft_ms", "tpot_ms", "output_tokens_per_s", "engine") if k in point},  # generative
        "servers_needed": record.servers_needed,
        "monthly_cost": record.monthly_cost,
        "sla_reason": record.sla_reason or "",
        "at_load": at_load,
        "at_capacity": at_capacity,
    }


def _from_trial(t: optuna.trial.FrozenTrial, scoring: str) -> dict:
    e = _entry(record_of(t) or TrialRecord(params=dict(t.params)), scoring, t.number, feasible=is_feasible(t))
    e["host"], e["gpu"] = t.user_attrs.get("host"), t.user_attrs.get("gpu")  # where it was measured
    return e


def _from_repeats(r: dict, scoring: str, on: dict | None = None) -> dict:
    record = from_attrs({**r.get("attrs", {}), "config": r["params"], "outcome": "measured"})
    record = dataclasses.replace(record, scores=r.get("scores", {}))
    e = _entry(record, scoring, r.get("trial"), feasible=met_sla(r))
    e["capacity_rps"] = r.get("capacity_rps")
    e["capacity_speed"] = r.get("capacity_speed")
    e["per_dollar"] = e[f"{e['unit']}_per_dollar"] = r.get("median")  # the median over the repeats: what was compared
    e["repeats"] = {"values": r.get("values"), "ranges": r.get("ranges"), "spread": r.get("spread"),
                    "observed_spread": r.get("observed_spread"), "bracket_width": r.get("bracket_width"),
                    "feasible_runs": r.get("feasible_runs"), "unmeasured_runs": r.get("unmeasured_runs", 0)}
    e["host"], e["gpu"] = (on or {}).get("host"), (on or {}).get("gpu")  # every repeat on one host
    return e


def _range(entry: dict, scoring: str, price: float | None) -> tuple[float, float] | None:
    """Where an entry's requests per dollar may really lie: the union of its repeats' own ranges, each
    from its score to (under capacity scoring) its score at its own first failing speed
    (`Repeats.ranges`), so that it holds every capacity any repeat allows. An entry without them (one
    trial, or a study stored before they were) has its repeats' values and its capacity bracket,
    widened from the median."""
    value = entry.get("per_dollar")
    if not entry.get("feasible") or not value:
        return None
    repeats = entry.get("repeats") or {}
    spans = [(float(value), float(value))]
    if repeats.get("ranges") is not None:
        spans += [(float(low), float(high)) for low, high in filter(None, repeats["ranges"])]
    else:
        spans += [(float(v), float(v)) for v in repeats.get("values") or [] if v]
        bracket = entry.get("capacity_bracket") or {}
        if scoring == "capacity" and price and bracket.get("upper_rps") and bracket.get("lower_rps"):
            spans.append((float(value), float(value) * bracket["upper_rps"] / bracket["lower_rps"]))
    return min(low for low, _ in spans), max(high for _, high in spans)


def _unmeasured(study: optuna.Study) -> list[dict]:
    out = []
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get("outcome") in NO_VERDICT:
            record = record_of(t)
            out.append({"trial": t.number, "params": config_of(t), "outcome": record.outcome, "reason": record.note,
                        "send_lag_p99_ms": record.at_load.send_lag_p99_ms if record.at_load else None,
                        "attempts": record.at_load.attempts if record.at_load else None})
    return out


def study_unit(study: optuna.Study) -> str:
    """What the study's scores count: "tokens" for a vLLM-served model (tune stored its engine
    arguments), else "requests"; known before any trial is measured."""
    return "tokens" if study.user_attrs.get("base_engine") is not None else "requests"


def summarize(study: optuna.Study) -> dict:
    """The study's summary: the best configuration (re-measured where it was), the incumbent, the
    improvement, the counts, and the trials that could not be measured."""
    meta = study.user_attrs
    scoring = meta.get("scoring", "capacity")
    sla = meta.get("sla") or {}
    stored = meta.get("remeasured") or []
    entry = {id(r): _from_repeats(r, scoring, meta.get("remeasured_on")) for r in stored}
    remeasured = list(entry.values())
    ranked = [entry[id(r)] for r in recommend(stored)]  # the search's rule, on the repeats as stored
    inc_trial = incumbent_trial(study)
    if ranked:
        best = ranked[0]
        inc_runs = [r for r in remeasured if r["trial"] is not None and _is_incumbent(study, r["trial"])]
        incumbent = inc_runs[0] if inc_runs else (_from_trial(inc_trial, scoring) if inc_trial else None)
    else:  # no re-measurement, or none of it met the SLA: the search's own measurements, for both sides
        top = top_trials(study, 1)
        best = _from_trial(top[0], scoring) if top else None
        incumbent = _from_trial(inc_trial, scoring) if inc_trial else None

    improvement = improvement_range = None
    price = (meta.get("price") or {}).get("price_per_hour")
    ranked_or_best = ranked or ([best] if best else [])
    for entry in [*ranked_or_best, *([incumbent] if incumbent else [])]:
        span = _range(entry, scoring, price)
        entry["range"] = list(span) if span else None
    if best and incumbent and incumbent["feasible"] and (incumbent["per_dollar"] or 0) > 0:
        improvement = best["per_dollar"] / incumbent["per_dollar"] - 1.0
        if best.get("range") and incumbent.get("range"):
            (b_low, b_high), (i_low, i_high) = best["range"], incumbent["range"]
            # a range's top is the score at its first failing speed: touching ranges are apart, by a gain of 0
            improvement_range = [_zero_if_tiny(b_low / i_high - 1.0), b_high / i_low - 1.0]
    indistinguishable = [e["trial"] for e in ranked_or_best[1:]
                         if best and best.get("range") and e.get("range") and _overlap(e["range"], best["range"])]

    summary: dict = {
        "tuner_version": __version__,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "study_name": study.study_name,
        "storage": without_password(meta["storage"]) if meta.get("storage") else None,
        "study_file": meta.get("study_file"),
        "model": meta.get("model"),
        "scoring": scoring,
        "unit": study_unit(study),  # what per_dollar counts, even when no trial was measured
        "sla": sla,
        "lag_budget_ms": meta.get("lag_budget_ms"),
        "traffic": meta.get("traffic") or {},
        "price_per_hour": (meta.get("price") or {}).get("price_per_hour"),
        "price": meta.get("price") or {},
        "feasible": best is not None,
        "best": best,
        "incumbent": incumbent,
        "improvement": improvement,
        "improvement_range": improvement_range,  # low, high: the ranges of both sides, combined
        "indistinguishable_from_best": indistinguishable,  # top trials whose range overlaps the best's
        "top": ranked_or_best,
        "trials": counts(study),
        "unmeasured": _unmeasured(study),
        "hosts": hosts(study),
        "remeasured_on": meta.get("remeasured_on"),
        "step_duration_s": meta.get("step_duration_s"),  # a capacity step's window (search.capacity)
        # as the nightly job's decision.json names them: the last run's time limit, and whether it stopped the search
        "search_timeout_s": (meta.get("search_time_limit") or {}).get("timeout_s"),
        "search_timed_out": bool((meta.get("search_time_limit") or {}).get("timed_out")),
    }
    summary["notes"] = _time_limit_notes(meta.get("search_time_limit") or {})
    summary["notes"] += _short_step_notes(summary) if scoring == "capacity" else []
    summary["notes"] += _floor_notes(summary) if scoring == "capacity" else []
    summary["notes"] += _unconfirmed_notes(stored)
    if best is None:
        closest = _closest(study, scoring)
        summary["closest"] = closest
        what = f"{sla_limits(sla)}, errors <= {sla.get('max_error_rate', 0.001):.2%}"
        summary["message"] = (
            f"no configuration met the SLA ({what})"
            + (f"; closest: trial {closest['trial']} {space.describe(closest['params'], as_set=True)}"
               f" ({closest['sla_reason'] or 'SLA not met'})" if closest else "")
        )
        judged = summary["trials"]["complete"] + summary["trials"]["pruned"]
        if not judged and summary["unmeasured"]:  # no verdict on any: what tune's UnmeasuredError says
            summary["message"] = unmeasured_advice(summary)
    elif improvement is None:
        summary["message"] = "the incumbent did not meet the SLA: the recommendation is the first that does"
    elif incumbent is not None and best.get("trial") == incumbent.get("trial"):
        summary["message"] = "the incumbent is the best configuration measured: keep it"
    else:
        gain = f"{improvement:+.1%} {summary['unit']} per dollar over the incumbent" + (
            f" (between {improvement_range[0]:+.1%} and {improvement_range[1]:+.1%})" if improvement_range else "")
        summary["message"] = gain
        if incumbent is not None and incumbent.get("trial") in indistinguishable:
            # the best's gain lies within the measurements' uncertainty: nothing shows a change is worth making
            summary["keep_incumbent"] = True
            summary["message"] = (f"keep the incumbent: the best measured, trial {best.get('trial')}, is {gain}, "
                                  f"which cannot be told apart from it within the measurements' uncertainty")
            indistinguishable = [t for t in indistinguishable if t != incumbent.get("trial")]
    if indistinguishable:
        summary["message"] += (f"; trial(s) {', '.join(map(str, indistinguishable))} cannot be told apart from "
                               f"the best within the measurements' uncertainty")
    if remeasured and not ranked and best is not None:
        summary["message"] += ("; the re-measurement did not confirm the SLA for any of the top configurations "
                               "(their figures here are the search's)")
    return summary


def _overlap(lower: list, upper: list) -> bool:
    """Whether the range `lower` (below or beside `upper`) reaches into `upper`: a range's top is the
    score at its first failing speed (the capacity lies under it), so a top that only touches the other's
    bottom (capacity searches share a grid of speeds) is apart, within `_ROUNDING`."""
    return lower[1] > upper[0] * (1.0 + _ROUNDING)


def _zero_if_tiny(x: float) -> float:
    """A relative change within `_ROUNDING` of none is none (a range's edge that only touches)."""
    return 0.0 if abs(x) < _ROUNDING else x


def recommended_entry(summary: dict) -> dict | None:
    """The configuration the study recommends deploying: the best measured, or the incumbent where the
    best's gain cannot be told apart from it (`keep_incumbent`): what recommended/ holds, `tuner export`
    writes and the check-it line replays."""
    if summary.get("keep_incumbent") and summary.get("incumbent"):
        return summary["incumbent"]
    return summary.get("best")


def _missed(entry: dict) -> str:
    """A table's cell for a configuration that missed the SLA, with the first limit it broke where the
    entry says (a p99 under its limit beside "SLA missed" reads as a contradiction otherwise)."""
    reason = (entry.get("sla_reason") or "").split(";")[0].strip()
    return f"SLA missed: {reason}" if reason else "SLA missed"


def is_floor(entry: dict | None) -> bool:
    """Whether an entry's capacity is only a floor: its capacity search met the SLA at every speed it
    tried (no first failing speed: the speed cap or the step budget stopped it), so its range has no top."""
    bracket = (entry or {}).get("capacity_bracket") or {}
    return bool(entry and entry.get("feasible") and bracket.get("lower_rps") and not bracket.get("upper_rps")
                and not bracket.get("limited_by"))  # the load generator's or the traffic's: said on their own


def _unconfirmed_notes(stored: list[dict]) -> list[str]:
    """A line for each re-measured configuration that met the SLA in some repeats but not in most
    (`met_sla`): left out of the ranking, where it would otherwise vanish without a word."""
    return [f"trial {r.get('trial')} ({space.describe(r['params'])}) met the SLA in {r['feasible_runs']} of "
            f"{len(r.get('values') or [])} re-measurements: not confirmed, left out of the ranking"
            for r in stored if r.get("feasible_runs", 0) > 0 and not met_sla(r)]


def _floor_notes(summary: dict) -> list[str]:
    """A caution where the best's or the incumbent's capacity is a floor (`is_floor`): its range, and the
    improvement's, leave out that the capacity may be higher."""
    best, incumbent = summary.get("best"), summary.get("incumbent")
    floors = [who for who, entry in (("the recommendation", best), ("the incumbent", incumbent)) if is_floor(entry)
              and not (who == "the incumbent" and best and entry.get("trial") == best.get("trial"))]
    if not floors:
        return []
    gain = ("" if summary.get("improvement") is None or len(floors) == 2 else
            "; the gain may be larger" if floors[0] == "the recommendation" else "; the gain may be smaller")
    whose = " and ".join(f"{who}'s" for who in floors)
    what = "capacities are floors: their capacity searches" if len(floors) == 2 else "capacity is a floor: its capacity search"
    return [f"{whose} {what} met the SLA at every speed tried (search.capacity.max_speed or max_steps stopped "
            f"it), so the range has no top{gain}; raise them to bound it"]


def _time_limit_notes(limit: dict) -> list[str]:
    """What the summary says of a search its time limit stopped (`tuner.tune`), in the nightly job's words."""
    if not limit.get("timed_out"):
        return []
    return [f"search: stopped by its time limit ({limit['limit']}) after {limit['trials']} of {limit['planned']} "
            f"trials; no trial started after it"]


def _short_step_notes(summary: dict) -> list[str]:
    """A caution where a generative study's capacity steps were too short for the engine's streamed rate
    (`tuner.measurement_tokens.short_window`) against the life of a request at the speed that decided
    the best's or the incumbent's capacity (its `step_warmup_s`): those capacities may read low."""
    step_s, notes = summary.get("step_duration_s"), []
    for who in ("best", "incumbent"):
        entry = summary.get(who) or {}
        life, where = entry.get("step_warmup_s"), "at the speed that decided the"
        if not life and summary.get("unit") == "tokens":  # the capacity is the recorded load: no step decided it,
            # and every step above failed; a request's life there is its median end to end
            life, where = ((entry.get("latency_ms") or {}).get("p50") or 0) / 1000, "at the recorded load, the"
        if not step_s or not short_window(step_s, life_s=life) or (who == "incumbent" and notes):
            continue
        notes.append(f"the capacity steps lasted {step_s:g} s, under {WINDOW_LIVES:g}x a request's life end to end {where} "
                     f"{'recommendation' if who == 'best' else 'incumbent'}'s capacity "
                     f"({life:.1f} s): the engine's streamed rate reads low over so short a step, so the capacities "
                     f"may read low; search.capacity.step_duration_s: {math.ceil(WINDOW_LIVES * life):d} s or more "
                     "measures them")
    return notes


def sla_limits(sla: dict) -> str:
    """The SLA's latency limits as text: an encoder's latency, or a generative model's TTFT, TPOT and
    end to end."""
    pct = percentile_key(sla.get('percentile', 99))
    tokens = [f"{pct} {name} <= {sla[key]:g} ms"
              for name, key in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("end to end", "e2e_ms"))
              if sla.get(key) is not None]
    return ", ".join(tokens) if tokens else f"{pct} <= {sla.get('latency_ms')} ms"


def unmeasured_advice(summary: dict) -> str:
    """One line for a study none of whose trials could be judged: what to change."""
    listed = summary.get("unmeasured") or []
    lags = [u["send_lag_p99_ms"] for u in listed if u.get("outcome", "unmeasured") == "unmeasured"
            and u.get("send_lag_p99_ms") is not None]
    unstable = sum(u.get("outcome") == "unstable" for u in listed)
    budget = summary.get("lag_budget_ms")
    parts = []
    if len(listed) > unstable:
        seen = f" (send lag p99 up to {max(lags):.2f} ms against a budget of {budget:g} ms)" if lags and budget else ""
        parts.append(f"the load generator could not send the requests on time{seen}: raise "
                     f"replay.lag_budget_ms, set replay.workers, or lower traffic.speed")
    if unstable:
        parts.append(f"{unstable} never reached steady state after the load: raise measurement.warmup_max_s "
                     f"or measurement.stability_pct")
    return f"no trial could be measured: {'; '.join(parts)} (the summary lists the {len(listed)} trials)"


def hosts(study: optuna.Study) -> list[dict]:
    """Who measured the study's trials: one row per process (host, pid) and GPU type, with its trials
    counted as the summary counts them (`search.tally`)."""
    groups: dict[tuple, list] = {}
    for t in study.get_trials(deepcopy=False):
        if t.state == optuna.trial.TrialState.WAITING or "host" not in t.user_attrs:
            continue
        key = (t.user_attrs.get("host"), t.user_attrs.get("pid"), t.user_attrs.get("gpu") or "unknown")
        groups.setdefault(key, []).append(t)
    rows = [{"host": host, "pid": pid, "gpu": gpu, **tally(trials)} for (host, pid, gpu), trials in groups.items()]
    return sorted(rows, key=lambda r: (str(r["host"]), str(r["pid"]), str(r["gpu"])))


def hosts_table(rows: list[dict]) -> str:
    """The hosts that measured a study, as a table (empty when none)."""
    return pd.DataFrame(rows).to_string(index=False) if rows else ""


def _is_incumbent(study: optuna.Study, number: int) -> bool:
    return bool(study.trials[number].user_attrs.get("incumbent"))


def _closest(study: optuna.Study, scoring: str) -> dict | None:
    done = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if t.constraints]
    if not done:
        return None
    t = min(done, key=lambda t: max(t.constraints.values()))
    entry = _from_trial(t, scoring)
    entry["violation"] = max(t.constraints.values())
    return entry


# --- the config --------------------------------------------------------------------------------


def recommended_config(study: optuna.Study, summary: dict) -> str:
    """The base config with only the tuned fields changed, under a comment header."""
    if not summary.get("best"):
        raise NoFeasibleConfigError(summary.get("message") or "no configuration met the SLA")
    base_text = study.user_attrs.get("base_config")
    if not base_text:
        raise InputError(f"study {study.study_name!r} holds no base config (was it made by `tuner tune`?)")
    base = modelconfig.parse(base_text, "<base config>")
    # the study's preferred-size strategy, stored under the knob's name (tune's metadata)
    search = SearchSettings(**{space.PREFERRED: study.user_attrs.get(space.PREFERRED, "none")})
    params = {k: tuple(v) if isinstance(v, list) else v for k, v in recommended_entry(summary)["params"].items()}
    config = space.apply(base, params, search)
    modelconfig.validate(config, "recommended config")
    return _header(summary, base, config) + modelconfig.to_text(
        config, comments_from=study.user_attrs.get("base_config_source"))


def recommended_engine(study: optuna.Study, summary: dict) -> str:
    """A vLLM-backend model's recommended model.json: its own engine arguments with only the tuned
    knobs changed. JSON holds no comment: what the config.pbtxt's header says is in the summary."""
    if not summary.get("best"):
        raise NoFeasibleConfigError(summary.get("message") or "no configuration met the SLA")
    params = {k: tuple(v) if isinstance(v, list) else v for k, v in recommended_entry(summary)["params"].items()}
    args = space.apply_engine(dict(study.user_attrs["base_engine"]), space.split(params)[1])
    return json.dumps(args, indent=2) + "\n"


def _header(summary: dict, base, config) -> str:
    sla, traffic, chosen = summary["sla"], summary["traffic"], recommended_entry(summary)
    keep = bool(summary.get("keep_incumbent"))
    changed = modelconfig.changed_fields(base, config)
    if keep:  # the summary's verdict: the best's gain lies within the measurements' uncertainty
        gain = (f"none: keep the incumbent (the best measured, trial {summary['best'].get('trial')}, is "
                f"{summary['improvement']:+.1%}, within the measurements' uncertainty)")
    else:
        gain = (f"{summary['improvement']:+.1%}" if summary.get("improvement") is not None
                else "n/a (incumbent missed the SLA)")
    lines = [
        f"{modelconfig.EXPORT_HEADER[2:]}{summary['tuner_version']} on {summary['date']} (study {summary['study_name']!r})",
        f"SLA: {percentile_key(sla.get('percentile', 99))} latency <= {sla.get('latency_ms')} ms, "
        f"error rate <= {sla.get('max_error_rate', 0.001):.2%}",
        f"traffic: {traffic.get('path')} at speed {traffic.get('speed', 1.0):g}"
        + (f", window {traffic['window']}" if traffic.get("window") else ""),
        f"score ({summary['scoring']}): {figure(chosen['requests_per_dollar'])} requests per dollar"
        f" at ${figure(summary.get('price_per_hour'))}/h; capacity {figure(chosen['capacity_rps'])} req/s",
        "improvement over the incumbent: " + gain,
        "changed: " + ("; ".join(changed) if changed else
                       "nothing (keep the incumbent)" if keep else "nothing (the incumbent is best)"),
    ]
    return "".join(f"# {line}\n" for line in lines) + "\n"


# --- tables ------------------------------------------------------------------------------------


def trials_frame(study: optuna.Study) -> pd.DataFrame:
    """One row per trial: parameters, measurements (the record's attributes), state."""
    skip = {"config"}  # host, pid and gpu say where each trial was measured
    scoring = study.user_attrs.get("scoring", "capacity")
    unit = study_unit(study)
    rows = []
    for t in study.get_trials(deepcopy=False):
        row = {"number": t.number, "state": t.state.name,
               **{k: ",".join(map(str, v)) if isinstance(v, (list, tuple)) else v for k, v in config_of(t).items()},
               "value": t.value, "sla_violation": max(t.constraints.values()) if t.constraints else None,
               "duration_s": t.duration.total_seconds() if t.duration else None}
        row.update({k: v for k, v in t.user_attrs.items() if k not in skip})
        row["feasible"] = is_feasible(t)
        row[f"{unit}_per_dollar"] = t.user_attrs.get(f"score_{scoring}")
        rows.append(row)
    return pd.DataFrame(rows)


def closing_table(summary: dict) -> str:
    """Top configurations and the incumbent: parameters, capacity, SLA percentile, fill rate,
    Triton's queue and compute time, requests per dollar, improvement over the incumbent; then the
    trials that could not be measured."""
    pct = percentile_key(summary['sla'].get('percentile', 99))  # p100's figure is kept as "max"
    rows = list(summary.get("top") or [])[:5]
    inc = summary.get("incumbent")
    if inc and all(r.get("trial") != inc.get("trial") for r in rows):
        rows.append(inc)
    if not rows and summary.get("closest"):
        rows = [summary["closest"]]
    base = inc["per_dollar"] if inc and inc["feasible"] and inc["per_dollar"] else None
    table = []
    for r in rows:
        is_best = bool(summary.get("best")) and r.get("trial") == summary["best"].get("trial")
        tag = ("best, incumbent" if is_best else "incumbent") if inc and r.get("trial") == inc.get("trial") else (
            "best" if is_best else "")
        if not tag and r.get("trial") in (summary.get("indistinguishable_from_best") or []):
            tag = "~ best"
        bracket = r.get("capacity_bracket") or {}
        capacity = figure(r.get("capacity_rps"))
        if bracket.get("upper_rps") and r.get("capacity_rps"):
            capacity = f"{figure(r['capacity_rps'])}-{figure(r['capacity_rps'] * bracket['upper_rps'] / bracket['lower_rps'])}"
        if is_floor(r):
            capacity += "+"  # no speed failed: a floor (the summary's note says so)
        if bracket.get("limited_by") == "load_generator":
            capacity += " *"  # the load generator, not the server, could not go faster
        elif bracket.get("limited_by") == "traffic":
            capacity += " ^"  # the traffic ran out before the server did
        table.append({
            "": tag,
            "trial": r.get("trial"),
            **{space.LABELS.get(k, k): ",".join(map(str, v)) if isinstance(v, list) else v
               for k, v in r["params"].items()},
            "capacity req/s": capacity,
            **(_token_columns(r, pct) if r.get("unit") == "tokens" else {
                f"{pct} ms": figure(r["latency_ms"].get(pct)),
                "fill rate": figure(r.get("fill_rate")),
                "queue ms": figure(r.get("queue_ms")),
                "compute ms": figure(r.get("compute_ms"))}),
            "tokens/$" if r.get("unit") == "tokens" else "req/$":
                figure(r.get("per_dollar")) if r["feasible"] else _missed(r),
            "spread": _spread(r),
            "vs incumbent": _gain(r, inc, base),
        })
    text = pd.DataFrame(table).to_string(index=False) if table else "no trial met the SLA or was measured"
    best = summary.get("best") or {}
    traffic = summary.get("traffic") or {}
    if best.get("capacity_speed") and traffic.get("mean_rps"):
        peak = (best.get("capacity_bracket") or {}).get("peak_rps")
        text += (f"\ncapacity: the fastest replay of the recording that met the SLA, as its mean rate: the best met "
                 f"it at {best['capacity_speed']:.3g}x the recorded speed (mean {best['capacity_rps']:.1f} req/s"
                 + (f", busiest second {peak:.0f} req/s" if peak else "") + "); a range runs from the last passing "
                 "to the first failing speed")
    text += _overrun_note(rows)
    if any((r.get("capacity_bracket") or {}).get("limited_by") == "load_generator" for r in rows):
        text += ("\n* limited by the load generator: above this speed its send lag broke the budget even with "
                 "more processes, so the server may serve more (raise replay.lag_budget_ms or replay.workers)")
    if any((r.get("capacity_bracket") or {}).get("limited_by") == "traffic" for r in rows):
        text += ("\n^ limited by the traffic: one step faster, a step held no request after its warm-up, so the "
                 "capacity is a floor the traffic sets (a longer recording, or a shorter replay.warmup_s, measures "
                 "further)")
    unmeasured = summary.get("unmeasured") or []
    if unmeasured:
        lines = [f"\nunmeasured: {len(unmeasured)} trial(s) with no verdict (the load generator could not replay "
                 "on time, or the server never settled after the load):"]
        for u in unmeasured[:5]:
            lines.append(f"  trial {u['trial']} {space.describe(u['params'])}: {u.get('outcome', 'unmeasured')}: "
                         f"{u['reason']}")
        if len(unmeasured) > 5:
            lines.append(f"  ... and {len(unmeasured) - 5} more (summary.json lists them)")
        text += "\n".join(lines)
    measured_by = summary.get("hosts") or []
    if len(measured_by) > 1:  # a study several hosts (or GPU types) shared: who measured what
        on = summary.get("remeasured_on") or {}
        text += ("\n\nmeasured by:\n" + hosts_table(measured_by)
                 + (f"\nre-measured on {on.get('host')} (pid {on.get('pid')}, {on.get('gpu')})" if on else ""))
    return text


def _spread(r: dict) -> str:
    """A re-measured entry's spread and, where replays were lost (interrupted, failed or unmeasured), how
    many of its repeats measured: a median of fewer repeats than asked is less sure than it reads."""
    repeats = r.get("repeats") or {}
    spread = repeats.get("spread")
    text = f"{spread:.0%}" if isinstance(spread, (int, float)) else ""
    lost = repeats.get("unmeasured_runs") or 0
    if lost:
        asked = len(repeats.get("values") or []) + lost  # "values": one per measured repeat
        text = ", ".join(filter(None, (text, f"{asked - lost} of {asked} repeats measured")))
    return text


def _token_columns(r: dict, pct: str) -> dict:
    """A generative configuration's columns: TTFT and TPOT at the SLA's percentile, output tokens per second,
    and how the engine batched (the peak of its running sequences and of its KV-cache use, preemptions)."""
    engine = r.get("engine") or {}
    kv = engine.get("kv_cache_peak")
    return {f"TTFT {pct} ms": figure((r.get("ttft_ms") or {}).get(pct)),
            f"TPOT {pct} ms": figure((r.get("tpot_ms") or {}).get(pct)),
            "output tok/s": figure(r.get("output_tokens_per_s")),
            "running": figure(engine.get("running_peak")),
            "KV peak": f"{kv:.0%}" if isinstance(kv, (int, float)) else "-",
            "preempt": figure(engine.get("preemptions"))}


def _overrun_note(rows: list[dict]) -> str:
    """A warning where an emulated GPU (llm_sim) ran more than a few per cent of its steps late: those
    figures are partly the CPU's."""
    late = [(r.get("trial"), (r.get("engine") or {}).get("emulated_overrun_share")) for r in rows]
    late = [(t, share) for t, share in late if isinstance(share, (int, float)) and share > OVERRUN_LIMIT]
    if not late:
        return ""
    which = ", ".join(f"trial {t}: {share:.0%}" for t, share in late)
    return (f"\n* emulated GPU: the CPU ran steps past their emulated time ({which}; more than "
            f"{OVERRUN_LIMIT:.0%}): those figures are partly the CPU's (raise the model's time_scale)")


def _gain(r: dict, inc: dict | None, base: float | None) -> str:
    """The gain over the incumbent and, where both have a range, the range it may really have."""
    if not base or not r["feasible"] or not r.get("per_dollar") or r is inc:
        return ""
    text = f"{r['per_dollar'] / base - 1:+.1%}"
    if r.get("range") and inc and inc.get("range") and r is not inc:
        (low, high), (i_low, i_high) = r["range"], inc["range"]
        text += f" ({low / i_high - 1:+.0%}..{high / i_low - 1:+.0%})"
    return text



# --- files -------------------------------------------------------------------------------------


def write_outputs(study: optuna.Study, output_dir: str | Path) -> dict:
    """Write the outputs of a finished study; the summary says whether anything met the SLA."""
    out = Path(output_dir)
    summary = summarize(study)
    files = {TRIALS: trials_frame(study).to_csv(index=False)}  # all made before any is written
    base_text = study.user_attrs.get("base_config_source") or study.user_attrs.get("base_config")
    if base_text:
        files[INCUMBENT] = base_text
    if study.user_attrs.get("base_engine") is not None:  # a vLLM-served model's incumbent is its model.json
        files[INCUMBENT_ENGINE] = json.dumps(study.user_attrs["base_engine"], indent=2) + "\n"
    if summary["best"] and study_unit(study) == "tokens":  # vLLM batches: its model.json
        files[RECOMMENDED_ENGINE] = recommended_engine(study, summary)
    elif summary["best"]:
        files[RECOMMENDED] = recommended_config(study, summary)
    files[SUMMARY] = json.dumps(summary, indent=2, default=_json_default) + "\n"  # last: it marks them whole
    for name, text in files.items():
        write_atomic(out / name, text)
    return summary


def write_latency_records(repeats: list[Repeats], output_dir: str | Path) -> list[Path]:
    """The per-request latencies at capacity of each re-measured configuration, all repeats together
    (`repeat` says which), for the report's latency CDFs. Only this run's measurements: files of an
    earlier run of the same study are replaced, never mixed in."""
    out = Path(output_dir) / RECORDS
    for stale in [*out.glob("trial_*.parquet"), *out.glob("incumbent.parquet")]:
        stale.unlink()
    written = []
    for r in repeats:
        frames = [pd.DataFrame({"repeat": i, "latency_ms": list(record.latencies_ms)})
                  for i, record in enumerate(r.records) if record.latencies_ms]
        if not frames:
            continue
        buffer = io.BytesIO()
        pd.concat(frames, ignore_index=True).to_parquet(buffer, index=False)
        for name in [f"trial_{r.trial}.parquet"] + (["incumbent.parquet"] if r.incumbent else []):
            written.append(write_atomic(out / name, buffer.getvalue()))
    return written


def _json_default(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)


def storage_of(output_dir: str | Path) -> tuple[str, str | None]:
    """The storage and study name a `tuner tune` output directory records."""
    out = Path(output_dir)
    if not out.is_dir():
        raise SettingsError(f"{out}: no such output directory")
    summary_path = out / SUMMARY
    if summary_path.is_file():
        summary = read_json_object(summary_path, error=SettingsError)
        if summary.get("storage"):
            return summary["storage"], summary.get("study_name")
    if (out / DEFAULT_STORAGE_FILE).is_file():
        return f"sqlite:///{(out / DEFAULT_STORAGE_FILE).resolve()}", None
    if (out / JOURNAL_FILE).is_file():
        return str(out / JOURNAL_FILE), None
    raise SettingsError(f"{out}: no summary.json or study storage: not a `tuner tune` output directory")


def export(storage: str, name: str | None, output: str | Path, *, force: bool = False) -> Path:
    """Write the recommended config of a finished study to `output` (a vLLM-backend model's: its model.json).
    A file already there is replaced only when tuner wrote it (a config.pbtxt under tuner's header), when
    it holds the same text, or with `force`: `output` may be the user's own config (OutputError)."""
    path, label = Path(output), f"-o {output}"
    writable_file(path, label=label)  # before the study is read; nothing is made until it is
    study = load_study(storage, name)
    check_finished(study)
    # never over what the study reads, --force or not; the model's config.pbtxt may be (your live config)
    check_not_input(path, label=label, study_file=study.user_attrs.get("study_file"),
                    traffic=(study.user_attrs.get("traffic") or {}).get("path"))
    settings = recorded_study(study.user_attrs.get("study_file"))
    if settings is not None:  # nor a new file among the model's: only its live config.pbtxt or model.json
        model_dir = Path(settings.model_repository) / settings.model
        check_not_in_model(path, settings, label=label, but=[
            model_dir / "config.pbtxt", engineargs.version_dir(model_dir) / engineargs.ENGINE_FILE])
    text = recommended_text(study, summarize(study))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{label}: cannot write ({os_reason(exc)})") from None
    check_writable(path, label=label)
    check_replaceable(path, force=force, label=label, ours=functools.partial(modelconfig.written_by_tuner, text=text))
    return write_atomic(path, text, label=label)


def check_finished(study: optuna.Study) -> None:
    """Refuse a study whose search stopped before its best were re-measured (interrupted, or resumed with
    new trials and interrupted again): its recommendation would rest on single measurements, with
    nothing in the exported file saying so."""
    attrs = study.user_attrs
    done = finished_count(study)
    if "remeasured" not in attrs or attrs.get("remeasured_at", done) != done:
        raise InputError(f"study {study.study_name!r} is not finished: its search stopped after {done} trial(s), "
                         "before its best were re-measured: run the same `tuner tune` again to finish it, or "
                         "`tuner finish` for a study several hosts searched")


def recommended_text(study: optuna.Study, summary: dict) -> str:
    """The study's recommendation as its file holds it: config.pbtxt, or a vLLM-backend model's model.json."""
    if study_unit(study) == "tokens":
        return recommended_engine(study, summary)
    return recommended_config(study, summary)


def recommended_path(output_dir: str | Path) -> Path:
    """Where a `tuner tune` output directory keeps its recommendation (by its summary's kind)."""
    summary = Path(output_dir) / SUMMARY
    tokens = summary.is_file() and read_json_object(summary, error=SettingsError).get("unit") == "tokens"
    return Path(output_dir) / (RECOMMENDED_ENGINE if tokens else RECOMMENDED)


def _from_here(path: str) -> str:
    """`path` (an absolute one recorded by the study) as the shortest way to name it from here: relative
    below the working directory, else absolute."""
    if not os.path.isabs(path):
        return path
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def check_command(summary: dict, output: str) -> str | None:
    """The `tuner replay` that measures the recommendation's deciding step again: its recommended
    config.pbtxt (model.json for a vLLM-served model) at its capacity's speed (the recorded load's, when
    scored by utilization), replayed as a search step (`--step`; a generative trial's capacity steps
    with the warm-up they had, `--warmup`). None without a recommendation."""
    import shlex

    best, study, config = recommended_entry(summary), summary.get("study_file"), recommended_path(output)
    if not summary.get("feasible") or not best or not study or not config.is_file():
        return None
    speed = best.get("capacity_speed") if summary.get("scoring") == "capacity" else \
        (summary.get("traffic") or {}).get("speed")
    if not speed:
        return None
    warmup = best.get("step_warmup_s") if summary.get("scoring") == "capacity" else None
    return (f"tuner replay {shlex.quote(_from_here(study))} --config {shlex.quote(str(config))} --speed {speed:.4g} --step"
            + (f" --warmup {warmup:.3g}" if warmup else ""))
