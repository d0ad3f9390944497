"""tuner.soak.analysis.analyze on windows placed as the soak places them (`SoakPlan.place`, what
`_run` writes to windows.csv): the observed SLA break's time, the batch limits of a soak with a restart,
and one numbering of windows in what a person reads."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from tuner.soak._run import _ENCODER_LINE, _line
from tuner.soak.analysis import SoakPlan, analyze

SLA = {"latency_ms": 200, "percentile": 99, "max_error_rate": 0.001}
# `tuner soak --hours 1 --speed 30 --window 0.25 --restart-at 0.5`: 8 windows of 0.125 h of traffic,
# the server restarted before the fifth; each window measured after 3.75 s of wall time (a quarter)
PLAN = SoakPlan(hours=1.0, speed=30.0, window_wall_s=15.0, cycle_s=600.0, restart_at_hours=0.5)
WARMUP_S = 3.75
META = {"sla": SLA, "window_hours": PLAN.window_s / 3600, "capacity": None}


def soak_windows(*, error_rate=lambda k: 0.0) -> pd.DataFrame:
    """The plan's windows as windows.csv holds them, flat figures (`error_rate` by window index)."""
    rng = np.random.default_rng(0)
    rows = []
    for k in range(PLAN.windows):
        errors = error_rate(k)
        rows.append({**PLAN.place(k, warmup_wall_s=WARMUP_S), "requests": 1000, "valid": True,
                     "sla_ok": errors <= SLA["max_error_rate"], "offered_rps": 100 + 10 * np.sin(k),
                     "error_rate": errors, "latency_p99_ms": 50 + rng.normal(0, 1),
                     "compute_ms_per_request": 5 + rng.normal(0, 0.02)})
    return pd.DataFrame(rows)


def test_the_place_of_each_window_is_the_soaks():
    w = soak_windows()
    assert w["segment"].tolist() == [0] * 4 + [1] * 4 and w["restarted"].tolist() == [False] * 4 + [True] + [False] * 3
    assert w["start_hours"].tolist() == pytest.approx([k * 0.125 for k in range(8)])
    # the midpoint of the measured part: after the 3.75 s (112.5 s of traffic) warm-up
    assert w.loc[0, "age_hours"] == pytest.approx((112.5 + 450) / 2 / 3600)
    assert w.loc[4, "age_hours"] == pytest.approx(w.loc[0, "age_hours"]) and w.loc[4, "t_hours"] > 0.5


def test_an_sla_broken_from_the_first_window_is_already_broken_at_0_h():
    findings = analyze(soak_windows(error_rate=lambda k: 0.01), pd.DataFrame(), META)
    seen = findings.observed
    assert seen.figure == "error_rate" and seen.hours == 0.0 and seen.already
    assert findings.restart.action == "restart does not help"
    assert "from the server's start" in findings.restart.reason and "after a start" not in findings.restart.reason
    assert "from 0 h on" in findings.text()
    assert json.loads(json.dumps(findings.as_dict()))["observed_breach"]["hours"] == 0.0


def test_a_break_after_the_restart_is_timed_from_the_restart_at_its_windows_start():
    # broken from the sixth window (0.625-0.75 h of traffic): 0.125 h after the restart at 0.5 h
    seen = analyze(soak_windows(error_rate=lambda k: 0.01 if k >= 5 else 0.0), pd.DataFrame(), META).observed
    assert seen.hours == pytest.approx(0.125) and not seen.already
    # the same before the restart: the third window starts at 0.25 h
    seen = analyze(soak_windows(error_rate=lambda k: 0.01 if 2 <= k <= 3 else 0.0), pd.DataFrame(), META).observed
    assert seen.hours == pytest.approx(0.25)


def executions(rows: dict[int, dict[int, tuple[int, int]]]) -> pd.DataFrame:
    """executions.csv from {window: {size: (successes, failures)}}, with batches of 1 to 8 in every window."""
    out = []
    for k in range(PLAN.windows):
        for size, (ok, bad) in {**{s: (50, 0) for s in range(1, 9)}, **rows.get(k, {})}.items():
            out.append({"window": k, "size": size, "successes": ok, "failures": bad, "compute_ms": 1.0})
    return pd.DataFrame(out)


def test_the_batch_limits_read_every_window_and_agree_with_the_windows_lines():
    # before the restart the largest batch formed is 31 (the third window); after it, 32 once (the last)
    found = analyze(soak_windows(), executions({2: {31: (1, 0)}, 3: {20: (3, 0)}, 7: {32: (1, 0)}}), META)
    batches = found.analysis.batches
    assert batches.largest_recent == 31 and batches.largest_ever == 32  # 32 succeeded in a window: "ever"
    assert found.as_dict()["batches"]["largest_ever"] == 32
    name, table = next((n, t) for n, t in found.tables().items() if n.startswith("batches"))
    assert "as of window(s) 3, 4," in name  # the two before the restart, numbered as the soak's lines are
    rows = table.set_index("size")
    assert rows.loc[31, "last success window"] == 3 and rows.loc[31, "status"] == "succeeds"
    assert rows.loc[32, "last success window"] == 8 and rows.loc[32, "successes"] == 1
    assert rows.loc[32, "status"] == "succeeded, not in the windows read (after them)"
    # the line the soak printed for that window says 8/8 with 32 its largest batch that succeeded
    line = _line({**soak_windows().iloc[7].to_dict(), "largest_ok_batch": 32.0}, PLAN.windows, _ENCODER_LINE,
                 percentile=99)
    assert line.split()[0] == "8/8" and " 32 " in line


def test_a_size_that_failed_before_the_restart_and_succeeded_after_it_says_both():
    found = analyze(soak_windows(), executions({1: {16: (2, 0)}, 2: {16: (0, 1)}, 3: {16: (0, 2)}, 6: {16: (4, 0)}}), META)
    batches = found.analysis.batches
    assert batches.largest_recent == 8 and batches.smallest_failing == 16 and batches.largest_ever == 16
    row = found.tables()[next(n for n in found.tables() if n.startswith("batches"))].set_index("size").loc[16]
    assert row["first failure window"] == 3 and row["last success window"] == 7
    assert row["status"] == "failed, then succeeded after the windows read"
    assert batches.as_dict()["first_failures"] == {"16": 2}  # findings.json keeps windows.csv's keys


def test_the_observed_break_names_its_window_as_the_soaks_lines_do():
    seen = analyze(soak_windows(error_rate=lambda k: 0.01), pd.DataFrame(), META).observed
    assert "the SLA broke in window 1 " in seen.note


def test_a_size_that_never_failed_reads_a_dash_in_the_terminal_and_the_report():
    """The batch table's window a size has none of (31 never failed) reads '-', never NaN nor blank."""
    from pathlib import Path

    from tuner.report._soak import SoakView, render_soak

    found = analyze(soak_windows(), executions({2: {31: (1, 0)}, 5: {40: (0, 2)}}), META)
    name = next(n for n in found.tables() if n.startswith("batches"))
    text = found.text()
    table = text[text.index(name):].split("\n\n")[0]
    row = next(line.split() for line in table.splitlines() if line.split()[0] == "31")
    assert row[:5] == ["31", "1", "0", "3", "-"] and "NaN" not in table, table
    page = render_soak(SoakView(Path("."), {**META, "plan": {}}, soak_windows(), pd.DataFrame(), found))
    html = page[page.index("<th>first failure window</th>"):]
    html = html[:html.index("</table>")]
    assert "<td>31</td>\n      <td>1</td>\n      <td>0</td>\n      <td>3</td>\n      <td>-</td>" in html, html
