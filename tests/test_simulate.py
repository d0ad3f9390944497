"""The dynamic-batcher simulation against hand-computed cases, the profile, and `tuner simulate`.

Pure and fast: no server. The profile used by most cases costs a device execution 1 ms + 1 ms per
100 padded tokens (points at 100..800 tokens; flat below the first point), so a batch's time is
easy to work out by hand.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tuner.cli import main
from tuner.errors import OutputError, ProfileError, SettingsError, TrafficError
from tuner.score import check_sla
from tuner.settings import CapacitySettings, SlaSettings
from tuner.simulate import (
    OK,
    OUT_OF_MEMORY,
    QUEUE_FULL,
    TIMEOUT,
    TOO_LARGE,
    BatcherConfig,
    Profile,
    ProfilePoint,
    Requests,
    Simulator,
    batcher_config,
    length_column,
    measurement,
    read_profile,
    simulate,
    write_profile,
)
from tuner.trial import find_capacity

MS = 1e-3


def linear_profile(**settings) -> Profile:
    """Device time 1 ms + tokens / 100 ms, measured at 1, 2, 4, 8 rows x 100 tokens."""
    return Profile.from_function(lambda r, n: 1.0 + r * n / 100.0, rows=[1, 2, 4, 8], lengths=[100],
                                 **settings)


def reqs(due_ms, rows=None, lengths=None) -> Requests:
    n = len(due_ms)
    return Requests(due_s=np.asarray(due_ms, dtype=float) * MS,
                    rows=np.asarray(rows if rows is not None else [1] * n, dtype=np.int64),
                    length=np.asarray(lengths if lengths is not None else [100] * n, dtype=np.int64))


def latencies_ms(run, requests) -> list[float]:
    return [round(x, 6) for x in (run.done_s - requests.due_s) / MS]


# --- the batcher's rules, by hand -----------------------------------------------------------------


def test_one_request_alone_pays_host_device_and_overhead():
    profile = linear_profile(host_ms_per_row=0.2, overhead_ms=0.5)
    r = reqs([500.0])
    run = simulate(r, BatcherConfig(max_batch_size=8), profile)
    # 0.1 ms host before + 2 ms device (100 tokens) + 0.1 ms host after + 0.5 ms overhead
    assert latencies_ms(run, r) == [2.7]
    assert run.exec_rows.tolist() == [1] and run.exec_device_s.tolist() == pytest.approx([2 * MS])
    assert run.status.tolist() == [OK]


def test_a_burst_larger_than_max_batch_size_splits_into_full_batches_in_arrival_order():
    r = reqs([0.0] * 10)
    run = simulate(r, BatcherConfig(max_batch_size=4), linear_profile())
    assert run.exec_rows.tolist() == [4, 4, 2]
    # 4 rows x 100 tokens = 5 ms, again 5 ms, then 2 rows = 3 ms; first in, first served
    assert latencies_ms(run, r) == [5.0] * 4 + [10.0] * 4 + [13.0] * 2
    assert run.dispatch_s.tolist() == pytest.approx([0.0] * 4 + [5 * MS] * 4 + [10 * MS] * 2)


def test_a_request_that_does_not_fit_the_remaining_room_closes_the_batch_without_it():
    r = reqs([0.0, 0.0, 0.0], rows=[3, 2, 1])
    run = simulate(r, BatcherConfig(max_batch_size=4), linear_profile())
    # 3 + 2 > 4: the 2-row request is not split and not skipped (the 1-row one does not jump ahead)
    assert run.exec_rows.tolist() == [3, 3]
    assert run.exec_requests.tolist() == [1, 2]


def test_a_lone_request_waits_exactly_the_delay_then_runs():
    r = reqs([10.0])
    run = simulate(r, BatcherConfig(max_batch_size=8, max_queue_delay_microseconds=3000), linear_profile())
    assert run.dispatch_s.tolist() == pytest.approx([13 * MS])
    assert latencies_ms(run, r) == [5.0]  # 3 ms delay + 2 ms execution


def test_requests_arriving_within_the_delay_join_the_batch_dispatched_when_the_oldest_expires():
    r = reqs([0.0, 1.0, 2.5, 4.0])
    run = simulate(r, BatcherConfig(max_batch_size=8, max_queue_delay_microseconds=3000), linear_profile())
    # the first three go at 3 ms (oldest + delay) as 3 rows = 4 ms; the fourth waits its own 3 ms
    # from 4 ms, by when the instance is free again (7 ms): it goes at 7 ms
    assert run.exec_rows.tolist() == [3, 1]
    assert run.dispatch_s.tolist() == pytest.approx([3 * MS, 3 * MS, 3 * MS, 7 * MS])


def test_reaching_max_batch_size_dispatches_before_the_delay():
    r = reqs([0.0, 1.0, 2.0, 3.0])
    run = simulate(r, BatcherConfig(max_batch_size=4, max_queue_delay_microseconds=10_000), linear_profile())
    assert run.exec_rows.tolist() == [4]
    assert run.dispatch_s.tolist() == pytest.approx([3 * MS] * 4)  # not 10 ms: the batch is full


def test_a_preferred_size_reached_dispatches_before_the_delay():
    config = BatcherConfig(max_batch_size=8, max_queue_delay_microseconds=10_000, preferred_batch_size=(2, 4))
    r = reqs([0.0, 1.0, 20.0])
    run = simulate(r, config, linear_profile())
    assert run.exec_rows.tolist() == [2, 1]
    assert run.dispatch_s.tolist() == pytest.approx([1 * MS, 1 * MS, 30 * MS])  # the lone one waits 10 ms


def test_the_largest_preferred_size_goes_first_and_the_rest_waits_for_its_delay():
    config = BatcherConfig(max_batch_size=8, max_queue_delay_microseconds=10_000, preferred_batch_size=(2, 4))
    r = reqs([0.0, 0.5, 0.7, 0.9, 1.1, 1.3, 1.5])
    run = simulate(r, config, linear_profile())
    # 0 and 1 make a preferred 2 at 0.5 ms (3 ms, until 3.5 ms); the next five queue meanwhile: at
    # 3.5 ms the largest preferred prefix (4) goes, and the last one, alone and not a preferred
    # size, waits until its own delay expires (1.5 + 10 ms), although the instance is free at 8.5 ms
    assert run.exec_rows.tolist() == [2, 4, 1]
    assert run.dispatch_s.tolist() == pytest.approx([0.5 * MS] * 2 + [3.5 * MS] * 4 + [11.5 * MS])
    # with 1 a preferred size too, nothing waits: every prefix is preferred. The batch queued behind
    # the busy instance grows (1, 2, then 4 at 1.1 ms); at 1.5 ms the two queued past the largest
    # preferred size mark the cursor at one request (`best_preferred_batch_size = pending_batch_size_`
    # in GetDynamicBatch): the queued batch takes one more (5 rows) and closes; the last goes alone
    ones = BatcherConfig(max_batch_size=8, max_queue_delay_microseconds=10_000, preferred_batch_size=(1, 2, 4))
    run = simulate(r, ones, linear_profile())
    assert run.exec_rows.tolist() == [1, 5, 1]
    assert run.dispatch_s.tolist() == pytest.approx([0.0] + [2 * MS] * 5 + [8 * MS])


def test_with_equal_shapes_a_request_of_another_length_closes_the_batch():
    r = reqs([0.0, 0.0, 0.0, 0.0, 0.0], lengths=[100, 100, 50, 100, 100])
    padded = simulate(r, BatcherConfig(max_batch_size=8), linear_profile())
    assert padded.exec_requests.tolist() == [5] and padded.exec_length.tolist() == [100]
    equal = simulate(r, BatcherConfig(max_batch_size=8, equal_shapes=True), linear_profile())
    # the 50 closes the first batch and goes alone; the two 100s after it form the third, in order
    assert equal.exec_requests.tolist() == [2, 1, 2] and equal.exec_length.tolist() == [100, 50, 100]


def test_with_equal_shapes_a_length_change_sends_the_batch_before_the_delay():
    r = reqs([0.0, 1.0, 2.0], lengths=[100, 100, 50])
    config = BatcherConfig(max_batch_size=8, max_queue_delay_microseconds=10_000, equal_shapes=True)
    run = simulate(r, config, linear_profile())
    assert run.exec_requests.tolist() == [2, 1]
    # the two 100s go when the 50 arrives (2 ms), as Triton's send_now; the 50 waits its own delay
    assert run.dispatch_s.tolist() == pytest.approx([2 * MS, 2 * MS, 12 * MS])


def test_the_study_space_batches_equal_shapes_for_a_model_without_ragged_batching(study):
    from tuner import modelconfig
    from tuner.settings import read_study
    from tuner.simulate import study_space

    settings = read_study(study / "study.yaml")
    ragged = modelconfig.parse('max_batch_size: 8 input [ { name: "A" data_type: TYPE_INT32 dims: [ -1 ] '
                               'allow_ragged_batch: true } ] dynamic_batching { }')
    equal = modelconfig.parse('max_batch_size: 8 input [ { name: "A" data_type: TYPE_INT32 dims: [ -1 ] } ] '
                              'dynamic_batching { }')
    for base, expected in ((ragged, False), (equal, True)):
        configs, defaults = study_space(settings, base)
        assert batcher_config(configs[0], **defaults).equal_shapes is expected


def test_with_delay_zero_a_free_instance_takes_what_is_queued():
    r = reqs([0.0, 0.5, 1.0, 1.5, 2.5])
    run = simulate(r, BatcherConfig(max_batch_size=8), linear_profile())
    # request 0 runs alone (2 ms); 1-3 queued meanwhile go together at 2 ms (4 ms); 4 goes at 6 ms
    assert run.exec_rows.tolist() == [1, 3, 1]
    assert run.dispatch_s.tolist() == pytest.approx([0.0, 2 * MS, 2 * MS, 2 * MS, 6 * MS])


def test_two_instances_serialise_on_one_device_and_overlap_their_host_work():
    r = reqs([0.0, 0.0])
    one_device = linear_profile(host_ms_per_row=2.0)  # 1 ms host before, 1 ms after the device
    run = simulate(r, BatcherConfig(max_batch_size=1, instance_count=2), one_device)
    # A: host 0-1, device 1-3, host 3-4; B: host 0-1, waits for the device until 3, 3-5, host 5-6
    assert latencies_ms(run, r) == [4.0, 6.0]
    single = simulate(r, BatcherConfig(max_batch_size=1, instance_count=1), one_device)
    assert latencies_ms(single, r) == [4.0, 8.0]  # one instance: nothing overlaps
    two_devices = linear_profile(host_ms_per_row=2.0, concurrent_executions=2)
    both = simulate(r, BatcherConfig(max_batch_size=1, instance_count=2), two_devices)
    assert latencies_ms(both, r) == [4.0, 4.0]  # the profile lets executions run together
    # a quarter of the device time overlapping (work inside the execute the device does not hold): B
    # takes the device once A's exclusive 1.5 ms are done, at 2.5 ms, and ends 0.5 ms earlier
    overlapping = linear_profile(host_ms_per_row=2.0, device_overlap=0.25)
    run = simulate(r, BatcherConfig(max_batch_size=1, instance_count=2), overlapping)
    assert latencies_ms(run, r) == pytest.approx([4.0, 5.5])
    alone = simulate(r, BatcherConfig(max_batch_size=1, instance_count=1), overlapping)
    assert latencies_ms(alone, r) == [4.0, 8.0]  # one instance: the instance is held all the same
    per_execution = linear_profile(host_ms_per_execution=2.0)  # the same host time, per execution
    run = simulate(reqs([0.0, 0.0, 0.0]), BatcherConfig(max_batch_size=2), per_execution)
    # 2 rows: 1 + 3 + 1 = 5 ms; then 1 row from 5 ms: 1 + 2 + 1 = 4 ms
    assert latencies_ms(run, reqs([0.0, 0.0, 0.0])) == [5.0, 5.0, 9.0]


def test_the_instance_free_first_takes_the_next_batch():
    r = reqs([0.0, 0.0, 0.5])
    run = simulate(r, BatcherConfig(max_batch_size=1, instance_count=2), linear_profile(concurrent_executions=2))
    # both instances busy until 2 ms; request 2 runs at 2 ms on whichever frees first
    assert run.dispatch_s.tolist() == pytest.approx([0.0, 0.0, 2 * MS])


def test_a_batch_pays_for_its_longest_request():
    r = reqs([0.0, 0.0], lengths=[100, 300])
    run = simulate(r, BatcherConfig(max_batch_size=2), linear_profile())
    # 2 rows padded to 300 tokens = 600 tokens: 7 ms (not 1 + 4 = 5 ms for 400 real tokens)
    assert run.exec_length.tolist() == [300]
    assert latencies_ms(run, r) == [7.0, 7.0]


def test_the_model_truncation_caps_length_padding_and_cost():
    profile = linear_profile(max_length=200)
    r = reqs([0.0, 0.0], lengths=[100, 5000])
    run = simulate(r, BatcherConfig(max_batch_size=2), profile)
    assert run.exec_length.tolist() == [200]
    assert latencies_ms(run, r) == [5.0, 5.0]  # 2 x 200 = 400 tokens


def test_out_of_memory_fails_every_request_of_the_batch():
    profile = linear_profile(oom_tokens=500, oom_ms=0.5)
    r = reqs([0.0, 0.0, 10.0], lengths=[100, 300, 300])
    run = simulate(r, BatcherConfig(max_batch_size=2), profile)
    # 2 x 300 = 600 >= 500 fails after 0.5 ms; the later one alone (300 tokens) runs
    assert run.status.tolist() == [OUT_OF_MEMORY, OUT_OF_MEMORY, OK]
    assert run.exec_ok.tolist() == [False, True]
    assert latencies_ms(run, r) == [0.5, 0.5, 4.0]
    m = measurement(run, r, speed=1.0, warmup_s=0.0, max_batch_size=2)
    assert (m.requests, m.errors, m.execution_count) == (3, 2, 1)
    assert m.latency_ms["p50"] == pytest.approx(4.0)


def slow_profile() -> Profile:
    """Every execution 20 ms, whatever its size: arrivals queue behind a busy instance."""
    return Profile.from_function(lambda r, n: 20.0, rows=[1, 8], lengths=[100])


def test_batches_are_formed_ahead_of_a_busy_instance_and_close_at_a_preferred_size_with_delay_zero():
    r = reqs([0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0])
    pow2 = BatcherConfig(max_batch_size=8, preferred_batch_size=(1, 2, 4, 8))
    # 1 goes, 2 and 3 each reach a preferred size (1) and close, queued ahead (2 x 1 instance); the
    # last four wait for a slot and go as one preferred 4 (GetDynamicBatch, PayloadSlotAvailable)
    assert simulate(r, pow2, slow_profile()).exec_rows.tolist() == [1, 1, 1, 4]
    # a queue policy turns forming ahead off: the batch is formed when the instance is free
    bounded = BatcherConfig(max_batch_size=8, preferred_batch_size=(1, 2, 4, 8), max_queue_size=100)
    assert not bounded.prefetching
    assert simulate(r, bounded, slow_profile()).exec_rows.tolist() == [1, 4, 2]
    # no preferred size: the queued batch grows with every arrival
    grows = simulate(r, BatcherConfig(max_batch_size=8), slow_profile())
    assert grows.exec_rows.tolist() == [1, 6]
    assert grows.dispatch_s.tolist() == pytest.approx([0.0] + [20 * MS] * 6)  # taken when the instance frees


def test_a_queued_batch_the_batcher_is_not_woken_for_does_not_grow():
    # delay 5 ms: 1 runs from 5 to 25 ms; 2 waits its delay and is queued alone at 11 ms; 3 and 4 are
    # below the next preferred size (8 rows), so the sleeping batcher is not woken
    # (DynamicBatchScheduler::Enqueue): they do not join 2's batch and go together after it
    r = reqs([0.0, 6.0, 14.0, 16.0])
    run = simulate(r, BatcherConfig(max_batch_size=8, max_queue_delay_microseconds=5000), slow_profile())
    assert run.exec_rows.tolist() == [1, 1, 2]


def test_when_the_batcher_sees_an_execution_end_before_its_instance_does():
    # instance_first=False: the batcher, told of an execution's end, looks before the instance is back
    r = reqs([0.0, 6.0, 14.0, 16.0])
    delay = BatcherConfig(max_batch_size=8, max_queue_delay_microseconds=5000)
    # the batch queued behind the instance (2, alone) still grows by 3 and 4 when the batcher goes first
    assert simulate(r, delay, slow_profile(), instance_first=False).exec_rows.tolist() == [1, 3]
    # without prefetching, it finds no instance waiting and waits for the next arrival: 4 at 16 ms
    # finds it free (20 ms: 1's run ends) only when it arrives after that; here at 30 ms
    late = reqs([0.0, 2.0, 4.0, 30.0])
    bounded = BatcherConfig(max_batch_size=8, max_queue_size=100)
    first = simulate(late, bounded, slow_profile())
    assert first.exec_rows.tolist() == [1, 2, 1] and first.dispatch_s[1] == pytest.approx(20 * MS)
    second = simulate(late, bounded, slow_profile(), instance_first=False)
    assert second.exec_rows.tolist() == [1, 3] and second.dispatch_s[1] == pytest.approx(30 * MS)
    # with no arrival, its 500 ms wait ends it
    alone = simulate(reqs([0.0, 2.0]), bounded, slow_profile(), instance_first=False)
    assert alone.dispatch_s[1] == pytest.approx(520 * MS, abs=3 * MS)


def test_each_execution_end_may_have_its_own_winner():
    # Triton 2.51 on a loaded CI machine: REJECT after 100 ms, 200-ms executions; the instance won the
    # first end (1, 2 expired and refused at 200 ms, 3 runs) and the batcher the second (4, expired at
    # 360 ms, refused when its 500-ms wait for a slot ended: 900 ms), in four runs of four
    r = reqs([0.0, 20.0, 40.0, 150.0, 260.0])
    reject = BatcherConfig(max_batch_size=4, default_timeout_microseconds=100_000, timeout_action="reject")
    profile = Profile.from_function(lambda rows, length: 200.0, rows=[1, 4], lengths=[100])
    done = {str(w): (simulate(r, reject, profile, instance_first=w).done_s / MS).round().tolist()
            for w in (True, False, [True, False])}
    assert done == {"True": [200.0, 200.0, 200.0, 400.0, 400.0], "False": [200.0, 260.0, 260.0, 260.0, 460.0],
                    "[True, False]": [200.0, 200.0, 200.0, 400.0, 900.0]}
    # a sequence's last winner holds for the ends past it; an empty one is the instance's
    assert simulate(r, reject, profile, instance_first=[False]).done_s.tolist() == \
        simulate(r, reject, profile, instance_first=False).done_s.tolist()
    assert simulate(r, reject, profile, instance_first=[]).done_s.tolist() == \
        simulate(r, reject, profile).done_s.tolist()


def test_a_queue_timeout_rejects_or_delays_the_requests_queued_past_it():
    r = reqs([0.0, 2.0, 4.0, 15.0, 28.0])
    config = {"max_batch_size": 4, "default_timeout_microseconds": 10_000}
    rejected = simulate(r, BatcherConfig(**config), slow_profile())
    # 1 and 2 expire (12, 14 ms) before the instance frees at 20 ms, 4 (38 ms) before 3's run ends
    assert rejected.status.tolist() == [OK, TIMEOUT, TIMEOUT, OK, TIMEOUT]
    assert rejected.done_s[[1, 2]].tolist() == pytest.approx([20 * MS] * 2)  # found when the instance frees
    assert rejected.exec_rows.tolist() == [1, 1]
    delayed = simulate(r, BatcherConfig(**config, timeout_action="delay"), slow_profile())
    assert (delayed.status == OK).all() and delayed.exec_rows.tolist() == [1, 3, 1]


def test_each_request_after_the_first_adds_its_host_time_half_before_half_after_the_device():
    per_request = linear_profile(host_ms_per_request=2.0)
    three = reqs([0.0, 0.0, 0.0])
    run = simulate(three, BatcherConfig(max_batch_size=4), per_request)
    # 3 requests: 2 more than one, 4 ms of host work: 2 ms before the device (1 + 3 rows = 4 ms), 2 after
    assert latencies_ms(run, three) == [8.0, 8.0, 8.0]
    assert run.exec_start_s.tolist() == [0.0] and run.exec_end_s.tolist() == pytest.approx([8 * MS])
    # one request of 3 rows: the same device time, no per-request host work
    one = reqs([0.0], rows=[3])
    assert latencies_ms(simulate(one, BatcherConfig(max_batch_size=4), per_request), one) == [4.0]
    # the host work before the device overlaps another instance's device time, as host_ms_per_row's does
    two = simulate(reqs([0.0, 0.0, 0.0, 0.0]), BatcherConfig(max_batch_size=2, instance_count=2), per_request)
    # both: host 0-1; A device 1-4, host 4-5; B waits for the device until 4, 4-7, host 7-8
    assert latencies_ms(two, reqs([0.0] * 4)) == [5.0, 5.0, 8.0, 8.0]


def test_out_of_memory_follows_the_limit_measured_at_each_length():
    # 8 rows ran at length 100 and failed at length 400 from 3 rows: short batches stay large
    profile = Profile.from_function(lambda r, n: 1.0 + r * n / 100.0, rows=[1, 2, 4, 8], lengths=[100, 400],
                                    oom_rows=((400, 3),), oom_ms=0.5)
    r = reqs([0.0] * 8 + [20.0] * 3, lengths=[100] * 8 + [400] * 3)
    run = simulate(r, BatcherConfig(max_batch_size=8), profile)
    assert run.exec_rows.tolist() == [8, 3] and run.exec_ok.tolist() == [True, False]
    assert run.status.tolist() == [OK] * 8 + [OUT_OF_MEMORY] * 3


def test_a_full_queue_refuses_arrivals():
    r = reqs([0.0, 0.1, 0.2, 0.3, 0.4])
    run = simulate(r, BatcherConfig(max_batch_size=1, max_queue_size=2), linear_profile())
    # request 0 runs at once; 1 and 2 fill the queue; 3 and 4 are refused
    assert run.status.tolist() == [OK, OK, OK, QUEUE_FULL, QUEUE_FULL]
    assert np.isnan(run.done_s[3:]).all()
    unbounded = simulate(r, BatcherConfig(max_batch_size=1), linear_profile())
    assert (unbounded.status == OK).all()


def test_a_request_above_max_batch_size_is_refused():
    r = reqs([0.0, 1.0], rows=[1, 9])
    run = simulate(r, BatcherConfig(max_batch_size=8), linear_profile())
    assert run.status.tolist() == [OK, TOO_LARGE]


def test_requests_out_of_order_are_refused():
    with pytest.raises(TrafficError, match="request 2 is due at 0.001 s, before request 1 at 0.002 s"):
        simulate(reqs([0.0, 2.0, 1.0]), BatcherConfig(max_batch_size=2), linear_profile())


def test_config_checks_say_which_rule_broke():
    with pytest.raises(SettingsError, match=r"size <= max_batch_size must hold, but got \(size=16, max_batch_size=8\)"):
        BatcherConfig(max_batch_size=8, preferred_batch_size=(4, 16))
    with pytest.raises(SettingsError, match="instance_count must be an integer >= 1, got 0"):
        BatcherConfig(max_batch_size=8, instance_count=0)
    with pytest.raises(SettingsError, match="max_queue_delay: unknown key"):
        batcher_config({"max_batch_size": 4, "max_queue_delay": 5})
    c = batcher_config({"max_batch_size": 8, "preferred_batch_size": "powers_of_two"})
    assert c.preferred_batch_size == (1, 2, 4, 8)
    assert batcher_config({"max_batch_size": 4}, base_preferred=(4, 16)).preferred_batch_size == (4,)


# --- properties ------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_more_delay_never_lowers_the_mean_batch_size(seed):
    # With an instance always free, batching is greedy covering of the arrivals by windows that last
    # at most the delay and hold at most max_batch_size rows; a longer delay admits every cover a
    # shorter one does, and greedy covering is optimal, so executions can only get fewer.
    # (Behind a busy instance this need not hold: the delay shifts the phase of later batches.)
    rng = np.random.default_rng(seed)
    n = 400
    due = np.cumsum(rng.exponential(1.0 / rng.uniform(200, 1500), n)) * 1e3
    r = reqs(due, rows=rng.integers(1, 3, n), lengths=rng.integers(10, 300, n))
    profile = linear_profile(host_ms_per_row=0.05, concurrent_executions=n)
    for mbs in (4, 16):
        means = []
        for delay in (0, 500, 1000, 2000, 4000, 8000):
            config = BatcherConfig(max_batch_size=mbs, max_queue_delay_microseconds=delay, instance_count=n)
            run = simulate(r, config, profile)
            assert run.exec_requests.sum() == n  # every request served exactly once
            means.append(run.exec_rows.mean())
        assert all(b >= a - 1e-9 for a, b in zip(means, means[1:], strict=False)), (mbs, means)
        assert means[-1] > means[0]


def reference(requests: Requests, config: BatcherConfig, profile: Profile) -> tuple[list, list, list]:
    """The same rules, written the slow and obvious way: at every event, rescan the whole queue."""
    due, rows, shape = requests.due_s.tolist(), requests.rows.tolist(), requests.length.tolist()
    lens = [profile.length_of(x) for x in shape]
    n, mbs, delay = len(due), config.max_batch_size, config.max_queue_delay_microseconds * 1e-6
    preferred = set(config.preferred)
    status, dispatch, done = [OK] * n, [math.nan] * n, [math.nan] * n
    free, device = [0.0] * config.instance_count, [0.0] * profile.concurrent_executions
    queue, j, now = [], 0, 0.0
    while True:
        while j < n and due[j] <= now:
            if rows[j] > mbs:
                status[j] = TOO_LARGE
            elif config.max_queue_size and len(queue) >= config.max_queue_size:
                status[j] = QUEUE_FULL
            else:
                queue.append(j)
            j += 1
        idle = [k for k in range(len(free)) if free[k] <= now]
        if queue and idle:
            # scan the queue from its head (GetDynamicBatch)
            cnt = cum = best = 0
            full = False
            for i in queue:
                if cnt and cum + rows[i] > max(preferred) and best == 0:
                    best = cnt
                if cnt and (cum + rows[i] > mbs or (config.equal_shapes and shape[i] != shape[queue[0]])):
                    full = True
                    break
                cnt, cum = cnt + 1, cum + rows[i]
                if cum in preferred:
                    best = cnt
            exceeded = delay > 0 and now >= due[queue[0]] + delay
            take = 0
            if best and not exceeded:
                take = best
            elif full or cum >= max(preferred) or exceeded or delay == 0:
                take = cnt
            if take:
                batch, queue = queue[:take], queue[take:]
                k = min(idle, key=lambda x: free[x])
                rows_, longest = sum(rows[i] for i in batch), max(lens[i] for i in batch)
                pre = (profile.host_ms_per_execution + profile.host_ms_per_row * rows_) / 2 * MS
                ready = now + pre
                d = min(range(len(device)), key=lambda x: device[x])
                start = max(device[d], ready)
                ok = not profile.fails(rows_, longest)
                held = profile.device_ms(rows_, longest) * MS if ok else profile.oom_ms * MS
                device[d] = start + held
                post = pre if ok else profile.host_ms_per_execution / 2 * MS
                free[k] = start + held + post
                for i in batch:
                    dispatch[i], done[i] = now, free[k] + profile.overhead_ms * MS
                    status[i] = OK if ok else OUT_OF_MEMORY
                continue
        events = [due[j]] if j < n else []
        if queue:
            events += [f for f in free if f > now]
            if idle and delay > 0:
                events.append(due[queue[0]] + delay)
        events = [e for e in events if e > now]
        if not events:
            return status, dispatch, done
        now = min(events)


@pytest.mark.parametrize("seed", range(16))
def test_the_simulation_agrees_with_a_plain_reference_implementation(seed):
    rng = np.random.default_rng(100 + seed)
    n = 300
    due = np.cumsum(rng.exponential(1.0 / rng.uniform(100, 3000), n)) * 1e3
    equal_shapes = seed >= 8  # then a few lengths, so that equal ones meet
    lengths = rng.choice([64, 128, 512], n) if equal_shapes else rng.integers(10, 400, n)
    r = reqs(due, rows=rng.integers(1, 4, n), lengths=lengths)
    mbs = int(rng.choice([1, 3, 8, 16]))
    preferred = [None, (mbs,), tuple(sorted({max(1, mbs // 2), mbs})), (1, 2)][seed % 4]
    preferred = tuple(p for p in preferred if p <= mbs) if preferred else None
    config = BatcherConfig(max_batch_size=mbs, max_queue_delay_microseconds=int(rng.choice([0, 700, 3000])),
                           preferred_batch_size=preferred or None, instance_count=int(rng.integers(1, 4)),
                           max_queue_size=int(rng.choice([0, 0, 5])), equal_shapes=equal_shapes)
    profile = linear_profile(host_ms_per_row=float(rng.choice([0.0, 0.3])), overhead_ms=0.2,
                             host_ms_per_execution=float(rng.choice([0.0, 0.8])),
                             oom_tokens=int(rng.choice([1500, 100_000])), oom_ms=0.4,
                             concurrent_executions=int(rng.integers(1, 3)))
    run = simulate(r, config, profile)
    status, dispatch, done = reference(r, config, profile)
    assert run.status.tolist() == status, config
    np.testing.assert_allclose(run.dispatch_s, dispatch, rtol=0, atol=1e-12)
    np.testing.assert_allclose(run.done_s, done, rtol=0, atol=1e-12)


def test_every_request_is_served_once_in_arrival_order_per_instance():
    rng = np.random.default_rng(7)
    due = np.cumsum(rng.exponential(0.5, 300))
    r = reqs(due, rows=rng.integers(1, 4, 300), lengths=rng.integers(1, 200, 300))
    run = simulate(r, BatcherConfig(max_batch_size=8, max_queue_delay_microseconds=1500, instance_count=3),
                   linear_profile(host_ms_per_row=0.3))
    assert (run.status == OK).all()
    assert run.exec_requests.sum() == 300 and (run.exec_rows <= 8).all()
    assert (np.diff(run.dispatch_s) >= 0).all()  # FIFO: batches leave in arrival order
    assert (run.dispatch_s >= r.due_s).all() and (run.done_s > run.dispatch_s).all()


# --- the profile -----------------------------------------------------------------------------------


def test_interpolation_is_linear_between_points_and_extrapolates_along_the_last_segment():
    p = Profile(points=(ProfilePoint(1, 100, 2.0, 2.0, 2.0), ProfilePoint(4, 100, 5.0, 4.0, 6.0),
                        ProfilePoint(8, 100, 9.0, 9.0, 9.0)), basis="tokens")
    assert p.device_ms(2, 100) == pytest.approx(3.0)
    assert p.device_ms(16, 100) == pytest.approx(17.0)  # along 4 -> 8 rows: 1 ms per 100 tokens
    assert p.device_ms(1, 10) == pytest.approx(2.0)  # flat below the first point
    assert p.device_ms(1, 400) == pytest.approx(5.0)  # tokens: 1 x 400 = 4 x 100


def test_auto_basis_picks_tokens_when_padded_tokens_explain_the_points_and_grid_when_not():
    tokens = Profile.from_function(lambda r, n: 1 + r * n / 100, rows=[1, 2, 4, 8], lengths=[50, 100, 200])
    assert tokens.resolved_basis == "tokens"
    # cost quadratic in length per row (attention-like): rows x length does not explain it
    quadratic = Profile.from_function(lambda r, n: 1 + r * n * n / 1e4, rows=[1, 2, 4, 8, 16],
                                      lengths=[50, 100, 200, 400])
    assert quadratic.resolved_basis == "grid"
    assert quadratic.basis_errors["grid"] < quadratic.basis_errors["tokens"]
    assert quadratic.device_ms(4, 100) == pytest.approx(5.0)  # a measured point is reproduced


def test_profile_round_trips_through_csv(tmp_path):
    p = linear_profile(host_ms_per_row=0.12, host_ms_per_execution=0.4, overhead_ms=0.3, oom_tokens=16385, oom_ms=3.0, max_length=512)
    path = write_profile(p, tmp_path / "p.csv")
    assert path.read_text().startswith("# tuner profile v1\n")
    back = read_profile(path)
    assert back == p
    assert pd.read_csv(path, comment="#").shape == (4, 6)


@pytest.mark.parametrize("text, message", [
    ("# tuner profile v1\nrows,length,median_ms\n", "no points"),
    ("# tuner profile v1\n", "no points"),
    ("rows,length,median_ms\n2,100,-1\n", r"p.csv:2: median_ms must be a number > 0, got -1"),
    ("rows,length,median_ms\n2.5,100,1\n", r"p.csv:2: rows must be an integer >= 1, got 2.5"),
    ("rows,median_ms\n2,1\n", "missing column 'length'"),
    ("# host_ms: 1\nrows,length,median_ms\n1,1,1\n", r"p.csv:1: host_ms: unknown key"),
    ("rows,length,median_ms,p10_ms,p90_ms\n1,1,2,3,4\n",
     r"p10_ms <= median_ms <= p90_ms must hold, but got \(p10_ms=3, median_ms=2, p90_ms=4\)"),
    ("# oom_tokens: 100\nrows,length,median_ms\n1,200,1\n", "at or above oom_tokens=100"),
    ("rows,length,median_ms\n1,1,1\n1,1,2\n", "repeats point 1"),
])
def test_bad_profiles_are_refused_in_one_line(tmp_path, text, message):
    path = tmp_path / "p.csv"
    path.write_text(text)
    with pytest.raises(ProfileError, match=message):
        read_profile(path)


def test_missing_profile_file_is_refused(tmp_path):
    with pytest.raises(ProfileError, match="no such file"):
        read_profile(tmp_path / "nope.csv")


# --- steps, capacity, ranking ----------------------------------------------------------------------


def poisson_traffic(rate: float = 50.0, seconds: float = 40.0, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    ts = np.cumsum(rng.exponential(1.0 / rate, int(rate * seconds)))
    return pd.DataFrame({"timestamp": ts, "batch_size": 1, "seq_len": rng.integers(20, 200, len(ts))})


def make_simulator(traffic=None, **kw) -> Simulator:
    args = dict(sla=SlaSettings(latency_ms=50.0, percentile=99.0, max_error_rate=0.001),
                capacity=CapacitySettings(tolerance=0.05, start_speed=1.0, max_speed=100.0, step_duration_s=3.0,
                                          max_steps=12),
                warmup_s=1.0, load_speed=1.0, price_per_hour=3.6)
    args.update(kw)
    return Simulator(traffic if traffic is not None else poisson_traffic(), linear_profile(host_ms_per_row=0.1),
                     **args)


def test_a_simulated_step_is_a_measurement_the_sla_check_reads():
    sim = make_simulator()
    m = sim.step(BatcherConfig(max_batch_size=8), 1.0)
    assert m.valid and m.duration_s == pytest.approx(3.0, abs=0.1)
    assert m.offered_rps == pytest.approx(50, rel=0.5)
    assert 1 <= m.mean_batch_size <= 8 and m.fill_rate == pytest.approx(m.mean_batch_size / 8)
    assert check_sla(m, sim.sla).ok and m.latency_ms["p99"] < 50
    assert m.busy_s > 0 and sum(m.batch_histogram.values()) == m.execution_count


def test_a_sparse_simulated_step_offers_its_requests_per_second_of_the_step_as_a_replay_does():
    # one request a second: a 3-s step holds 3, the last due 2 s in; a real replay's window lasts the
    # step (tuner.trial.step.step_windows), and so does the simulated one's
    traffic = pd.DataFrame({"timestamp": np.arange(60.0), "batch_size": 1, "seq_len": 100})
    sim = make_simulator(traffic)
    step = sim.run(BatcherConfig(max_batch_size=8), 1.0)
    measured = int((step.requests.due_s >= step.warmup_s).sum())
    assert step.measurement.duration_s == pytest.approx(3.0)
    assert step.measurement.offered_rps == pytest.approx(measured / 3.0)
    # the speeds simulated so far, each with its step's requests, as benchmarks/simulate_speed.py
    # prints them
    double = sim.run(BatcherConfig(max_batch_size=8), 2.0)
    assert sim.speeds == {1.0: 3, 2.0: len(double.requests)} and len(double.requests) == 6
    # a traffic shorter than the step: its own span, as a replay of all of it
    short = make_simulator(traffic.head(3)).run(BatcherConfig(max_batch_size=8), 1.0)
    assert short.measurement.duration_s == pytest.approx(float(short.requests.due_s[-1]) - short.warmup_s)


def test_capacity_uses_the_real_bisection_and_batching_raises_it():
    traffic = poisson_traffic()
    sim = make_simulator(traffic)
    one = sim.capacity(BatcherConfig(max_batch_size=1))
    # the same bisection by hand: find_capacity over the simulator's steps
    again = find_capacity(lambda s: sim.step(BatcherConfig(max_batch_size=1), s), sim.sla,
                          sim.capacity_settings, start_speed=1.0, min_speed=1.0, rate=sim.rate)
    assert one.capacity_rps == pytest.approx(again.capacity_rps)
    assert one.converged and one.capacity_rps > 0
    batched = sim.capacity(BatcherConfig(max_batch_size=16))
    assert batched.capacity_rps > one.capacity_rps  # batching amortises the 1 ms fixed cost


def test_trial_and_rank_score_both_ways_best_first():
    sim = make_simulator()
    result = sim.trial(BatcherConfig(max_batch_size=8, max_queue_delay_microseconds=2000))
    assert result.meets_sla and result.capacity_rps > 0
    assert result.scores["capacity"] == pytest.approx(result.capacity_rps * 3600 / 3.6)
    assert result.scores["utilization"] > 0 and result.note == "simulated"
    configs = [{"max_batch_size": b, "max_queue_delay_microseconds": d} for b in (1, 4, 16) for d in (0, 4000)]
    seen = []
    table = sim.rank(configs, on_config=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (6, 6) and list(table["rank"]) == [1, 2, 3, 4, 5, 6]
    assert table["value"].is_monotonic_decreasing
    for col in ("capacity_rps", "latency_p99_ms", "fill_rate", "busy_s", "score_capacity", "score_utilization"):
        assert col in table.columns
    assert table.loc[0, "max_batch_size"] != 1


def test_an_sla_on_the_slowest_request_ranks_by_the_max_and_shows_it():
    sim = make_simulator(sla=SlaSettings(latency_ms=200.0, percentile=100))
    table = sim.rank([{"max_batch_size": b, "max_queue_delay_microseconds": 0} for b in (4, 16)])
    assert table["latency_max_ms"].notna().all() and table["capacity_latency_ms"].notna().all()
    assert (table["latency_max_ms"] >= table["latency_p99_ms"]).all()


def test_an_infeasible_configuration_scores_zero():
    sim = make_simulator(sla=SlaSettings(latency_ms=1.0))  # below a single execution's time
    result = sim.trial(BatcherConfig(max_batch_size=4))
    assert not result.meets_sla and result.value("capacity") == 0.0 and result.capacity_rps == 0.0


def test_when_nothing_meets_the_sla_the_nearest_ranks_first():
    # all score 0: the order was the order given (batch 1 first), and `tuner simulate` named batch 1
    # "the closest" at p99 139 ms where batch 2 missed by half as much
    sim = make_simulator(sla=SlaSettings(latency_ms=0.05))
    table = sim.rank([{"max_batch_size": b, "max_queue_delay_microseconds": d} for b in (1, 4, 16) for d in (0, 4000)])
    assert (table["value"] == 0).all()
    assert table["violation"].is_monotonic_increasing and table.loc[0, "violation"] < table["violation"].max()
    assert table.loc[0, "latency_p99_ms"] == table["latency_p99_ms"].min()


def short_traffic(rate: float = 5.0, seconds: float = 60.0) -> pd.DataFrame:
    """One length, about a minute: at speed 64 or 128 it lasts less than a 1 s warm-up."""
    return poisson_traffic(rate=rate, seconds=seconds).assign(seq_len=100)


def test_a_step_the_traffic_is_too_short_for_ends_the_search_at_the_traffics_limit_and_is_said():
    """The reviewer's trace (one length, 60 s) at speed 1: the step at 64 holds no request, which ended
    every capacity search with `limited_by="load_generator"` (no load generator in a simulation) and tied
    the whole space at the speed below it, in silence. As the real search now stops (the shared rule in
    find_capacity): the traffic's limit, named, and the ranking says its ties are the traffic's."""
    sim = make_simulator(short_traffic(), capacity=CapacitySettings(tolerance=0.15, start_speed=8.0, max_speed=200.0,
                                                                    step_duration_s=2.0, max_steps=6))
    found = sim.capacity(BatcherConfig(max_batch_size=8))
    last = found.steps[-1]
    assert found.limited_by == "traffic", found.limited_by
    assert last.measurement.requests == 0 and found.speed == last.speed / 2  # doubling from 8, to the end
    configs = [{"max_batch_size": b, "max_queue_delay_microseconds": d} for b in (2, 8) for d in (0, 2000)]
    table = sim.rank(configs)
    assert (table["value"] > 0).all() and (table["limited_by"] == "traffic").all()
    assert table["capacity_rps"].nunique() == 1  # the tie the traffic makes
    note = sim.capped_by_traffic(table)
    assert note.startswith("4 of the 4 configurations that met the SLA (the best among them) reached the end of "
                           f"the traffic: at speed {last.speed:g} a step holds no request after its 1 s warm-up "
                           "(the traffic lasts 0."), note
    assert f"(each {table['capacity_rps'].iloc[0]:.1f} req/s, the last speed that passed) is a floor" in note
    # a trace long enough for the SLA to break first: nothing capped, nothing said
    long = make_simulator()
    table = long.rank(configs)
    assert (table["limited_by"] != "traffic").all() and long.capped_by_traffic(table) is None


def test_length_column_is_the_one_input_dim_column_or_seq_len():
    assert length_column(pd.DataFrame({"timestamp": [0.0], "seq_len": [3]})) == "seq_len"
    assert length_column(pd.DataFrame({"timestamp": [0.0], "INPUT_IDS:0": [3], "seq_len": [3]})) == "INPUT_IDS:0"
    assert length_column(pd.DataFrame({"timestamp": [0.0]})) is None
    # a BERT's three inputs of one length (a Triton trace gives a column each): one length, the first's
    bert = pd.DataFrame({"timestamp": [0.0, 1.0], "INPUT_IDS:0": [3, 7], "ATTENTION_MASK:0": [3, 7],
                         "TOKEN_TYPE_IDS:0": [3, 7]})
    assert length_column(bert) == "INPUT_IDS:0"
    with pytest.raises(TrafficError, match=r"^traffic row 2, timestamp 1.0: 2 input dim columns differ \(A:0=7, B:0=2\)"):
        length_column(pd.DataFrame({"timestamp": [0.0, 1.0], "A:0": [1, 7], "B:0": [1, 2]}))


# --- the command -----------------------------------------------------------------------------------


@pytest.fixture
def study(tmp_path):
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    poisson_traffic(rate=30, seconds=60).to_csv(tmp_path / "traffic.csv", index=False)
    write_profile(linear_profile(host_ms_per_row=0.1, max_length=512), tmp_path / "profile.csv")
    (tmp_path / "study.yaml").write_text(f"""
