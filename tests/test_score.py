"""The SLA check of one measurement and the two scores, with the servers a peak needs and their bill
(pure; the capacity search that uses the SLA check is tests/trial/test_capacity.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from support import measurement

from tuner.score import capacity_score, check_sla, monthly_cost, servers_needed, utilization_score
from tuner.settings import SlaSettings

SLA = SlaSettings(latency_ms=100.0, percentile=99.0, max_error_rate=0.01)


def test_sla_check_reports_the_worse_limit_relative_to_it():
    ok = check_sla(measurement(1.0, p99=50.0), SLA)
    assert ok.ok and ok.violation == pytest.approx(-0.5) and ok.reason == ""
    slow = check_sla(measurement(1.0, p99=150.0), SLA)
    assert not slow.ok and slow.violation == pytest.approx(0.5) and "p99 150.0 ms > 100 ms" in slow.reason
    failing = check_sla(measurement(1.0, p99=50.0, errors=30), SLA)
    assert not failing.ok and failing.violation == pytest.approx(2.0) and "error rate" in failing.reason
    strict = SlaSettings(latency_ms=100.0, max_error_rate=0.0)
    assert not check_sla(measurement(1.0, errors=1), strict).ok
    assert check_sla(measurement(1.0, errors=0), strict).ok


def test_sla_check_uses_the_percentile_asked_for():
    assert check_sla(measurement(1.0, p99=120.0), SlaSettings(latency_ms=100.0, percentile=50)).ok
    with pytest.raises(KeyError):
        check_sla(measurement(1.0), SlaSettings(latency_ms=100.0, percentile=99.9))
    # an SLA on the slowest request reads it as "max", the one name of that figure everywhere (not "p100")
    slowest = check_sla(measurement(1.0, p99=60.0), SlaSettings(latency_ms=100.0, percentile=100))
    assert not slowest.ok and slowest.reason == "max 120.0 ms > 100 ms"


def test_scores_servers_and_monthly_bill():
    assert capacity_score(100.0, 0.5) == pytest.approx(720_000.0)
    m = measurement(1.0, errors=10, busy_s=2.0)  # 990 served in 2 busy seconds
    assert utilization_score(m, 3.6) == pytest.approx(990 / (2.0 * 3.6 / 3600))
    assert utilization_score(measurement(1.0, busy_s=0.0), 1.0) is None
    assert servers_needed(250.0, 100.0) == 3
    assert servers_needed(200.0, 100.0) == 2
    assert servers_needed(10.0, 100.0) == 1
    assert servers_needed(10.0, 0.0) is None
    assert monthly_cost(3, 1.0) == pytest.approx(2190.0)
    assert monthly_cost(None, 1.0) is None


# --- a generative model: the token SLA and tokens per dollar ---------------------------------------

TOKEN_SLA = SlaSettings(ttft_ms=500.0, tpot_ms=50.0, percentile=99.0, max_error_rate=0.01)


def test_the_token_sla_holds_each_limit_it_sets():
    from tuner.score import check_token_sla
    ok = check_token_sla(ttft_ms=250.0, tpot_ms=40.0, error_rate=0.0, sla=TOKEN_SLA)
    assert ok.ok and ok.violation == pytest.approx(-0.2) and ok.reason == ""
    slow_first = check_token_sla(ttft_ms=750.0, tpot_ms=40.0, error_rate=0.0, sla=TOKEN_SLA)
    assert not slow_first.ok and slow_first.violation == pytest.approx(0.5)
    assert slow_first.reason == "p99 TTFT 750.0 ms > 500 ms"
    slow_tokens = check_token_sla(ttft_ms=100.0, tpot_ms=60.0, error_rate=0.02, sla=TOKEN_SLA)
    assert not slow_tokens.ok and slow_tokens.violation == pytest.approx(1.0)
    assert slow_tokens.reason == "p99 TPOT 60.0 ms > 50 ms; error rate 2.00% > 1.00%"
    ttft_only = SlaSettings(ttft_ms=500.0)
    assert check_token_sla(ttft_ms=400.0, tpot_ms=None, error_rate=0.0, sla=ttft_only).ok  # TPOT not limited
    none = check_token_sla(ttft_ms=None, tpot_ms=None, error_rate=0.0, sla=ttft_only)
    assert not none.ok and none.violation == float("inf") and "TTFT none measured" in none.reason
    with pytest.raises(ValueError, match="needs sla.ttft_ms, sla.tpot_ms or sla.e2e_ms"):
        check_token_sla(ttft_ms=1.0, tpot_ms=1.0, error_rate=0.0, sla=SlaSettings())


def test_the_token_sla_holds_an_end_to_end_limit_beside_the_others():
    from tuner.score import check_token_sla
    e2e_only = SlaSettings(e2e_ms=2000.0)
    ok = check_token_sla(ttft_ms=900.0, tpot_ms=80.0, e2e_ms=1500.0, error_rate=0.0, sla=e2e_only)
    assert ok.ok and ok.violation == pytest.approx(-0.25) and ok.e2e_ms == 1500.0  # TTFT, TPOT not limited
    late = check_token_sla(ttft_ms=10.0, tpot_ms=1.0, e2e_ms=3000.0, error_rate=0.0, sla=e2e_only)
    assert not late.ok and late.violation == pytest.approx(0.5) and late.reason == "p99 end to end 3000.0 ms > 2000 ms"
    both = SlaSettings(ttft_ms=500.0, e2e_ms=2000.0)
    slow_first = check_token_sla(ttft_ms=600.0, tpot_ms=None, e2e_ms=1000.0, error_rate=0.0, sla=both)
    assert not slow_first.ok and slow_first.violation == pytest.approx(0.2)
    none = check_token_sla(ttft_ms=None, tpot_ms=None, error_rate=0.0, sla=e2e_only)  # no token came back
    assert not none.ok and "end to end none measured" in none.reason


def test_tokens_per_dollar_at_capacity_and_at_the_recorded_load():
    from tuner.score import tokens_per_dollar_at_capacity, tokens_per_dollar_at_load
    # 100 output tokens/s for an hour at $2/h: 180000 per dollar; with 300 prompt tokens/s, 720000 in all
    at_capacity = tokens_per_dollar_at_capacity(output_tokens_per_s=100.0, prompt_tokens_per_s=300.0,
                                                price_per_hour=2.0)
    assert at_capacity.output == pytest.approx(180_000) and at_capacity.total == pytest.approx(720_000)
    # 9000 output tokens over 90 busy seconds at $4/h: $0.1 -> 90000 per dollar
    at_load = tokens_per_dollar_at_load(output_tokens=9000, prompt_tokens=1000, busy_s=90.0, price_per_hour=4.0)
    assert at_load.output == pytest.approx(90_000) and at_load.total == pytest.approx(100_000)
    idle = tokens_per_dollar_at_load(output_tokens=9000, prompt_tokens=0, busy_s=0.0, price_per_hour=4.0)
    assert idle.output is None and idle.total is None


def test_a_window_of_one_token_requests_meets_the_tpot_limit_as_goodput_counts_it():
    # one rule for both: a one-token request has no TPOT and meets that limit (tuner.measurement_tokens)
    from tuner.measurement_tokens import measure_tokens
    from tuner.score import check_token_sla, check_tokens
    due = np.linspace(1.0, 10.0, 50)
    records = pd.DataFrame({"due_s": due, "end_s": due + 0.2, "send_lag_ms": 0.0, "ok": True, "prompt_tokens": 100,
                            "tokens": 1, "output_tokens": 1, "first_token_s": due + 0.2, "last_token_s": due + 0.2,
                            "itl_ms": [np.empty(0)] * 50})
    sla = SlaSettings(ttft_ms=1000.0, tpot_ms=100.0)
    m = measure_tokens(records, speed=1.0, warmup_s=0.0, lag_budget_ms=50.0, ttft_ms=1000.0, tpot_ms=100.0)
    assert m.good_requests == m.requests == 50
    check = check_tokens(m, sla)
    assert check.ok and check.violation == pytest.approx(0.2 - 1.0)  # TTFT's: 200 of 1000 ms
    assert check.reason == "p99 TPOT none: no request of 2+ tokens"
    only_tpot = check_tokens(m, SlaSettings(tpot_ms=100.0))
    assert only_tpot.ok and only_tpot.violation < 0
    slow = check_tokens(m, SlaSettings(ttft_ms=100.0, tpot_ms=100.0))  # the TTFT limit still holds them
    assert not slow.ok and slow.reason == "p99 TTFT 200.0 ms > 100 ms; p99 TPOT none: no request of 2+ tokens"
    # nothing served: no token came back, every limit broken
    failed = check_tokens(dataclasses.replace(m, errors=50, error_rate=1.0), sla)
    assert not failed.ok and "TPOT none measured > 100 ms" in failed.reason
    # told nothing of the requests, a TPOT of none is still broken
    assert not check_token_sla(ttft_ms=200.0, tpot_ms=None, error_rate=0.0, sla=sla).ok
