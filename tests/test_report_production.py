"""`tuner report AUDIT.json` (tuner/report/_production.py): a production audit's JSON, as `tuner audit
--prometheus --json` writes it, drawn as its hourly series with the audit's thresholds; a file that is
not one is one line, exit 2."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tuner import audit as replay_audit
from tuner.audit import Baseline
from tuner.cli import main
from tuner.files import json_safe
from tuner.production import judge
from tuner.production._figures import COLUMNS, SECONDS
from tuner.production._series import Counters
from tuner.report import _production as page

BASELINE = Baseline("tuned", {"max_batch_size": 32}, 4.0)


def audit_json(tmp_path, *, baseline: Baseline | None = BASELINE):
    """Three hours of one instance: 1, 2 and 3 req/s in batches of 4, 8 and 16 of 32; the JSON's path."""
    rows = [(f"2026-01-01 0{h}:00", "a", 3600 * h, 0, 3600 * h, 900 * h // (2 ** (h - 1)), 1000 * h, 5000 * h, 3600)
            for h in (1, 2, 3)]
    frame = pd.DataFrame(rows, columns=["end", "instance", *COLUMNS, SECONDS])
    frame["end"] = pd.to_datetime(frame["end"], utc=True)
    counters = Counters(increases=frame.set_index(["end", "instance"]),
                        ends=pd.DatetimeIndex(frame["end"].unique()), resets={"a": 0})
    start = pd.Timestamp("2026-01-01 00:00", tz="UTC").timestamp()
    a = judge(counters, model="m", prometheus="http://p", start=start, end=start + 3 * 3600, step_s=3600,
              max_batch_size=32, price_per_hour=2.0, max_error_rate=0.001, baseline=baseline)
    path = tmp_path / "audit.json"
    path.write_text(json.dumps(json_safe(a.as_dict()), default=str))
    return path


def test_the_thresholds_are_the_audits():
    assert (page.LOW_FILL, page.INEFFICIENT, page.HEALTHY) == (
        replay_audit.LOW_FILL, replay_audit.INEFFICIENT, replay_audit.HEALTHY)


def test_the_hourly_series_are_plotted_with_the_thresholds(tmp_path):
    data = json.loads(audit_json(tmp_path).read_text())
    fig = page.production_figure(data)
    traces = {t.name: list(t.y) for t in fig.data}
    assert traces["per replica"] == pytest.approx([1, 2, 3])
    assert traces["fill rate"] == pytest.approx([4 / 32, 8 / 32, 16 / 32])
    assert traces["throughput ratio"] == pytest.approx([0.25, 0.5, 0.75])
    assert traces["queue"] == pytest.approx([1000 / 3600 / 1000] * 3)
    lines = sorted(shape.y0 for shape in fig.layout.shapes)
    assert lines == [0.5, 0.6, 0.75, 4.0]  # fill, ratio's two, the baseline's capacity


def test_the_command_writes_the_page_beside_the_json(tmp_path, capsys):
    path = audit_json(tmp_path)
    assert main(["report", str(path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "audit.html")
    text = (tmp_path / "audit.html").read_text()
    assert "tuner audit --prometheus: m" in text and "Batch fill rate" in text and "throughput ratio" in text


def test_without_a_baseline_there_is_no_ratio_panel_line(tmp_path):
    fig = page.production_figure(json.loads(audit_json(tmp_path, baseline=None).read_text()))
    assert "throughput ratio" not in {t.name for t in fig.data}
    assert sorted(shape.y0 for shape in fig.layout.shapes) == [0.5]


@pytest.mark.parametrize(
    "content, message",
    [("{not json", "not JSON (line 1"), ('{"model": "m"}', "not a production audit's JSON (`tuner audit "
                                                              "--prometheus --json`): no window, figures, steps, findings")],
)
def test_a_file_that_is_not_an_audit_is_one_line_exit_2(tmp_path, capsys, content, message):
    path = tmp_path / "x.json"
    path.write_text(content)
    code = main(["report", str(path)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err, out + err
    assert not (tmp_path / "x.html").exists()
