"""`tuner tune`'s trial loop as the user sees it, without a server (the evaluation is `support`'s fake):
the trial bar's total, the trials `--check` announces, the counts of the summary and of each host,
what the summary says of a search its time limit stopped, and a space no request of the traffic fits."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from support import FakeEvaluation, SlowFakeEvaluation, write_tune_study

from tuner import export, search
from tuner import tune as tune_module
from tuner.cli import main
from tuner.settings import read_study

# encoder_sim's incumbent (max_batch_size 64, no delay) is one of these 3 grid points
ON_GRID = {"search.max_batch_size": {"low": 16, "high": 64, "log": True}, "search.trials": 100,
           "search.remeasure_repeats": 1}


class Bar(tune_module.Progress):
    """The trial bar as `tuner.cli._progress.Bars` draws it: its total, and the trials done it shows."""

    def __init__(self):
        self.totals, self.done, self.study = [], [], None

    def trials(self, study, total):
        self.totals.append(total)
        self.study = study

    def trial_done(self, study):
        self.done.append(search.spent_done(study))


@pytest.fixture
def fake_server(monkeypatch):
    """Every trial measured by `evaluation` (a fake: no server starts)."""
    evaluation = [FakeEvaluation(latency_ms=1000)]

    @contextlib.contextmanager
    def session(*_args, **_kw):
        yield evaluation[0]

    monkeypatch.setattr(tune_module, "session", session)
    return evaluation


def _twice(settings) -> tuple[Bar, Bar, dict]:
    """`tuner tune S --trials 2`, then `--trials 10` (it resumes: the grid's last point, and the incumbent's
    point, a duplicate): each run's bar and the summary."""
    first, second = Bar(), Bar()
    tune_module.tune(settings, 2, progress=first)
    return first, second, tune_module.tune(settings, 10, progress=second)


def test_a_grid_study_whose_incumbent_is_a_grid_point_fills_its_bar(tmp_path, fake_server):
    first, second, _summary = _twice(read_study(write_tune_study(tmp_path, "grid", **ON_GRID)))
    assert first.totals == [2] and first.done[-1] == 2
    assert second.totals == [3] and second.done[-1] == 3  # the incumbent and the 2 other points


def test_the_summary_and_each_host_count_a_duplicate_grid_point_alike(tmp_path, fake_server):
    _first, second, summary = _twice(read_study(write_tune_study(tmp_path, "grid", **ON_GRID)))
    assert summary["trials"]["duplicate"] == 1 and summary["trials"]["failed"] == 0
    rows = export.hosts(second.study)
    for key in ("complete", "pruned", "failed", "duplicate"):
        assert sum(row[key] for row in rows) == summary["trials"][key], (key, rows)


@pytest.mark.parametrize(("over", "says"), [
    (ON_GRID, "grid, 3 trials (3 grid points, the incumbent one of them; search.trials 100)"),
    ({**ON_GRID, "search.max_batch_size": {"low": 16, "high": 32, "log": True}},
     "grid, 3 trials (2 grid points and the incumbent; search.trials 100)"),
])
def test_the_check_says_the_trials_a_grid_study_will_run(tmp_path, capsys, over, says):
    study = write_tune_study(tmp_path, "check", **over)
    assert main(["tune", str(study), "--check"]) == 0
    assert says in capsys.readouterr().out


def test_a_search_its_time_limit_stopped_is_said_in_the_closing_text_and_the_summary(tmp_path, capsys,
                                                                                  fake_server):
    fake_server[0] = SlowFakeEvaluation(latency_ms=1000)  # 0.5 s a trial: past the limit after the first
    study = write_tune_study(tmp_path, "late", **ON_GRID, **{"search.timeout_s": 0.2})
    assert main(["tune", str(study), "--quiet"]) == 0
    line = "search: stopped by its time limit (search.timeout_s 0.2 s) after 1 of 3 trials; no trial started after it"
    assert f"note: {line}" in capsys.readouterr().out
    summary = json.loads((Path(read_study(study).output) / export.SUMMARY).read_text())
    assert summary["search_timed_out"] is True and summary["search_timeout_s"] == 0.2
    assert line in summary["notes"] and summary["trials"]["total"] == 1
    fake_server[0] = FakeEvaluation(latency_ms=1000)
    assert main(["tune", str(study), "--quiet", "--timeout", "600"]) == 0  # resumed: it runs its trials
    summary = json.loads((Path(read_study(study).output) / export.SUMMARY).read_text())
    assert summary["search_timed_out"] is False and not any("time limit" in n for n in summary["notes"])


@pytest.mark.parametrize("check", [True, False])
def test_traffic_above_every_max_batch_size_of_the_search_is_refused_naming_the_study(tmp_path, capsys, check):
    from support import PROFILE

    from tuner.traffic import read_traffic

    traffic = read_traffic(PROFILE).head(400).assign(batch_size=1)
    traffic.loc[17, "batch_size"] = 5
    traffic.to_csv(tmp_path / "rows.csv", index=False)
    study = write_tune_study(tmp_path, "rows", **{"traffic.path": str(tmp_path / "rows.csv"),
                                                  "search.max_batch_size": {"low": 1, "high": 4}})
    assert main(["tune", str(study), *(["--check"] if check else [])]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("tuner: error: ")]
    assert "Traceback" not in err and len(errors) == 1, err
    assert errors[0].startswith(f"tuner: error: {study}: search.max_batch_size: the traffic has a request of 5 rows ")


def test_the_trials_of_this_process_report_each_replay_to_the_progress(tmp_path, monkeypatch):
    # a generative trial lasts minutes: each of its replays reaches the bar (Progress.step)
    evaluation, given = FakeEvaluation(latency_ms=1000), []

    @contextlib.contextmanager
    def session(*_args, **kw):
        given.append(kw.get("on_measure"))
        yield evaluation

    monkeypatch.setattr(tune_module, "session", session)
    bar = Bar()
    tune_module.tune(read_study(write_tune_study(tmp_path, "grid", **ON_GRID)), 2, progress=bar)
    assert given and all(hook == bar.step for hook in given), given
