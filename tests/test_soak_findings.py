"""tuner.soak.analysis.analyze on windows placed as the soak places them (`SoakPlan.place`, what
`_run` writes to windows.csv): the observed SLA break's time, the batch limits of a soak with a restart,
and one numbering of windows in what a person reads."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

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