name: sim
model_repository: {root / "model_repository_templates"}
model: encoder_sim
traffic: {{path: traffic.csv, speed: 1}}
replay: {{warmup_s: 1.0}}
sla: {{latency_ms: 50, percentile: 99}}
cost: {{price_per_hour: 3.6}}
search:
  max_batch_size: {{low: 1, high: 16, log: true}}
  max_queue_delay_microseconds: {{low: 0, high: 4000, step: 2000}}
  capacity: {{step_duration_s: 3.0, tolerance: 0.1, start_speed: 1, max_speed: 100}}
""")
    return tmp_path


def test_cli_prints_the_ranked_table_and_answers_what_ifs(study, capsys):
    out_json = study / "ranking.json"
    code = main(["simulate", str(study / "study.yaml"), "--profile", str(study / "profile.csv"),
                 "--top", "5", "--json", str(out_json)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "capacity req/s" in out and "p99 ms at load" in out and "best" in out and "incumbent" in out
    data = json.loads(out_json.read_text())
    assert len(data["ranking"]) == 16 * 3 + 1  # every batch size 1..16 x 3 delays, and the incumbent (64)
    best = data["ranking"][0]
    # twice the traffic: the same capacity in req/s (the model did not change), at half the speed
    code = main(["simulate", str(study / "study.yaml"), "--profile", str(study / "profile.csv"),
                 "--traffic-scale", "2", "--price", "7.2", "--json", str(out_json)])
    assert code == 0
    doubled = json.loads(out_json.read_text())["ranking"]
    same = next(r for r in doubled if r["max_batch_size"] == best["max_batch_size"]
                and r["max_queue_delay_microseconds"] == best["max_queue_delay_microseconds"])
    assert same["capacity_rps"] == pytest.approx(best["capacity_rps"], rel=0.25)
    assert same["score_capacity"] == pytest.approx(same["capacity_rps"] * 3600 / 7.2)
    # an SLA no configuration meets: exit 3
    code = main(["simulate", str(study / "study.yaml"), "--profile", str(study / "profile.csv"), "--sla-ms", "0.5"])
    assert code == 3
    # --price is one server's, whatever GPUs per server the study's price table multiplied (it was refused
    # naming cost.price_per_hour, which the user did not write)
    text = (study / "study.yaml").read_text().replace("cost: {price_per_hour: 3.6}", "cost: {gpu: a100-40gb, gpus_per_server: 2}")
    (study / "study.yaml").write_text(text)
    code = main(["simulate", str(study / "study.yaml"), "--profile", str(study / "profile.csv"), "--price", "7.2",
                 "--json", str(out_json)])
    assert code == 0, capsys.readouterr().err
    assert json.loads(out_json.read_text())["price_per_hour"] == 7.2


def test_cli_checks_the_traffic_as_tune_does_and_ranks_only_the_space_tune_searches(study, capsys):
    traffic = poisson_traffic(rate=30, seconds=60)
    traffic.loc[17, "batch_size"] = 4  # a request of 4 rows: max_batch_size 1 and 2 refuse it
    traffic.to_csv(study / "traffic.csv", index=False)
    out_json = study / "ranking.json"
    code = main(["simulate", str(study / "study.yaml"), "--profile", str(study / "profile.csv"), "--json", str(out_json)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "note: search.max_batch_size: low raised from 1 to 4" in captured.err and "(traffic row 18, timestamp " in captured.err
    ranked = json.loads(out_json.read_text())["ranking"]
    assert {r["max_batch_size"] for r in ranked} == set(range(4, 17)) | {64}  # 4..16, and the incumbent's 64
    # a request the model itself refuses: refused in tune's words, before any ranking
    traffic.loc[17, "batch_size"] = 65
    traffic.to_csv(study / "traffic.csv", index=False)
    code = main(["simulate", str(study / "study.yaml"), "--profile", str(study / "profile.csv")])
    _refused(capsys, code, "max_batch_size is 64, but the traffic has requests of 65 rows (traffic row 18, timestamp ")


def test_cli_says_when_the_space_reaches_rows_the_profile_did_not_time(study, capsys):
    """The study's profile timed 1..8 rows; its space goes to 16 and its incumbent is 64: said, not silent."""
    assert main(["simulate", str(study / "study.yaml"), "--profile", str(study / "profile.csv"), "--top", "1"]) == 0
    err = capsys.readouterr().err
    assert ("note: the profile timed batches of up to 8 rows; the space's largest max_batch_size 16 and the "
            "incumbent's 64: executions above 8 rows are extrapolated from it") in err
    # every row and every length of the traffic (20..199) measured
    write_profile(Profile.from_function(lambda r, n: 1.0 + r * n / 100.0, rows=[1, 2, 4, 8, 16, 32, 64],
                                        lengths=[100, 200], host_ms_per_row=0.1, max_length=512), study / "wide.csv")
    assert main(["simulate", str(study / "study.yaml"), "--profile", str(study / "wide.csv"), "--top", "1"]) == 0
    assert "extrapolated" not in capsys.readouterr().err


