"""The re-measurement as the study stores it (`tuner.search._results`): each repeat's own range of
requests per dollar beside the medians, and counts kept as whole numbers a repeat had (pure)."""

from __future__ import annotations

import dataclasses

import pytest

from tuner import search
from tuner.score import capacity_score
from tuner.trial import Bracket, Figures, TrialRecord

PRICE = 3.4  # $/h: the quick start's, 1,058.8 requests per dollar for each request per second
PARAMS = {"max_batch_size": 64, "max_queue_delay_microseconds": 0}


def repeat(lower: float, upper: float | None, *, peak: float, servers: int, steps: int) -> TrialRecord:
    """One re-measurement of the incumbent whose capacity search ended between `lower` and `upper` req/s."""
    return TrialRecord(params=dict(PARAMS), at_load=Figures(requests=600, latency_ms={"p99": 20.0}),
                       sla_met=True, violation=-0.3,
                       capacity=Bracket(rps=lower, speed=lower / 10.0, upper_rps=upper, steps=steps,
                                        converged=upper is not None, peak_rps=peak),
                       scores={"capacity": capacity_score(lower, PRICE), "utilization": 5000.0 + lower},
                       servers_needed=servers, monthly_cost=servers * PRICE * 730.0, price_per_hour=PRICE)


# the auditor's quick start: the incumbent's two repeats, brackets 17.27-18.83 and 18.83-21.47 req/s
FIRST = repeat(17.27, 18.83, peak=331.0, servers=1, steps=4)
SECOND = repeat(18.83, 21.47, peak=334.0, servers=2, steps=5)


def test_each_repeat_keeps_its_own_range_from_its_score_to_its_first_failing_speed():
    stored = search.repeats_as_dict(search.Repeats(PARAMS, 0, True, (FIRST, SECOND), "capacity"))
    low, high = capacity_score(17.27, PRICE), capacity_score(18.83, PRICE)
    assert stored["values"] == pytest.approx([low, high])
    # the second repeat's capacity may reach 21.47 req/s: its own first failing speed, not the medians' 20.15
    assert stored["ranges"] == [pytest.approx([low, capacity_score(18.83, PRICE)]),
                                pytest.approx([high, capacity_score(21.47, PRICE)])]
    assert stored["attrs"]["capacity_upper_rps"] == pytest.approx((18.83 + 21.47) / 2)  # the old keys stay
    # under utilization scoring a repeat is its score alone; a repeat that missed the SLA has no range
    missed = dataclasses.replace(SECOND, sla_met=False)
    util = search.repeats_as_dict(search.Repeats(PARAMS, 0, True, (FIRST, missed), "utilization"))
    assert util["ranges"] == [pytest.approx([5017.27, 5017.27]), None]
    # an open bracket (no speed failed) tells nothing above the score
    open_ended = repeat(25.0, None, peak=400.0, servers=1, steps=6)
    assert search.repeats_as_dict(search.Repeats(PARAMS, 0, True, (open_ended,), "capacity"))["ranges"] == [
        pytest.approx([capacity_score(25.0, PRICE)] * 2)]


def test_counts_stay_whole_numbers_a_repeat_had():
    attrs = search.repeats_as_dict(search.Repeats(PARAMS, 0, True, (FIRST, SECOND), "capacity"))["attrs"]
    # the median of 1 and 2 servers, 4 and 5 steps, 331 and 334 requests in the busiest second would be
    # 1.5, 4.5 and 332.5: figures no run produced
    assert attrs["servers_needed"] == 1 and isinstance(attrs["servers_needed"], int)
    assert attrs["capacity_steps"] == 4 and isinstance(attrs["capacity_steps"], int)
    assert attrs["requests"] == 600 and isinstance(attrs["requests"], int)
    assert attrs["capacity_peak_rps"] == 331.0
    assert attrs["monthly_cost"] == pytest.approx(PRICE * 730.0)  # the cost of the servers kept, 1
    assert attrs["capacity_rps"] == pytest.approx((17.27 + 18.83) / 2)  # a measured rate is still the median


def test_a_bracket_keeps_its_repeats_converged_flag_and_limit():
    """Reviewer V3/U5: the flags and words of a bracket were dropped (not numbers), so a re-measured
    bracket read as not converged and lost the load generator's limit."""
    limited = dataclasses.replace(SECOND, capacity=dataclasses.replace(SECOND.capacity, limited_by="load_generator"))
    attrs = search.repeats_as_dict(search.Repeats(PARAMS, 0, True, (FIRST, limited, limited), "capacity"))["attrs"]
    assert attrs["capacity_converged"] is True and attrs["capacity_limited_by"] == "load_generator"
    # as a count's median: a flag two repeats split is the lower middle one (False); a limit one met is kept
    open_ended = repeat(25.0, None, peak=400.0, servers=1, steps=6)
    attrs = search.repeats_as_dict(search.Repeats(PARAMS, 0, True, (FIRST, open_ended), "capacity"))["attrs"]
    assert attrs["capacity_converged"] is False
    attrs = search.repeats_as_dict(search.Repeats(PARAMS, 0, True, (FIRST, limited), "capacity"))["attrs"]
    assert attrs["capacity_limited_by"] == "load_generator"


def test_an_interrupted_trial_is_counted_as_interrupted_not_failed():
    from optuna.trial import TrialState, create_trial

    def trial(state, **attrs):
        return create_trial(state=state, value=1.0 if state == TrialState.COMPLETE else None, user_attrs=attrs)

    trials = [trial(TrialState.COMPLETE), trial(TrialState.FAIL, error_kind="interrupted"),
              trial(TrialState.FAIL, error_kind="duplicate"), trial(TrialState.FAIL, error_kind="config"),
              trial(TrialState.FAIL, outcome="unstable")]
    counts = search.tally(trials)
    assert (counts["interrupted"], counts["duplicate"], counts["failed"], counts["unstable"]) == (1, 1, 1, 1)
    assert counts["total"] == 5
