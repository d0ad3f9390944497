"""Outputs of a finished study, from a real storage filled by the search loop with an injected
evaluation: summary keys, recommended config (only tuned fields changed), trials.csv, the closing
table, unmeasured trials, and `tuner export` from a directory or a storage (and where it cannot write)."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import tempfile
from pathlib import Path

import optuna
import pandas as pd
import pytest
import yaml

from tuner import export, modelconfig, search, space
from tuner.cli import main
from tuner.settings import IntRange, study_from_dict
from tuner.trial import UNMEASURED, Bracket, Figures, Hints, TrialRecord

optuna.logging.set_verbosity(optuna.logging.WARNING)
TEMPLATE = Path(__file__).resolve().parent.parent / "model_repository_templates" / "encoder_sim" / "config.pbtxt"
# the template as a user might keep it: comments above, inside and beside the fields
SOURCE = TEMPLATE.read_text().replace("max_batch_size: 64", "max_batch_size: 64  # the training batch", 1) + (
    "# owner: search team\n")


def fake(params: dict, hints: Hints, latency_limit: float = 30.0, unmeasured: tuple = ()) -> TrialRecord:
    b, d = params["max_batch_size"], params["max_queue_delay_microseconds"]
    if b in unmeasured:
        return TrialRecord(params=dict(params), outcome=UNMEASURED, note="send lag p99 8.49 ms > budget 5 ms",
                           at_load=Figures(requests=10, valid=False, send_lag_p99_ms=8.49, attempts=3))
    cap = 100.0 * b / (1.0 + (b / 16.0) ** 2) + d / 1000.0
    p99 = 5.0 + d / 1000.0 + 0.4 * b
    feasible = p99 <= latency_limit
    at_load = Figures(requests=100, latency_ms={"p50": p99 / 2, "p95": p99 * 0.9, "p99": p99}, fill_rate=0.3,
                      queue_ms=1.0, compute_ms=6.0)
    at_cap = Figures(requests=100, latency_ms={"p50": 3.0, "p99": latency_limit * 0.9}, fill_rate=0.8,
                     queue_ms=4.0 + b / 8, compute_ms=9.0)
    return TrialRecord(params=dict(params), at_load=at_load, sla_met=feasible, violation=p99 / latency_limit - 1.0,
                       capacity=Bracket(rps=cap, speed=cap / 100.0, upper_rps=cap * 1.1, steps=4, converged=True,
                                        at_capacity=at_cap) if feasible else None,
                       scores={"capacity": cap * 3600 / 2.0 if feasible else None, "utilization": 1e6 / p99},
                       servers_needed=2, monthly_cost=10.0,
                       sla_reason="" if feasible else f"p99 {p99:.1f} ms > {latency_limit:g} ms")


# the studies `make_study` built, by its arguments: a study's ~1,200 SQLite commits take seconds, and most
# tests here want one of a few; each test gets its own copy
_BUILT: dict[tuple, Path] = {}


def make_study(tmp_path: Path, latency_limit: float = 30.0, remeasure: bool = True, unmeasured: tuple = (),
               step_s: float | None = None, life_s: float | None = None) -> optuna.Study:
    """A finished study in tmp_path/out/study.db, as `_build` makes it there: built once per session for
    each set of arguments (beside the first test's tmp_path), copied, its storage attribute this copy's.
    `step_s`: the capacity steps' length kept in the study; `life_s`: every trial's step_warmup_s
    (a generative trial's: a request's life end to end at the speed that decided its capacity)."""
    key = (latency_limit, remeasure, unmeasured, step_s, life_s)
    if key not in _BUILT:  # in the session's temporary directory, which pytest removes as it does tmp_path
        _BUILT[key] = Path(tempfile.mkdtemp(prefix="built-study-", dir=tmp_path.parent))
        _build(_BUILT[key], *key)
    shutil.copytree(_BUILT[key] / "out", tmp_path / "out")
    s = _settings(tmp_path, latency_limit)
    url = search.storage_url(s)
    study = optuna.load_study(study_name=s.name, storage=search.open_storage(url, s.search),
                              sampler=search.make_sampler(s.search))
    study.set_user_attr("storage", url)  # what `_build` writes where the study is built
    return study


def _settings(tmp_path: Path, latency_limit: float):
    s = study_from_dict({"name": "exp", "model_repository": str(tmp_path), "model": "encoder_sim",
                         "traffic": {"path": "t.csv"}, "output": str(tmp_path / "out"),
                         "sla": {"latency_ms": latency_limit},
                         "search": {"sampler": "grid", "top_k": 2, "remeasure_repeats": 3}}, base_dir=tmp_path)
    s = dataclasses.replace(s, search=dataclasses.replace(
        s.search, max_batch_size=IntRange(4, 64, log=True), max_queue_delay_microseconds=IntRange(0, 2000, step=1000)))
    return s


def _build(tmp_path: Path, latency_limit: float, remeasure: bool, unmeasured: tuple, step_s: float | None,
           life_s: float | None) -> optuna.Study:
    """The study of `make_study`'s arguments, run by the search loop with `fake` measurements."""
    s = _settings(tmp_path, latency_limit)
    storage = search.storage_url(s)
    base = modelconfig.load(TEMPLATE)
    meta = {"scoring": "capacity", "model": "encoder_sim", "storage": storage, "study_file": "study.yaml",
            "base_config": modelconfig.to_text(base), "base_config_source": SOURCE,
            "preferred_batch_size": "none",
            "sla": dataclasses.asdict(s.sla), "traffic": {"path": "bursty.csv", "speed": 1.0},
            "price": {"price_per_hour": 2.0}, "lag_budget_ms": 5.0, "step_duration_s": step_s}

    def measure(p, h, limit=latency_limit):
        record = fake(p, h, limit, unmeasured)
        return dataclasses.replace(record, step_warmup_s=life_s) if record.capacity else record

    study = search.open_study(s, storage, sampler=search.make_sampler(s.search),
                              incumbent={"max_batch_size": 64, "max_queue_delay_microseconds": 0}, metadata=meta)
    search.run_trials(study, s, measure, n_trials=1000)
    if remeasure:
        repeats = search.remeasure(study, measure, s)
        study.set_user_attr("remeasured", [search.repeats_as_dict(r) for r in repeats])
    return study


def dig(d: dict, dotted: str):
    for part in dotted.split("."):
        d = d[part]
    return d


def test_outputs_hold_every_named_key_and_the_config_changes_only_tuned_fields(tmp_path):
    study = make_study(tmp_path)
    out = tmp_path / "out"
    summary = export.write_outputs(study, out)
    on_disk = json.loads((out / "summary.json").read_text())
    for who in ("best", "incumbent"):
        for key in ("params.max_batch_size", "params.max_queue_delay_microseconds", "capacity_rps",
                    "requests_per_dollar", "scores.capacity", "scores.utilization", "latency_ms.p50",
                    "latency_ms.p95", "latency_ms.p99", "fill_rate"):
            dig(on_disk, f"{who}.{key}")
    for key in ("improvement", "sla", "price_per_hour", "trials.complete", "trials.feasible",
                "trials.failed", "trials.pruned"):
        dig(on_disk, key)
    # the grid's best under a 30 ms p99: b=16 (p99 11.4-13.4 ms), highest delay
    assert on_disk["best"]["params"] == {"max_batch_size": 16, "max_queue_delay_microseconds": 2000}
    assert on_disk["incumbent"]["params"] == {"max_batch_size": 64, "max_queue_delay_microseconds": 0}
    assert on_disk["incumbent"]["feasible"] is False  # p99 5 + 25.6 ms > 30 ms
    assert on_disk["improvement"] is None and "incumbent did not meet" in on_disk["message"]
    repeats = summary["best"]["repeats"]
    # identical repeats, but each capacity was a bracket 10 % wide: the uncertainty is never below it
    assert repeats["values"] and repeats["observed_spread"] == pytest.approx(0.0)
    assert repeats["spread"] == pytest.approx(0.1) and not re.search(r"(?<![0-9.])0%", export.closing_table(summary))
    # capacity scoring: latency and fill rate at the capacity found
    assert on_disk["best"]["latency_ms"]["p99"] == pytest.approx(27.0)
    assert on_disk["best"]["fill_rate"] == pytest.approx(0.8)
    # Triton's split of the time beside the score, at the same operating point
    assert on_disk["best"]["queue_ms"] == pytest.approx(6.0) and on_disk["best"]["compute_ms"] == pytest.approx(9.0)
    assert on_disk["best"]["at_load"]["queue_ms"] == pytest.approx(1.0)
    assert "queue ms" in export.closing_table(summary) and "compute ms" in export.closing_table(summary)
    assert on_disk["price_per_hour"] == 2.0

    text = (out / "recommended" / "config.pbtxt").read_text()
    assert text.startswith(modelconfig.EXPORT_HEADER)  # what export and config set replace without --force
    assert "SLA: p99 latency <= 30.0 ms" in text and "traffic: bursty.csv" in text
    recommended = modelconfig.parse(text)
    changed = {path for path, _, _ in modelconfig.diff_fields(modelconfig.load(TEMPLATE), recommended)}
    assert changed == {"max_batch_size", "dynamic_batching.max_queue_delay_microseconds"}
    assert recommended.max_batch_size == 16
    for comment in ("# Incumbent settings as a training-derived", "# the training batch", "# owner: search team"):
        assert comment in text  # the user's comments go on into the recommended file
    assert (out / "incumbent" / "config.pbtxt").read_text() == SOURCE  # the incumbent as the user wrote it

    trials = pd.read_csv(out / "trials.csv")
    assert len(trials) == len(study.trials)
    assert {"number", "state", "max_batch_size", "max_queue_delay_microseconds", "capacity_rps",
            "requests_per_dollar", "latency_p99_ms", "fill_rate", "feasible"} <= set(trials.columns)


def test_improvement_is_best_over_incumbent_by_median(tmp_path):
    summary = export.summarize(make_study(tmp_path, latency_limit=40.0))
    best, inc = summary["best"], summary["incumbent"]
    assert inc["feasible"] and best["params"]["max_batch_size"] == 16
    assert summary["improvement"] == pytest.approx(best["requests_per_dollar"] / inc["requests_per_dollar"] - 1)
    assert summary["improvement"] > 0
    table = export.closing_table(summary)
    assert "incumbent" in table and "best" in table and f"{summary['improvement']:+.1%}" in table
    assert "p99 ms" in table and "fill rate" in table and "req/$" in table
    # uncertainty: capacities as brackets, the improvement as a range that holds its point value
    low, high = summary["improvement_range"]
    assert low < summary["improvement"] < high and f"{low:+.1%}" in summary["message"]
    cap = best["capacity_rps"]
    assert f"{cap:.3g}-{cap * 1.1:.3g}" in table or f"{cap:,.0f}-{cap * 1.1:,.0f}" in table


def test_each_sides_range_holds_every_capacity_its_repeats_allow(tmp_path):
    """The incumbent re-measured twice, its capacity searches ending between 17.27 and 18.83 req/s and
    between 18.83 and 21.47: its range reaches the second's own first failing speed, which the medians'
    bracket (18.05-20.15) leaves out, so the improvement's low end falls, the same in every output."""
    study = make_study(tmp_path, latency_limit=40.0)
    stored = study.user_attrs["remeasured"]
    at = next(i for i, r in enumerate(stored) if r["incumbent"])

    def run(lower: float, upper: float) -> TrialRecord:  # the price is 2 $/h: 1,800 req/$ per req/s
        return dataclasses.replace(fake(stored[at]["params"], Hints(), 40.0), scores={"capacity": lower * 1800.0},
                                   capacity=Bracket(rps=lower, speed=lower / 100.0, upper_rps=upper, steps=4))

    repeats = search.Repeats(stored[at]["params"], stored[at]["trial"], True, (run(17.27, 18.83), run(18.83, 21.47)),
                             "capacity")
    study.set_user_attr("remeasured", [*stored[:at], search.repeats_as_dict(repeats), *stored[at + 1:]])
    summary = export.summarize(study)
    inc, best = summary["incumbent"], summary["best"]
    assert inc["capacity_bracket"]["upper_rps"] == pytest.approx(20.15)  # the medians', as before
    assert inc["range"] == pytest.approx([17.27 * 1800, 21.47 * 1800])  # not 20.15 x 1,800
    low, high = summary["improvement_range"]
    assert low == pytest.approx(best["range"][0] / (21.47 * 1800) - 1)
    assert high == pytest.approx(best["range"][1] / (17.27 * 1800) - 1)
    assert f"between {low:+.1%} and {high:+.1%}" in summary["message"]
    assert f"({low:+.0%}..{high:+.0%})" in export.closing_table(summary)
    # a study stored before the repeats' own ranges were keeps the rule it had: from the medians' bracket
    study.set_user_attr("remeasured", [{k: v for k, v in r.items() if k != "ranges"}
                                       for r in study.user_attrs["remeasured"]])
    assert export.summarize(study)["incumbent"]["range"] == pytest.approx([17.27 * 1800, 20.15 * 1800])


def test_a_configuration_that_met_the_sla_in_one_of_two_re_measurements_is_not_confirmed(tmp_path):
    """Two repeats of which one missed the SLA: its median is half a measurement, and it is not confirmed:
    left out of the ranking (not 'cannot be told apart from the best'), with a note saying so."""
    study = make_study(tmp_path, latency_limit=40.0)
    stored = study.user_attrs["remeasured"]
    best = export.summarize(study)["best"]["trial"]
    at, other = next((i, r) for i, r in enumerate(stored) if not r["incumbent"] and r["trial"] != best)
    passing, missing = fake(other["params"], Hints(), 40.0), fake(other["params"], Hints(), 1.0)
    assert passing.meets_sla and not missing.meets_sla
    straddling = search.Repeats(other["params"], other["trial"], False, (missing, passing), "capacity")
    study.set_user_attr("remeasured", [*stored[:at], search.repeats_as_dict(straddling), *stored[at + 1:]])
    summary = export.summarize(study)
    assert other["trial"] not in [e["trial"] for e in summary["top"]]
    assert other["trial"] not in summary["indistinguishable_from_best"]
    assert (f"trial {other['trial']} ({space.describe(other['params'])}) met the SLA in 1 of 2 re-measurements: "
            "not confirmed, left out of the ranking") in summary["notes"]
    # the incumbent so: no gain over half a measurement, in the summary or the report's headline
    from tuner.report._html import recommendation_line
    from tuner.report._load import StudyOutput

    at = next(i for i, r in enumerate(stored) if r["incumbent"])
    inc = stored[at]
    straddling = search.Repeats(inc["params"], inc["trial"], True,
                                (fake(inc["params"], Hints(), 1.0), fake(inc["params"], Hints(), 40.0)), "capacity")
    study.set_user_attr("remeasured", [*stored[:at], search.repeats_as_dict(straddling), *stored[at + 1:]])
    summary = export.summarize(study)
    assert summary["improvement"] is None and summary["incumbent"]["feasible"] is False
    line = recommendation_line(StudyOutput(path=tmp_path, summary=summary, trials=pd.DataFrame(), params=[],
                                           recommended_config=""))
    assert line.endswith("the incumbent did not meet the SLA."), line


def test_a_best_that_cannot_be_told_apart_from_the_incumbent_says_keep_the_incumbent(tmp_path):
    """The incumbent re-measured as close to the best as the best's own bracket: the gain lies within the
    measurements' uncertainty, so the verdict is to keep the incumbent, the gain and its range beside it
    (the report's headline says the same)."""
    from tuner.report._html import recommendation_line
    from tuner.report._load import StudyOutput

    study = make_study(tmp_path, latency_limit=40.0)
    apart = export.summarize(study)
    assert "keep_incumbent" not in apart and not apart["message"].startswith("keep")
    stored = study.user_attrs["remeasured"]
    at = next(i for i, r in enumerate(stored) if r["incumbent"])
    cap = apart["best"]["capacity_rps"]

    def run(lower: float, upper: float) -> TrialRecord:  # the price is 2 $/h: 1,800 req/$ per req/s
        return dataclasses.replace(fake(stored[at]["params"], Hints(), 40.0), scores={"capacity": lower * 1800.0},
                                   capacity=Bracket(rps=lower, speed=lower / 100.0, upper_rps=upper, steps=4))

    close = search.Repeats(stored[at]["params"], stored[at]["trial"], True,
                           (run(cap * 0.97, cap * 1.07), run(cap * 0.97, cap * 1.07)), "capacity")
    study.set_user_attr("remeasured", [*stored[:at], search.repeats_as_dict(close), *stored[at + 1:]])
    summary = export.summarize(study)
    low, high = summary["improvement_range"]
    assert summary["keep_incumbent"] and low < 0 < high
    assert summary["message"].startswith(f"keep the incumbent: the best measured, trial {summary['best']['trial']}, "
                                         f"is {summary['improvement']:+.1%} requests per dollar over the incumbent "
                                         f"(between {low:+.1%} and {high:+.1%}), which cannot be told apart")
    assert f"trial(s) {summary['incumbent']['trial']}" not in summary["message"]  # said once, as the verdict
    line = recommendation_line(StudyOutput(path=tmp_path, summary=summary, trials=pd.DataFrame(), params=[],
                                           recommended_config=""))
    assert line.startswith("Keep the incumbent: the best measured, ") and f"between {low:+.1%}" in line
    # what recommended/ holds, `tuner export` writes and the check-it line replays is the incumbent, kept
    text = export.recommended_config(study, summary)
    assert "# changed: nothing (keep the incumbent)" in text and "max_batch_size: 64" in text
    assert (f"# improvement over the incumbent: none: keep the incumbent (the best measured, trial "
            f"{summary['best']['trial']}, is {summary['improvement']:+.1%}") in text
    assert export.recommended_entry(summary) is summary["incumbent"]
    # ranges that only touch are apart: a range's top is the score at its first failing speed
    best_low = summary["best"]["range"][0] / 1800.0
    touching = search.Repeats(stored[at]["params"], stored[at]["trial"], True,
                              (run(best_low * 0.85, best_low), run(best_low * 0.85, best_low)), "capacity")
    study.set_user_attr("remeasured", [*stored[:at], search.repeats_as_dict(touching), *stored[at + 1:]])
    apart = export.summarize(study)
    assert "keep_incumbent" not in apart and apart["improvement_range"][0] == 0.0
    assert export.recommended_entry(apart) is apart["best"]


@pytest.mark.parametrize("limited_by, mark, says", [("load_generator", " *", "* limited by the load generator"),
                                                    ("traffic", " ^", "^ limited by the traffic")])
def test_a_capacity_a_limit_other_than_the_server_stopped_is_marked_and_said(tmp_path, limited_by, mark, says):
    summary = export.summarize(make_study(tmp_path, latency_limit=40.0))
    summary["best"]["capacity_bracket"] = {**summary["best"]["capacity_bracket"], "limited_by": limited_by}
    summary["top"][0] = summary["best"]
    table = export.closing_table(summary)
    row = [line for line in table.splitlines() if line.lstrip().startswith("best")][0]
    assert mark + " " in row + " " and says in table, table
    other = " ^" if mark == " *" else " *"
    assert other + " " not in row + " "


def test_a_capacity_no_speed_failed_is_a_floor_marked_and_said(tmp_path):
    """A capacity search that met the SLA at every speed it tried (the speed cap or the step budget
    stopped it) gives a floor, not a bracket: the table marks it and the verdict's range says so."""
    study = make_study(tmp_path, latency_limit=40.0)
    summary = export.summarize(study)
    assert summary["notes"] == [] and "+ " not in export.closing_table(summary).splitlines()[1] + " "
    for who in ("best", "incumbent"):
        bracket = summary[who]["capacity_bracket"]
        summary[who]["capacity_bracket"] = {**bracket, "upper_rps": None, "converged": False}
        entry = summary[who]
        assert export.is_floor(entry)
        notes = export._floor_notes(summary)
        assert len(notes) == 1 and "met the SLA at every speed tried" in notes[0]
        if who == "best":
            assert notes[0].startswith("the recommendation's capacity is a floor: its capacity search") \
                and "the gain may be larger" in notes[0]
            summary["top"][0] = summary["best"]
            row = [line for line in export.closing_table(summary).splitlines() if line.lstrip().startswith("best")][0]
            assert re.search(r"[0-9]\+ ", row), row
    assert export._floor_notes(summary)[0].startswith("the recommendation's and the incumbent's capacities are floors")
    assert "the gain may" not in export._floor_notes(summary)[0]  # both floors: no direction to say
    summary["incumbent"]["capacity_bracket"]["limited_by"] = "traffic"  # said by its own note (^)
    assert not export.is_floor(summary["incumbent"])


def test_without_remeasurement_the_best_trial_stands(tmp_path):
    summary = export.summarize(make_study(tmp_path, remeasure=False))
    assert summary["best"]["params"]["max_batch_size"] == 16 and "repeats" not in summary["best"]


@pytest.mark.parametrize("step_s,noted", [(5.0, True), (20.0, False), (None, False)])
def test_capacity_steps_shorter_than_two_requests_lives_are_noted_under_the_verdict(tmp_path, capsys, step_s, noted):
    """A generative trial's capacity steps lasting under 2 requests' lives (6 s here, its step_warmup_s)
    read the engine's streamed rate low: the summary and the closing lines say so, with the length that
    measures it; longer steps, or a study that kept no step length (an older one), say nothing."""
    from tuner.cli._common import print_outcome

    summary = export.summarize(make_study(tmp_path, latency_limit=40.0, step_s=step_s, life_s=6.0))
    assert summary["step_duration_s"] == step_s and summary["best"]["step_warmup_s"] == 6.0
    assert len(summary["notes"]) == noted
    print_outcome(summary, str(tmp_path / "out"))
    lines = capsys.readouterr().out.splitlines()
    notes = [line for line in lines if line.startswith("note: ")]
    assert len(notes) == noted
    if noted:
        assert "lasted 5 s, under 2x a request's life" in notes[0] and "(6.0 s)" in notes[0]
        assert "step_duration_s: 12 s or more" in notes[0]
        assert lines.index(notes[0]) == lines.index(summary["message"]) + 1  # under the verdict


def test_a_generative_capacity_at_the_recorded_load_is_noted_by_a_requests_life_there():
    # every step above the load failed: no step decided the capacity (no step_warmup_s), and an 8-s step
    # under 2x a 7.7-s life read the engine low; that went unsaid
    at_load = {"unit": "tokens", "step_duration_s": 8.0,
               "best": {"step_warmup_s": None, "latency_ms": {"p50": 7700.0}}}
    notes = export._short_step_notes(at_load)
    assert len(notes) == 1 and "at the recorded load, the recommendation's capacity (7.7 s)" in notes[0], notes
    assert "step_duration_s: 16 s or more" in notes[0]
    assert export._short_step_notes({**at_load, "step_duration_s": 20.0}) == []
    assert export._short_step_notes({**at_load, "unit": "requests"}) == []  # an encoder's latency is no life


def test_nothing_meets_the_sla_names_the_closest_and_writes_no_config(tmp_path):
    study = make_study(tmp_path, latency_limit=5.0)
    out = tmp_path / "out"
    summary = export.write_outputs(study, out)
    assert summary["feasible"] is False and summary["best"] is None
    assert summary["message"].startswith("no configuration met the SLA")
    assert summary["closest"]["params"] == {"max_batch_size": 4, "max_queue_delay_microseconds": 0}
    assert "closest: trial" in summary["message"] and "max_batch_size=4" in summary["message"]
    assert not (out / "recommended" / "config.pbtxt").exists()
    assert main(["export", str(out)]) == 3


def test_export_command_from_a_directory_and_from_a_storage(tmp_path, capsys):
    study = make_study(tmp_path)
    out = tmp_path / "out"
    export.write_outputs(study, out)
    (out / "recommended" / "config.pbtxt").unlink()
    assert main(["export", str(out)]) == 0
    assert modelconfig.load(out / "recommended" / "config.pbtxt").max_batch_size == 16
    target = tmp_path / "elsewhere" / "config.pbtxt"
    url = f"sqlite:///{out / 'study.db'}"
    # a file the person names goes into a directory that is there, as every --json: a typo makes no tree
    assert main(["export", "--storage", url, "--study", "exp", "-o", str(target)]) == 2
    assert "cannot write: no directory" in capsys.readouterr().err and not target.parent.exists()
    target.parent.mkdir()
    assert main(["export", "--storage", url, "--study", "exp", "-o", str(target)]) == 0
    assert modelconfig.load(target).max_batch_size == 16
    capsys.readouterr()
    assert main(["export", "--storage", url]) == 0
    assert "max_batch_size: 16" in capsys.readouterr().out


def test_export_never_replaces_a_file_tuner_did_not_write_unless_forced(tmp_path, capsys):
    """`-o` at the user's own config.pbtxt (their comments, their fields) is refused in one line, the file
    left byte for byte; an earlier export there, or the same text, is replaced; --force replaces it."""
    study = make_study(tmp_path)
    out = tmp_path / "out"
    export.write_outputs(study, out)
    live = tmp_path / "models" / "encoder_sim" / "config.pbtxt"
    live.parent.mkdir(parents=True)
    live.write_text(SOURCE)
    capsys.readouterr()
    assert main(["export", str(out), "-o", str(live)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "exists and tuner did not write it: give --force" in err, err
    assert live.read_text() == SOURCE
    url = f"sqlite:///{out / 'study.db'}"
    assert main(["export", "--storage", url, "--study", "exp", "-o", str(live)]) == 2  # from a storage too
    assert live.read_text() == SOURCE
    assert main(["export", str(out), "-o", str(live), "--force"]) == 0
    exported = live.read_text()
    assert exported.startswith("# Recommended by tuner ") and modelconfig.load(live).max_batch_size == 16
    # an earlier export is tuner's: replaced without --force (a later study's recommendation)
    live.write_text(exported.replace("max_batch_size: 16", "max_batch_size: 8"))
    assert main(["export", str(out), "-o", str(live)]) == 0
    # the same recommendation again, its header dated by this export
    assert live.read_text().splitlines()[1:] == exported.splitlines()[1:]
    assert live.read_text().startswith("# Recommended by tuner ") and modelconfig.load(live).max_batch_size == 16
    # the config without tuner's header is the user's again
    live.write_text(exported.split("\n\n", 1)[1])
    assert main(["export", str(out), "-o", str(live)]) == 2
    # a model.json holds no header: the same text is replaced (nothing is lost), another is not
    engine = tmp_path / "model.json"
    engine.write_text('{"max_num_seqs": 8}\n')
    assert modelconfig.written_by_tuner(engine, text='{"max_num_seqs": 8}\n')
    assert not modelconfig.written_by_tuner(engine, text='{"max_num_seqs": 16}\n')


def test_export_never_writes_over_what_the_study_reads_even_forced(tmp_path, capsys):
    """The study file and its traffic (a file of it, or a new file where its traffic directory would
    replay it) are refused with --force too: only a config the person owns is theirs to replace."""
    study = make_study(tmp_path)
    (tmp_path / "study.yaml").write_text("name: exp\n")
    (tmp_path / "traffic").mkdir()
    (tmp_path / "traffic" / "day1.csv").write_text("timestamp,seq_len\n0,8\n")
    study.set_user_attr("study_file", str(tmp_path / "study.yaml"))
    study.set_user_attr("traffic", {"path": str(tmp_path / "traffic"), "speed": 1.0})
    url = f"sqlite:///{tmp_path / 'out' / 'study.db'}"
    for target, why in ((tmp_path / "study.yaml", "the same file as the study file"),
                        (tmp_path / "traffic" / "day1.csv", "the same file as the study's traffic"),
                        (tmp_path / "traffic" / "day2.csv", "among the study's traffic files")):
        before = target.read_text() if target.exists() else None
        assert main(["export", "--storage", url, "--study", "exp", "-o", str(target), "--force"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and why in err, err
        assert (target.read_text() if target.exists() else None) == before
    assert main(["export", "--storage", url, "--study", "exp", "-o", str(tmp_path / "config.pbtxt")]) == 0


def test_export_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["export", str(tmp_path / "missing")]) == 2
    assert main(["export", "--storage", str(tmp_path / "none.journal")]) == 2
    make_study(tmp_path)
    assert main(["export", "--storage", f"sqlite:///{tmp_path / 'out' / 'study.db'}", "--study", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert all(line.startswith("tuner: error: ") for line in err) and len(err) == 3
    assert "no study named 'nope'" in err[-1]


def test_a_study_stopped_before_its_re_measurement_is_not_exported_and_nothing_is_made(tmp_path, capsys):
    make_study(tmp_path, remeasure=False)  # as a tune interrupted in its search leaves it
    url = f"sqlite:///{tmp_path / 'out' / 'study.db'}"
    target = tmp_path / "deploy" / "config.pbtxt"
    target.parent.mkdir()
    for argv in (["export", "--storage", url, "-o", str(target)],
                 ["finish", "--storage", url, "--output", str(tmp_path / "outputs"), "--no-remeasure"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "study 'exp' is not finished: its search stopped after" in err, err
        assert "run the same `tuner tune` again to finish it" in err
    assert not target.exists() and not (tmp_path / "outputs").exists()


def test_an_export_that_fails_makes_no_directory(tmp_path, capsys):
    make_study(tmp_path)
    url = f"sqlite:///{tmp_path / 'out' / 'study.db'}"
    (tmp_path / "new").mkdir()
    assert main(["export", "--storage", url, "--study", "nope", "-o", str(tmp_path / "new" / "x.pbtxt")]) == 2
    assert "no study named 'nope'" in capsys.readouterr().err and not any((tmp_path / "new").iterdir())


@pytest.mark.parametrize("where, message", [
    ("dir", "cannot write: it is a directory"),
    ("proc", "cannot write"),
    ("long", "File name too long"),
])
def test_export_to_a_place_it_cannot_write_is_one_line_and_exit_2(tmp_path, capsys, where, message):
    make_study(tmp_path)
    target = {"dir": tmp_path, "proc": Path("/proc/tuner-export/config.pbtxt"),
              "long": tmp_path / ("x" * 300)}[where]
    assert main(["export", str(tmp_path / "out"), "-o", str(target)]) == 2
    err = capsys.readouterr().err
    # tuner.paths checks -o before the study is read, naming the path as given
    assert err.startswith(f"tuner: error: {target}") and message in err and err.count("\n") == 1, err


def test_unmeasured_trials_are_listed_with_their_reason_and_never_scored(tmp_path):
    study = make_study(tmp_path, unmeasured=(8,))
    summary = export.write_outputs(study, tmp_path / "out")
    assert summary["trials"]["unmeasured"] == 3 and summary["trials"]["failed"] == 0
    listed = summary["unmeasured"]
    assert {u["params"]["max_batch_size"] for u in listed} == {8}
    assert all(u["send_lag_p99_ms"] == pytest.approx(8.49) and "send lag" in u["reason"] for u in listed)
    assert summary["best"]["params"]["max_batch_size"] == 16  # decided on the measured trials
    table = export.closing_table(summary)
    assert "unmeasured: 3 trial(s)" in table and "send lag p99 8.49 ms" in table
    trials = pd.read_csv(tmp_path / "out" / "trials.csv")
    assert not trials.loc[trials["outcome"] == "unmeasured", "feasible"].any()
    advice = export.unmeasured_advice(summary)
    assert "raise replay.lag_budget_ms" in advice and "8.49 ms against a budget of 5 ms" in advice



def test_a_study_none_of_whose_trials_was_judged_says_so_in_its_summary_as_on_the_terminal(tmp_path):
    """No trial measured (all unmeasured): summary.json's message is the advice `tuner tune` ends with
    (its UnmeasuredError), not "no configuration met the SLA" with no closest one."""
    study = make_study(tmp_path, remeasure=False, unmeasured=(4, 8, 16, 32, 64))
    summary = export.write_outputs(study, tmp_path / "out")
    assert summary["best"] is None and summary["closest"] is None and summary["trials"]["complete"] == 0
    assert summary["message"] == export.unmeasured_advice(summary)
    assert summary["message"].startswith("no trial could be measured: the load generator could not send")
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["message"] == summary["message"]


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB file system (tmpfs, mounted as root): room for a study's outputs, not for its report."""
    import os
    import subprocess

    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0:
        if os.environ.get("TUNER_REQUIRE_ALL") == "1":
            pytest.fail("TUNER_REQUIRE_ALL=1 but mounting a small file system needs root")
        pytest.skip("mounting a small file system needs root")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_a_full_disk_while_writing_the_report_is_one_line_and_leaves_no_partial_file(tmp_path, small_disk, capsys):
    export.write_outputs(make_study(tmp_path), small_disk)
    before = sorted(p.name for p in small_disk.iterdir())
    assert main(["report", str(small_disk)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "report.html: cannot write (No space left on device)" in err, err
    assert sorted(p.name for p in small_disk.iterdir()) == before  # no report.html, no temporary file


def test_a_generative_closing_table_shows_the_engines_batching_and_warns_of_a_late_emulated_gpu():
    def row(trial, seqs, per_dollar, engine):
        return {"trial": trial, "params": {"max_num_seqs": seqs}, "feasible": True, "per_dollar": per_dollar,
                "unit": "tokens", "capacity_rps": 2.0, "capacity_bracket": None, "latency_ms": {"p99": 900.0},
                "ttft_ms": {"p99": 120.0}, "tpot_ms": {"p99": 20.0}, "output_tokens_per_s": 300.0, "engine": engine}

    best = row(1, 256, 2.0e6, {"preemptions": 0.0, "running_peak": 41.0, "waiting_peak": 0.0, "kv_cache_peak": 0.35,
                               "emulated_overrun_share": 0.01})
    incumbent = row(0, 8, 1.0e6, {"preemptions": 12.0, "running_peak": 8.0, "waiting_peak": 30.0,
                                  "kv_cache_peak": 0.97, "emulated_overrun_share": 0.12})
    summary = {"sla": {"percentile": 99}, "top": [best, incumbent], "incumbent": incumbent, "best": best}
    table = export.closing_table(summary)
    header, first, second = table.splitlines()[:3]
    assert "running" in header and "KV peak" in header and "preempt" in header
    assert re.search(r"\b41\b.*\b35%.*\b0\b", first) and re.search(r"\b97%\s+12\b", second), table
    # the incumbent's emulated GPU ran 12 % of its steps late, the best's 1 %: only the first is named
    assert "emulated GPU" in table and "trial 0: 12%" in table and "trial 1" not in table.split("emulated GPU")[1]
    real = export.closing_table({**summary, "top": [{**best, "engine": {}}], "incumbent": None, "best": best})
    assert "emulated GPU" not in real and re.search(r"-\s+-\s+-", real.splitlines()[1])  # an engine not read


# --- the closing line that measures the recommendation again -------------------------------------------


def _finished(tmp_path, *, scoring: str = "capacity", unit: str = "requests") -> dict:
    """A finished tune's output directory: its summary.json and the recommended file of its kind."""
    (tmp_path / "recommended").mkdir(exist_ok=True)
    (tmp_path / "recommended" / ("model.json" if unit == "tokens" else "config.pbtxt")).write_text("x")
    summary = {"feasible": True, "scoring": scoring, "unit": unit, "study_file": "my study.yaml",
               "traffic": {"speed": 0.25}, "best": {"params": {"max_batch_size": 16}, "capacity_speed": 1.2345678}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    return summary


@pytest.mark.parametrize("scoring,speed", [("capacity", "1.235"), ("utilization", "0.25")])
def test_the_check_command_replays_the_recommendation_at_the_speed_that_decided_it(tmp_path, scoring, speed):
    command = export.check_command(_finished(tmp_path, scoring=scoring), str(tmp_path))
    assert command == (f"tuner replay 'my study.yaml' --config {tmp_path / 'recommended' / 'config.pbtxt'} "
                       f"--speed {speed} --step")


def test_the_check_command_names_the_study_file_from_wherever_it_is_printed(tmp_path, monkeypatch):
    """A study is recorded by its absolute path (`tuner finish` or `tuner report` may run elsewhere), and
    the command names it relative to the working directory below it, absolute elsewhere."""
    from support import write_tune_study

    from tuner.settings import read_study
    from tuner.tune import _metadata, prepare

    write_tune_study(tmp_path, "here")
    monkeypatch.chdir(tmp_path)
    recorded = _metadata(prepare(read_study("here.yaml")))["study_file"]
    assert recorded == str(tmp_path / "here.yaml")
    summary = {**_finished(tmp_path), "study_file": recorded}
    assert export.check_command(summary, ".").startswith("tuner replay here.yaml --config ")
    monkeypatch.chdir(tmp_path / "recommended")
    assert export.check_command(summary, str(tmp_path)).startswith(f"tuner replay {tmp_path / 'here.yaml'} --config ")


def test_the_check_command_of_a_vllm_model_names_its_model_json_and_none_without_a_recommendation(tmp_path):
    summary = _finished(tmp_path, unit="tokens")
    assert f"--config {tmp_path / 'recommended' / 'model.json'} " in export.check_command(summary, str(tmp_path))
    # its capacity steps replayed 3.7 s of traffic before their window: so does the check
    warmed = {**summary, "best": {**summary["best"], "step_warmup_s": 3.7142}}
    assert export.check_command(warmed, str(tmp_path)).endswith("--speed 1.235 --step --warmup 3.71")
    assert "--warmup" not in export.check_command({**warmed, "scoring": "utilization"}, str(tmp_path))
    assert export.check_command({**summary, "feasible": False}, str(tmp_path)) is None
    (tmp_path / "recommended" / "model.json").unlink()
    assert export.check_command(summary, str(tmp_path)) is None  # no recommended file written


def test_finish_reads_the_study_files_storage_when_output_names_another_directory(tmp_path, capsys):
    # --output says where the outputs go; the storage stays the study file's (its output directory's
    # study.db): it was looked for in the new directory instead ("no such database file")
    make_study(tmp_path)
    (tmp_path / "study.yaml").write_text(yaml.safe_dump({
        "name": "exp", "model_repository": str(tmp_path), "model": "encoder_sim", "traffic": {"path": "t.csv"},
        "output": str(tmp_path / "out"), "sla": {"latency_ms": 30.0}}))
    elsewhere = tmp_path / "elsewhere"
    assert main(["finish", str(tmp_path / "study.yaml"), "--no-remeasure", "--output", str(elsewhere)]) == 0, \
        capsys.readouterr().err
    assert json.loads((elsewhere / "summary.json").read_text())["study_name"] == "exp"
    assert not (elsewhere / "study.db").exists()


def test_a_configuration_that_missed_the_sla_says_which_limit_in_the_table(tmp_path):
    summary = export.summarize(make_study(tmp_path, latency_limit=40.0))
    summary["incumbent"] = {**summary["incumbent"], "feasible": False,
                            "sla_reason": "error rate 54.80% > 0.10%; p99 169 ms"}
    summary["top"] = [e for e in summary["top"] if e["trial"] != summary["incumbent"]["trial"]]
    row = [line for line in export.closing_table(summary).splitlines() if line.lstrip().startswith("incumbent")][0]
    assert "SLA missed: error rate 54.80% > 0.10%" in row and "p99 169" not in row, row


def test_a_re_measured_bracket_says_what_its_repeats_brackets_said(tmp_path):
    """Reviewer V3/U5: summary.json said a re-measured capacity bracket had not converged where every
    repeat's had, and the closing table lost the load generator's limit (`*`) of a re-measured entry."""
    study = make_study(tmp_path, latency_limit=40.0)
    summary = export.summarize(study)
    assert summary["best"]["capacity_bracket"]["converged"] is True  # every repeat's bracket converged
    assert summary["incumbent"]["capacity_bracket"]["converged"] is True
    stored = study.user_attrs["remeasured"]
    at = next(i for i, r in enumerate(stored) if r["trial"] == summary["best"]["trial"])
    run = fake(stored[at]["params"], Hints(), 40.0)
    run = dataclasses.replace(run, capacity=dataclasses.replace(run.capacity, limited_by="load_generator"))
    repeats = search.Repeats(stored[at]["params"], stored[at]["trial"], False, (run, run, run), "capacity")
    study.set_user_attr("remeasured", [*stored[:at], search.repeats_as_dict(repeats), *stored[at + 1:]])
    summary = export.summarize(study)
    assert summary["best"]["capacity_bracket"]["limited_by"] == "load_generator"
    table = export.closing_table(summary)
    row = [line for line in table.splitlines() if line.lstrip().startswith("best")][0]
    assert " * " in row + " " and "* limited by the load generator" in table, table


def test_an_sla_on_the_slowest_request_shows_its_figure_in_the_closing_table():
    """Reviewer V2: `sla.percentile: 100` is checked against the max, which summary.json keeps as "max";
    the closing table looked up "p100" and printed `-` in every row."""
    def row(trial, unit):
        return {"trial": trial, "params": {"max_batch_size": 8}, "feasible": True, "per_dollar": 1.0e6,
                "unit": unit, "capacity_rps": 2.0, "capacity_bracket": None,
                "latency_ms": {"p99": 150.0, "max": 181.0}, "ttft_ms": {"p99": 110.0, "max": 123.0},
                "tpot_ms": {"p99": 20.0, "max": 27.5}, "output_tokens_per_s": 300.0, "engine": {}}

    for unit, heads, figures in (("requests", ["max ms"], ["181"]),
                                 ("tokens", ["TTFT max ms", "TPOT max ms"], ["123", "27.5"])):
        best = row(1, unit)
        table = export.closing_table({"sla": {"percentile": 100}, "top": [best], "incumbent": None, "best": best})
        header, first = table.splitlines()[:2]
        assert all(h in header for h in heads) and all(f in first.split() for f in figures), table


def test_a_re_measured_entry_that_lost_repeats_says_how_many_measured(tmp_path):
    """Reviewer U2: after an interrupted re-measurement the best had 1 measured and 1 unmeasured repeat
    of 2; the closing table printed its spread as if both had measured."""
    study = make_study(tmp_path, latency_limit=40.0)
    stored = study.user_attrs["remeasured"]
    best = export.summarize(study)["best"]
    assert "repeats measured" not in export.closing_table(export.summarize(study))  # every repeat measured
    at = next(i for i, r in enumerate(stored) if r["trial"] == best["trial"])
    lost = TrialRecord(params=dict(stored[at]["params"]), outcome=UNMEASURED, note="interrupted")
    repeats = search.Repeats(stored[at]["params"], stored[at]["trial"], False,
                             (fake(stored[at]["params"], Hints(), 40.0), lost), "capacity")
    study.set_user_attr("remeasured", [*stored[:at], search.repeats_as_dict(repeats), *stored[at + 1:]])
    summary = export.summarize(study)
    assert summary["best"]["repeats"]["unmeasured_runs"] == 1
    table = export.closing_table(summary)
    row = [line for line in table.splitlines() if line.lstrip().startswith("best")][0]
    assert "10%, 1 of 2 repeats measured" in row, table  # the bracket's width, and the repeats behind it
