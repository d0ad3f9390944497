"""The capacity search, against a fake replay (a pure function of the speed, like httpx's
MockTransport): the search logic is what is under test here; the real replay is exercised in
tests/test_tune_e2e.py."""

from __future__ import annotations

import dataclasses

import pytest
from support import BASE_RPS, measurement

from tuner.measurement import Measurement
from tuner.score import check_sla
from tuner.settings import CapacitySettings, SlaSettings
from tuner.trial.capacity import Hints, Step, find_capacity
from tuner.trial.step import with_retries


class FakeServer:
    """Meets a 100 ms p99 up to `capacity_speed`; latency grows past it. Records every call."""

    def __init__(self, capacity_speed: float, lag_limit_speed: float = 1e9, lag_fixed_by_attempt: int = 99):
        self.capacity_speed = capacity_speed
        self.lag_limit_speed = lag_limit_speed
        self.lag_fixed_by_attempt = lag_fixed_by_attempt
        self.calls: list[tuple[float, int]] = []

    def __call__(self, speed: float, attempt: int) -> Measurement:
        self.calls.append((speed, attempt))
        p99 = 20.0 if speed <= self.capacity_speed else 100.0 + 400.0 * (speed - self.capacity_speed)
        valid = speed <= self.lag_limit_speed or attempt >= self.lag_fixed_by_attempt
        return measurement(speed, p99=p99, valid=valid)


SLA = SlaSettings(latency_ms=100.0, percentile=99.0, max_error_rate=0.01)


@pytest.mark.parametrize("capacity", [0.37, 1.0, 3.3, 17.0])
@pytest.mark.parametrize("start", [0.25, 1.0, 8.0])
def test_capacity_is_found_within_the_tolerance_from_any_start(capacity, start):
    fake = FakeServer(capacity)
    settings = CapacitySettings(tolerance=0.05, start_speed=1.0, max_speed=1000.0, max_steps=20)
    result = find_capacity(with_retries(fake), SLA, settings, start_speed=start)
    assert result.converged and not result.pruned
    assert result.speed <= capacity < result.upper_speed
    assert result.upper_speed / result.speed <= 1.05
    assert result.capacity_rps == pytest.approx(BASE_RPS * result.speed)
    assert result.at_capacity is not None and result.at_capacity.speed == result.speed
    assert len(fake.calls) <= 12


def test_a_good_start_guess_saves_steps():
    settings = CapacitySettings(tolerance=0.1, max_steps=20)
    far, near = FakeServer(10.0), FakeServer(10.0)
    find_capacity(with_retries(far), SLA, settings, start_speed=0.1)
    find_capacity(with_retries(near), SLA, settings, start_speed=9.5)
    assert len(near.calls) < len(far.calls)


def test_stops_at_max_speed_and_when_even_the_lowest_speed_fails():
    settings = CapacitySettings(tolerance=0.1, max_speed=4.0, max_steps=20)
    top = find_capacity(with_retries(FakeServer(100.0)), SLA, settings, start_speed=1.0)
    assert top.limited_by == "max_speed" and top.speed == 4.0 and top.upper_speed is None
    bottom = find_capacity(with_retries(FakeServer(0.001)), SLA, settings, start_speed=1.0, min_speed=0.1)
    assert bottom.limited_by == "min_speed" and bottom.speed == 0.0 and bottom.capacity_rps == 0.0
    assert bottom.at_capacity is None


def test_step_budget_is_respected():
    fake = FakeServer(3.0)
    result = find_capacity(with_retries(fake), SLA, CapacitySettings(tolerance=0.001, max_steps=5), start_speed=1.0)
    assert len(fake.calls) == 5 and result.limited_by == "max_steps" and not result.converged
    assert result.speed <= 3.0 < result.upper_speed