def test_cli_says_when_the_traffic_is_longer_than_the_profile_measured(study, capsys):
    """A profile of one length (64) used on traffic of lengths 20..199 ranked in silence (the reviewer's
    profile of a one-length trace on the Azure traffic lost the out-of-memory limit at 33 x 512): how
    far beyond, and what share of the requests, as the note on rows says it."""
    traffic = pd.read_csv(study / "traffic.csv")
    write_profile(Profile.from_function(lambda r, n: 1.0 + r * n / 100.0, rows=[1, 2, 4, 8, 16, 32, 64],
                                        lengths=[64], host_ms_per_row=0.1, max_length=512), study / "short.csv")
    assert main(["simulate", str(study / "study.yaml"), "--profile", str(study / "short.csv"), "--top", "1"]) == 0
    err = capsys.readouterr().err
    longer = int((traffic["seq_len"] > 64).sum())
    longest = int(traffic["seq_len"].max())
    assert 0 < longer < len(traffic)
    assert (f"note: the profile measured lengths up to 64; {longer} of the traffic's {len(traffic)} requests "
            f"({longer / len(traffic):.1%}) are longer, up to {longest} ({longest / 64:.1f}x): executions at those "
            "lengths are inferred from shorter ones") in err, err
    assert "timed batches" not in err  # its rows cover the space's: one note, about lengths


