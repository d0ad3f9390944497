"""The SLA check of one measurement and the two scores, with the servers a peak needs and their bill
(pure; the capacity search that uses the SLA check is tests/trial/test_capacity.py)."""

from __future__ import annotations

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