def test_prunes_once_the_bracket_cannot_beat_the_best_so_far():
    fake = FakeServer(2.0)
    settings = CapacitySettings(tolerance=0.1, max_steps=20)
    result = find_capacity(with_retries(fake), SLA, settings, start_speed=1.0, beat_rps=BASE_RPS * 3.0)
    # 1.0 passes, 2.0 passes, 4.0 fails at 200 rps > 150: keep going; 2.83 fails at 141 rps, within
    # the tolerance of 150: keep going, a tolerance under it (not the bracket's middle, 2.38); 2.57 fails
    # at 129 rps, measurably below 150: stop
    assert result.pruned and not result.converged
    assert result.upper_rps * (1 + settings.tolerance) <= BASE_RPS * 3.0
    assert [speed for speed, _ in fake.calls] == pytest.approx([1.0, 2.0, 4.0, 2.8284, 2.5713], rel=1e-3)


@pytest.mark.parametrize(("capacity", "pruned"), [(0.75, False), (0.65, False), (0.6, True), (0.3, True)])
def test_a_failure_at_the_best_capacity_is_settled_by_one_more_step(capacity, pruned):
    """The LLM quick start's contenders: the load passes at 0.25, the best held 0.8 and the contender fails
    there. A step a tolerance under 0.8 settles it (a pass: converged, within the tolerance of the best; a
    failure: measurably worse), where bisecting [0.25, 0.8] took three steps to the same verdict."""
    load = Step(0.25, measurement(0.25), check_sla(measurement(0.25), SLA))
    settings = CapacitySettings(tolerance=0.25, max_steps=5)
    fake = FakeServer(capacity)
    result = find_capacity(with_retries(fake), SLA, settings, start_speed=0.8, beat_rps=BASE_RPS * 0.8, lower=load,
                           growth=1.3)
    assert [speed for speed, _ in fake.calls] == pytest.approx([0.8, 0.64], rel=1e-6)
    assert result.pruned is pruned and result.converged is not pruned
    assert result.speed == (0.25 if pruned else pytest.approx(0.64))
    # without a best to beat, the same contender is bisected from its lower bound
    blind = FakeServer(capacity)
    find_capacity(with_retries(blind), SLA, settings, start_speed=0.8, lower=load, growth=1.3)
    assert len(blind.calls) > 2


def test_a_failure_within_the_tolerance_of_the_best_is_not_pruned():
    # as good as the best, but the replay at the best's speed fails on a bad draw: measure it fully
    fake = FakeServer(2.9)
    settings = CapacitySettings(tolerance=0.05, max_steps=20)
    result = find_capacity(with_retries(fake), SLA, settings, start_speed=3.0, beat_rps=BASE_RPS * 3.0, growth=1.3)
    assert not result.pruned and result.converged
    assert result.speed <= 2.9 < result.upper_speed
    assert result.capacity_rps * (1 + settings.tolerance) > BASE_RPS * 3.0 * 0.9


def test_invalid_replay_is_rerun_with_the_next_attempt_and_never_counted_against_the_server():
    fake = FakeServer(capacity_speed=5.0, lag_limit_speed=3.0, lag_fixed_by_attempt=1)
    result = find_capacity(with_retries(fake), SLA, CapacitySettings(tolerance=0.1, max_steps=20), start_speed=2.0)
    assert result.converged and result.speed <= 5.0 < result.upper_speed
    assert (4.0, 0) in fake.calls and (4.0, 1) in fake.calls  # re-run with more load generators
    assert all(step.valid for step in result.steps)
    assert max(step.attempts for step in result.steps) == 2


def test_a_load_generator_that_cannot_keep_up_is_reported_not_scored():
    fake = FakeServer(capacity_speed=50.0, lag_limit_speed=3.0)
    result = find_capacity(with_retries(fake, tries=3), SLA, CapacitySettings(tolerance=0.1, max_steps=20),
                           start_speed=1.0)
    assert result.limited_by == "load_generator"
    assert result.speed == 2.0 and result.upper_speed is None  # the invalid step is no upper bound
    assert [c for c in fake.calls if c[0] == 4.0] == [(4.0, 0), (4.0, 1), (4.0, 2)]


def test_a_window_with_no_request_due_is_not_run_again():
    """Invalid because its measured part is empty (the schedule's doing, not the machine's): a re-run with
    more load generators would measure nothing again."""
    calls = []

    def empty(speed: float, attempt: int) -> Measurement:
        calls.append(attempt)
        return dataclasses.replace(measurement(speed, valid=False), requests=0,
                                   invalid_reason="no requests due in the measured window")

    m = with_retries(empty, tries=3)(1.0)
    assert calls == [0] and m.attempts == 1 and not m.valid