def test_the_strategy_is_told_of_lengths_the_profile_did_not_measure_as_simulate_is(study):
    """`SpaceModel.extrapolated`, the one note `tuner simulate` and the model strategy of `tuner tune`
    print: lengths beyond the profile's (after the model's truncation), beside rows beyond it."""
    from tuner import search
    from tuner.settings import read_study
    from tuner.study import base_config, study_traffic

    settings = read_study(study / "study.yaml")
    base, traffic = base_config(settings), study_traffic(settings)

    def note(lengths, **kw):
        profile = Profile.from_function(lambda r, n: 1.0 + r * n / 100.0, rows=[1, 2, 4, 8, 16, 32, 64],
                                        lengths=lengths, **kw)
        return search.model_space(settings, base=base, traffic=traffic, profile=profile).extrapolated()

    assert note([100, 200]) is None
    assert note([100], max_length=100) is None  # the model truncates at 100: every length computes as 100
    one = note([35, 64], max_length=150)
    assert one.startswith("the profile measured lengths up to 64; ") and "up to 150 (2.3x, the model truncating at " \
        "150)" in one, one
    assert note([199]) is None
    # the one-point profile the reviewer ranked at 513 req/s: both said, in one line
    point = search.model_space(settings, base=base, traffic=traffic, profile=Profile(points=(
        ProfilePoint(1, 35, 1.6, 1.5, 1.7),))).extrapolated()
    assert "timed batches of up to 1 rows" in point and "measured lengths up to 35;" in point


