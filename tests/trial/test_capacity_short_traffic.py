"""The capacity search at a speed the traffic is too short for: a step whose measured window holds no
request says nothing of the server nor of the load generator (`limited_by="traffic"`), the one rule the
real search and the simulation (tests/test_simulate.py) share."""

from __future__ import annotations

import dataclasses

from support import measurement

from tuner.measurement import Measurement
from tuner.settings import CapacitySettings, SlaSettings
from tuner.trial.capacity import find_capacity
from tuner.trial.step import with_retries

SLA = SlaSettings(latency_ms=100.0, percentile=99.0, max_error_rate=0.01)


def test_a_step_with_no_request_to_measure_is_the_traffics_limit_not_the_load_generators():
    """A 60 s trace, a 1 s warm-up: from speed 60 up nothing is due after the warm-up. The search had
    called that `load_generator` (the report's "*: raise replay.workers"), which no worker fixes."""
    calls = []

    def replay(speed: float, attempt: int) -> Measurement:
        calls.append((speed, attempt))
        if speed >= 60.0:  # the window holds nothing after its warm-up: nothing to measure, nothing late
            return dataclasses.replace(measurement(speed, valid=False), requests=0,
                                       invalid_reason="no requests due in the measured window")
        return measurement(speed, p99=20.0)

    found = find_capacity(with_retries(replay), SLA, CapacitySettings(tolerance=0.15, max_steps=6, max_speed=200),
                          start_speed=8.0, rate=20.0)
    assert found.limited_by == "traffic", found.limited_by
    assert found.speed == 32.0 and found.capacity_rps == 640.0 and found.upper_speed is None  # no upper bound
    assert calls[-1] == (64.0, 0)  # not re-run with more load generators: the schedule's doing


def test_a_late_sender_is_still_the_load_generators_limit():
    def replay(speed: float, attempt: int) -> Measurement:
        return measurement(speed, p99=20.0, valid=speed < 16.0)  # requests due, but sent late

    found = find_capacity(with_retries(replay), SLA, CapacitySettings(tolerance=0.15, max_steps=6), start_speed=8.0)
    assert found.limited_by == "load_generator" and found.speed == 8.0