def test_capacity_in_profile_rate_terms_is_monotone_in_speed():
    fake = FakeServer(3.0)
    result = find_capacity(with_retries(fake), SLA, CapacitySettings(tolerance=0.05, max_steps=20), start_speed=1.0, rate=7.0)
    assert result.capacity_rps == pytest.approx(7.0 * result.speed)
    assert result.upper_rps == pytest.approx(7.0 * result.upper_speed)


def test_a_known_passing_step_is_a_lower_bound_even_when_the_load_generator_gives_up():
    load = Step(0.5, measurement(0.5), check_sla(measurement(0.5), SLA))
    fake = FakeServer(capacity_speed=5.0, lag_limit_speed=0.9)
    result = find_capacity(with_retries(fake), SLA, CapacitySettings(tolerance=0.1, max_steps=20), start_speed=1.0,
                           lower=load, rate=10.0)
    assert result.limited_by == "load_generator" and result.speed == 0.5 and result.capacity_rps == 5.0
    assert result.at_capacity is load.measurement
    near = FakeServer(capacity_speed=0.8)
    result = find_capacity(with_retries(near), SLA, CapacitySettings(tolerance=0.1, max_steps=20), start_speed=1.0,
                           lower=load, min_speed=0.5)
    assert result.converged and 0.5 <= result.speed <= 0.8 < result.upper_speed
    assert all(call[0] > 0.5 for call in near.calls)  # the load's speed is not measured again


def test_a_start_at_or_below_the_known_lower_bound_moves_above_it():
    load = Step(0.5, measurement(0.5), check_sla(measurement(0.5), SLA))
    fake = FakeServer(capacity_speed=2.0)
    find_capacity(with_retries(fake), SLA, CapacitySettings(tolerance=0.1, max_steps=20), start_speed=0.5, lower=load,
                  growth=1.3)
    assert fake.calls[0][0] == pytest.approx(0.65)


def test_a_bracket_that_still_holds_is_confirmed_in_two_steps_at_its_edges():
    """The re-measurement's A/B at the edges: start at the earlier lower edge, then its upper edge."""
    settings = CapacitySettings(tolerance=0.1, max_steps=20)
    fake = FakeServer(10.0)
    result = find_capacity(with_retries(fake), SLA, settings, start_speed=9.6, upper_guess=10.4, growth=1.3)
    assert [speed for speed, _ in fake.calls] == [9.6, 10.4]
    assert result.converged and (result.speed, result.upper_speed) == (9.6, 10.4)
    # without the edge it bisects from 1.3x above
    blind = FakeServer(10.0)
    find_capacity(with_retries(blind), SLA, settings, start_speed=9.6, growth=1.3)
    assert len(blind.calls) > 2


@pytest.mark.parametrize("capacity", [7.0, 9.9, 12.5, 30.0])
def test_a_bracket_that_moved_is_searched_as_usual_from_its_edges(capacity):
    settings = CapacitySettings(tolerance=0.05, max_steps=20)
    fake = FakeServer(capacity)
    result = find_capacity(with_retries(fake), SLA, settings, start_speed=9.6, upper_guess=10.4, growth=1.3)
    assert result.converged and result.speed <= capacity < result.upper_speed
    assert result.upper_speed / result.speed <= 1.05
    assert [speed for speed, _ in fake.calls].count(10.4) <= 1


@pytest.mark.parametrize("tolerance", [0.05, 0.15, 0.3])
@pytest.mark.parametrize("off", [0.93, 1.0, 1.06])
def test_an_estimate_within_half_the_tolerance_is_confirmed_in_two_steps(tolerance, off):
    """The simulation's capacity as a start (`Hints.around`): pass at the lower edge, fail at the upper,
    converged at the tolerance however the floats round."""
    estimate = 10.0
    fake = FakeServer(estimate * off)
    hints = Hints.around(estimate, tolerance, beat_rps=3.0)
    assert hints.beat_rps == 3.0
    assert hints.start_speed < estimate < hints.upper_speed
    assert hints.upper_speed / hints.start_speed <= 1.0 + tolerance
    result = find_capacity(with_retries(fake), SLA, CapacitySettings(tolerance=tolerance, max_steps=20),
                           start_speed=hints.start_speed, upper_guess=hints.upper_speed, growth=1.3)
    if hints.start_speed <= estimate * off < hints.upper_speed:
        assert [speed for speed, _ in fake.calls] == [hints.start_speed, hints.upper_speed]
    assert result.converged and result.speed <= estimate * off < result.upper_speed