def test_cli_says_when_the_traffic_caps_the_capacity_and_ties_the_ranking(study, capsys):
    short_traffic().to_csv(study / "traffic.csv", index=False)
    out_json = study / "ranking.json"
    assert main(["simulate", str(study / "study.yaml"), "--profile", str(study / "profile.csv"), "--top", "3",
                 "--json", str(out_json)]) == 0
    err = capsys.readouterr().err
    ranking = json.loads(out_json.read_text())["ranking"]
    met = [r for r in ranking if r["value"] > 0]
    capped = [r for r in met if r["limited_by"] == "traffic"]
    assert capped and ranking[0]["limited_by"] == "traffic"
    assert not any(r["limited_by"] == "load_generator" for r in ranking)
    assert (f"note: {len(capped)} of the {len(met)} configurations that met the SLA (the best and the incumbent "
            "among them) reached the end of the traffic: at speed ") in err, err
    assert "a floor the traffic sets and their ties are the traffic's" in err


def test_a_listed_choice_of_preferred_sizes_ranks_each_configuration_with_each(study, capsys):
    text = (study / "study.yaml").read_text().replace("  capacity:", "  preferred_batch_size: [none, powers_of_two]\n"
                                                                    "  max_batch_size: {low: 4, high: 16, log: true}\n"
                                                                    "  capacity:", 1)
    (study / "study.yaml").write_text(text.replace("  max_batch_size: {low: 1, high: 16, log: true}\n", "", 1))
    out_json = study / "ranking.json"
    code = main(["simulate", str(study / "study.yaml"), "--profile", str(study / "profile.csv"), "--json", str(out_json)])
    assert code == 0, capsys.readouterr()
    ranking = pd.DataFrame(json.loads(out_json.read_text())["ranking"])
    searched = ranking[ranking["max_batch_size"] <= 16]
    assert len(searched) == 13 * 3 * 2  # every batch size 4..16 x 3 delays x both strategies, and the incumbent (64)
    # each configuration with each strategy, named as the study's parameter is
    pairs = searched.groupby(["max_batch_size", "max_queue_delay_microseconds"])["preferred_batch_size"].apply(sorted)
    assert all(both == ["none", "powers_of_two"] for both in pairs)
    assert ranking.loc[ranking["max_batch_size"] == 64, "preferred_batch_size"].tolist() == ["none"]  # the incumbent


