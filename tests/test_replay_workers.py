"""How many load-generator processes a replay uses: the rule (pure) and this host's calibration (real
load-generator processes against the calibration sink)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tuner.replay import calibrate, choose_workers, peak_rate, replay
from tuner.replay._calibrate import BUSY_FRACTION, available_cpus, per_process_rps
from tuner.server.local import LocalLauncher
from tuner.settings import ReplaySettings

MODELS = Path(__file__).resolve().parent / "data" / "replay_models"


def test_one_process_while_it_holds_the_peak():
    assert choose_workers(0, 100.0, per_process_rps=1000.0, cpus=8) == (
        1, "peak 100 req/s <= 1000 req/s that one process holds here")
    assert choose_workers(0, 1000.0, per_process_rps=1000.0, cpus=8)[0] == 1


def test_one_process_per_share_of_the_peak_at_most_one_per_core():
    assert choose_workers(0, 1001.0, per_process_rps=1000.0, cpus=8)[0] == 2
    assert choose_workers(0, 2500.0, per_process_rps=1000.0, cpus=8)[0] == 3
    n, reason = choose_workers(0, 5000.0, per_process_rps=1000.0, cpus=2)
    assert n == 2 and "needs 5 processes" in reason and "may limit this replay" in reason
    assert choose_workers(0, 5000.0, per_process_rps=1000.0, cpus=1)[0] == 1


def test_asked_for_is_asked_for():
    assert choose_workers(3, 10.0, per_process_rps=1000.0, cpus=1) == (3, "workers=3 was asked for")


def test_the_rate_one_process_holds_follows_its_cost_per_request():
    assert per_process_rps(100e-6) == pytest.approx(BUSY_FRACTION / 100e-6)
    assert per_process_rps(50e-6, busy_fraction=0.5) == pytest.approx(10000.0)


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_calibration_measures_this_host_once(protocol):
    start = time.monotonic()
    measured = calibrate(protocol, refresh=True)
    took = time.monotonic() - start
    assert measured.protocol == protocol
    assert 1.0 < measured.cpu_us_per_request < 20000.0
    assert measured.per_process_rps == pytest.approx(per_process_rps(measured.cpu_us_per_request / 1e6))
    assert measured.cpus == available_cpus() == len(os.sched_getaffinity(0))
    assert measured.seconds == pytest.approx(took, abs=0.5)
    assert measured.lag_p99_ms >= 0.0
    assert f"{measured.cpu_us_per_request:.0f} us CPU per request" in measured.describe()
    start = time.monotonic()
    assert calibrate(protocol) is measured and time.monotonic() - start < 0.01  # cached for the run


@pytest.mark.slow
def test_a_replay_left_to_choose_uses_the_calibration(triton_install):
    traffic = pd.DataFrame({"timestamp": np.arange(200) / 200.0, "seq_len": 8})
    with LocalLauncher(MODELS, models=["echo"], install=triton_install) as server:
        result = replay(server.endpoints, "echo", traffic, speed=1.0, settings=ReplaySettings(workers=0, warmup_s=0.2))
        asked = replay(server.endpoints, "echo", traffic, speed=1.0, settings=ReplaySettings(workers=2, warmup_s=0.2))
    measured = result.calibration
    assert measured is not None and measured is calibrate("http")
    assert (result.workers, result.reason) == choose_workers(
        0, peak_rate(result.records["due_s"].to_numpy()), per_process_rps=measured.per_process_rps,
        cpus=available_cpus())
    assert result.records["ok"].all()
    assert result.peak_rps == 200.0
    assert asked.workers == 2 and asked.calibration is measured  # kept for the run, not measured again