@pytest.mark.parametrize("off", [0.25, 0.7, 1.4, 4.0])
def test_a_wrong_estimate_is_searched_from_there(off):
    estimate = 10.0
    fake = FakeServer(estimate * off)
    hints = Hints.around(estimate, 0.15)
    result = find_capacity(with_retries(fake), SLA, CapacitySettings(tolerance=0.15, max_steps=20),
                           start_speed=hints.start_speed, upper_guess=hints.upper_speed, growth=1.3)
    assert result.converged and result.speed <= estimate * off < result.upper_speed
    assert len(fake.calls) > 2


def _telling(capacity: float, *, reads: float = 1.0):
    """A check that, where the SLA breaks, says where the capacity lies (SlaCheck.holds_speed, as a
    generative engine's token rate does), off by the factor `reads`."""
    def check(m: Measurement, sla: SlaSettings):
        c = check_sla(m, sla)
        return c if c.ok else dataclasses.replace(c, holds_speed=capacity * reads)
    return check


@pytest.mark.parametrize("tolerance", [0.1, 0.25])
@pytest.mark.parametrize("reads", [0.85, 0.9, 1.0, 1.1])
def test_a_failing_step_that_says_where_the_capacity_lies_saves_bisection_steps(tolerance, reads):
    """Told where the capacity lies by each failing step (off by the factor `reads`, as a generative
    engine's streamed rate is), the search finds what the plain bisection finds, within the tolerance,
    for 40 capacities from 0.6 to 8.4, never in more steps, and in fewer over all of them."""
    settings = CapacitySettings(tolerance=tolerance, start_speed=0.5, max_speed=16.0, max_steps=14)
    told_steps = plain_steps = 0
    for capacity in [0.6 * 1.07 ** k for k in range(40)]:
        plain, told = FakeServer(capacity), FakeServer(capacity)
        blind = find_capacity(with_retries(plain), SLA, settings)
        guided = find_capacity(with_retries(told), SLA, settings, check=_telling(capacity, reads=reads))
        for result in (blind, guided):
            assert result.converged and result.speed <= capacity < result.upper_speed
            assert result.upper_speed / result.speed <= 1 + tolerance
        assert len(told.calls) <= len(plain.calls), (capacity, told.calls, plain.calls)
        told_steps, plain_steps = told_steps + len(told.calls), plain_steps + len(plain.calls)
    assert told_steps < plain_steps


def test_told_the_capacity_just_under_the_failing_step_one_pass_closes_the_bracket():
    """0.5 passes, 1.0 fails saying 0.95: 0.8 (1.0 / 1.25) is probed and passes: [0.8, 1.0] in 3
    steps where the bisection takes 4 (0.71, then 0.84). Told 0.55, it probes 0.55 (a pass), then
    0.6875 (a fail): [0.55, 0.6875]."""
    settings = CapacitySettings(tolerance=0.25, start_speed=0.5, max_speed=16.0, max_steps=12)
    high, low = FakeServer(0.95), FakeServer(0.6)
    assert find_capacity(with_retries(high), SLA, settings, check=_telling(0.95)).converged
    assert [speed for speed, _ in high.calls] == pytest.approx([0.5, 1.0, 0.8])
    plain = FakeServer(0.95)
    find_capacity(with_retries(plain), SLA, settings)
    assert [speed for speed, _ in plain.calls] == pytest.approx([0.5, 1.0, 0.5 ** 0.5, (0.5 ** 0.5) ** 0.5])
    result = find_capacity(with_retries(low), SLA, settings, check=_telling(0.6, reads=0.55 / 0.6))
    assert [speed for speed, _ in low.calls] == pytest.approx([0.5, 1.0, 0.55, 0.6875])
    assert result.converged and (result.speed, result.upper_speed) == pytest.approx((0.55, 0.6875))