def test_cli_refuses_a_bad_profile_in_one_line(study, capsys):
    (study / "bad.csv").write_text("rows,length,median_ms\n")
    for profile, message in ((study / "bad.csv", "no points"), (study / "missing.csv", "no such file")):
        code = main(["simulate", str(study / "study.yaml"), "--profile", str(profile)])
        err = capsys.readouterr().err
        assert code == 2
        assert err.startswith("tuner: error: ") and message in err and len(err.strip().splitlines()) == 1
    code = main(["simulate", str(study / "study.yaml"), "--profile", str(study / "profile.csv"), "--speed", "0"])
    assert code == 2 and "--speed: must be > 0" in capsys.readouterr().err


def test_cli_refuses_a_setting_the_simulation_does_not_model_in_one_line(study, capsys):
    import shutil
    from pathlib import Path

    template = Path(__file__).resolve().parents[1] / "model_repository_templates" / "encoder_sim"
    shutil.copytree(template, study / "repo" / "encoder_sim")
    config = study / "repo" / "encoder_sim" / "config.pbtxt"
    config.write_text(config.read_text().replace(
        "dynamic_batching { }", "dynamic_batching { priority_levels: 2 default_priority_level: 1 }\n"
        "optimization { eager_batching: true }"))
    yaml_text = (study / "study.yaml").read_text()
    (study / "study.yaml").write_text(yaml_text.replace(f"model_repository: {template.parent}",
                                                        f"model_repository: {study / 'repo'}"))
    out_json = study / "ranking.json"
    code = main(["simulate", str(study / "study.yaml"), "--profile", str(study / "profile.csv"),
                 "--json", str(out_json)])
    captured = capsys.readouterr()
    assert code == 2
    err = captured.err.strip()
    assert err.startswith(f"tuner: error: {config}: ") and len(err.splitlines()) == 1
    assert "optimization.eager_batching" in err
    assert "dynamic_batching.priority_levels" in err  # a queue timeout is modelled now; priorities are not
    assert "capacity req/s" not in captured.out and not out_json.exists()  # nothing simulated


def test_simulated_latency_is_from_the_due_time():
    r = reqs([0.0, 0.0, 0.0])
    run = simulate(r, BatcherConfig(max_batch_size=1), linear_profile())
    m = measurement(run, r, speed=1.0, warmup_s=0.0, max_batch_size=1)
    assert sorted(m.latencies_ms.tolist()) == pytest.approx([2.0, 4.0, 6.0])  # queueing counts
    assert m.latency_ms["max"] == pytest.approx(6.0) and not math.isnan(m.latency_ms["p99"])


def test_the_strategy_orders_the_space_by_a_finer_bisection_and_reports_the_studys(study):
    from tuner import search
    from tuner.settings import read_study
    from tuner.simulate import read_profile
    from tuner.study import base_config, study_traffic

    settings = read_study(study / "study.yaml")  # capacity tolerance 0.1
    base, traffic = base_config(settings), study_traffic(settings)
    ranking = search.rank_space(settings, base, traffic, profile=read_profile(study / "profile.csv"))
    assert list(ranking["rank"]) == list(range(1, len(ranking) + 1))
    feasible = ranking[ranking["value"] > 0]
    # the order: capacity bisected to 1 %, best first; the figures: the study's 10 % bisection
    assert feasible["ranking_capacity_rps"].is_monotonic_decreasing
    assert feasible["capacity_rps"].nunique() < feasible["ranking_capacity_rps"].nunique()
    assert (feasible["capacity_rps"] <= feasible["ranking_capacity_rps"] * 1.001).all()


def test_a_searched_preferred_strategy_is_enqueued_as_the_studys_parameter(study):
    """The strategy enqueues the simulation's picks as trial parameters: a searched preferred-size
    strategy by its name (a sizes label, `default` or `1,2,4`, is no choice Optuna has), and places
    the incumbent in the ranking by its parameters."""
    import optuna

    from tuner import search, space
    from tuner.settings import read_study
    from tuner.simulate import read_profile
    from tuner.study import base_config, study_traffic

    text = (study / "study.yaml").read_text()
    (study / "study.yaml").write_text(text.replace("  capacity:", "  preferred_batch_size: [none, powers_of_two]\n"
                                                                   "  instance_count: {low: 1, high: 2}\n  capacity:", 1))
    settings = read_study(study / "study.yaml")
    base, traffic = base_config(settings), study_traffic(settings)
    model = search.model_space(settings, base=base, traffic=traffic, profile=read_profile(study / "profile.csv"))
    ranking = model.rank()
    assert set(ranking["preferred_batch_size"]) == {"none", "powers_of_two"}
    placed = model.against_incumbent(ranking)
    assert placed.loc[placed["tag"].str.contains("incumbent"), "max_batch_size"].tolist() == [64]
    trials = optuna.create_study(direction="maximize")
    trials.enqueue_trial(model.incumbent)
    picked = search.enqueue_ranked(trials, ranking, settings, count=3)
    assert len(picked) == 3
    for expected in (model.incumbent, *picked):
        assert space.suggest(trials.ask(), settings.search) == expected


def _refused(capsys, code: int, *words: str) -> str:
    """The one error line of a refusal that printed nothing before it (no ranking, no header)."""
    out, err = capsys.readouterr()
    assert code == 2 and out == "", out + err
    assert err.startswith("tuner: error: ") and len(err.strip().splitlines()) == 1, err
    for word in words:
        assert word in err, err
    return err


@pytest.mark.parametrize("where", ["proc", "directory"])
def test_cli_refuses_a_json_it_cannot_write_before_ranking_anything(study, capsys, where):
    target = "/proc/a.json" if where == "proc" else str(study)  # an existing directory
    code = main(["simulate", str(study / "study.yaml"), "--profile", str(study / "profile.csv"),
                 "--json", target])
    _refused(capsys, code, f"--json {target}")


def test_the_command_itself_checks_its_json_before_ranking(study, capsys):
    """Whatever the parser checks: the command refuses the output before the work, on its own."""
    from tuner.cli import build_parser

    args = build_parser().parse_args(["simulate", str(study / "study.yaml"), "--profile",
                                      str(study / "profile.csv"), "--json", str(study)])
    with pytest.raises(OutputError, match=f"^--json {study}: cannot write"):
        args.func(args)
    assert capsys.readouterr().out == ""


def test_cli_refuses_a_profile_measured_on_another_model(study, capsys):
    write_profile(linear_profile(host_ms_per_row=0.1, model="matmul_cpu"), study / "other.csv")
    assert "# model: matmul_cpu" in (study / "other.csv").read_text()
    code = main(["simulate", str(study / "study.yaml"), "--profile", str(study / "other.csv")])
    _refused(capsys, code, str(study / "other.csv"), "matmul_cpu", "encoder_sim")


# (0, 1], as the study's search.capacity.tolerance: 1 is a bracket twice as wide as its lower edge, which
# the study always took (the tests' own quick trials use it) and simulate alone refused
@pytest.mark.parametrize("tolerance", ["5", "1.5", "0"])
def test_cli_refuses_a_tolerance_that_is_not_a_fraction(study, capsys, tolerance):
    code = main(["simulate", str(study / "study.yaml"), "--profile", str(study / "profile.csv"),
                 "--tolerance", tolerance])
    _refused(capsys, code, "--tolerance: must be")


def _own_model(study) -> Path:
    """The study pointed at a copy of encoder_sim (a test may break it, or try to write over it); its
    model directory."""
    import shutil

    template = Path(__file__).resolve().parents[1] / "model_repository_templates" / "encoder_sim"
    shutil.copytree(template, study / "repo" / "encoder_sim")
    text = (study / "study.yaml").read_text()
    (study / "study.yaml").write_text(text.replace(f"model_repository: {template.parent}",
                                                   f"model_repository: {study / 'repo'}"))
    return study / "repo" / "encoder_sim"


@pytest.mark.parametrize("target", ["traffic.csv", "repo/encoder_sim/config.pbtxt", "repo/encoder_sim/1/model.py",
                                    "repo/encoder_sim/1/rank.json"])
@pytest.mark.parametrize("force", [False, True])
def test_cli_never_writes_its_json_over_the_studys_traffic_or_into_its_model(study, capsys, target, force):
    _own_model(study)
    before = (study / target).read_bytes() if (study / target).exists() else None
    code = main(["simulate", str(study / "study.yaml"), "--profile", str(study / "profile.csv"),
                 "--json", str(study / target), *(["--force"] if force else [])])
    _refused(capsys, code, f"--json {study / target}: ", "refusing to write")
    assert ((study / target).read_bytes() if (study / target).exists() else None) == before


def test_cli_replaces_only_a_json_it_wrote_unless_forced(study, capsys):
    mine = study / "notes.json"
    mine.write_text('{"my": "notes"}\n')
    argv = ["simulate", str(study / "study.yaml"), "--profile", str(study / "profile.csv"), "--json", str(mine)]
    _refused(capsys, main(argv), f"--json {mine}: exists and tuner did not write it", "--force")
    assert mine.read_text() == '{"my": "notes"}\n'
    assert main([*argv, "--force"]) == 0
    assert "ranking" in json.loads(mine.read_text())
    mine.write_text(mine.read_text().replace('"scoring"', '"the_scoring"'))  # still a ranking tuner wrote
    assert main(argv) == 0 and '"scoring"' in mine.read_text()


@pytest.mark.parametrize("broken,says", [
    ("preferred", "dynamic batching preferred size must be <= max batch size"),
    ("name", "name 'other' is not its directory's ('encoder_sim')"),
    ("version", "no version directory"),
])
def test_cli_refuses_a_model_that_tune_check_refuses_before_ranking(study, capsys, broken, says):
    import shutil

    model = _own_model(study)
    config = model / "config.pbtxt"
    if broken == "preferred":
        config.write_text(config.read_text().replace("dynamic_batching { }",
                                                     "dynamic_batching { preferred_batch_size: [128] }"))
    elif broken == "name":
        config.write_text(config.read_text().replace('name: "encoder_sim"', 'name: "other"'))
    else:
        shutil.rmtree(model / "1")
    argv = [str(study / "study.yaml")]
    code = main(["tune", *argv, "--check"])
    tune_err = _refused(capsys, code, says)  # what tune --check says, simulate says
    code = main(["simulate", *argv, "--profile", str(study / "profile.csv"), "--json", str(study / "r.json")])
    assert _refused(capsys, code, says) == tune_err
    assert not (study / "r.json").exists()


def test_the_best_line_says_why_the_incumbent_misses_the_sla(study, capsys):
    # the incumbent's batches of up to 64 rows run out of memory at 11x the load; the space's (<= 16) rarely do
    write_profile(linear_profile(host_ms_per_row=0.1, max_length=512, oom_tokens=1000, oom_ms=0.5),
                  study / "profile.csv")
    out_json = study / "ranking.json"
    code = main(["simulate", str(study / "study.yaml"), "--profile", str(study / "profile.csv"), "--speed", "11",
                 "--json", str(out_json)])
    out = capsys.readouterr().out
    assert code == 0, out
    incumbent = next(r for r in json.loads(out_json.read_text())["ranking"] if "incumbent" in r["tag"])
    assert incumbent["sla_reason"].startswith("error rate")
    best = next(line for line in out.splitlines() if line.startswith("best: "))
    assert best.endswith(f"(the incumbent misses the SLA: {incumbent['sla_reason']})"), best


def test_quiet_draws_no_progress_bar_and_still_prints_the_ranking_and_notes(study, capsys):
    argv = ["simulate", str(study / "study.yaml"), "--profile", str(study / "profile.csv"), "--grid", "--top", "3"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "\r" in err and "simulate:" in err  # the bar, drawn to a stderr that is no terminal
    assert main([*argv, "--quiet"]) == 0
    quiet_out, quiet_err = capsys.readouterr()
    assert "\r" not in quiet_err and "simulate:" not in quiet_err and "config/s" not in quiet_err, quiet_err
    assert quiet_out == out and "best:" in quiet_out  # the ranking as without it
    assert quiet_err.startswith("note: the profile timed") and err.startswith(quiet_err)  # its notes too
