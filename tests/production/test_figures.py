"""The production figures from counter increases (tuner/production/_figures.py): pure arithmetic on
a hand-made frame whose answers are worked out here."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tuner.production._figures import (
    COLUMNS,
    SECONDS,
    by_instance,
    by_step,
    hours_under,
    recoverable_per_month,
    throughput_ratio,
    total,
)


def increases(rows: list[tuple]) -> pd.DataFrame:
    """(end, instance, succeeded, failed, inferences, executions, queue_us, compute_us[, seconds served])
    rows: a row without its seconds served the whole hour."""
    rows = [row if len(row) == 9 else (*row, 3600.0) for row in rows]
    frame = pd.DataFrame(rows, columns=["end", "instance", *COLUMNS, SECONDS])
    frame["end"] = pd.to_datetime(frame["end"], utc=True)
    return frame.set_index(["end", "instance"])


# two hours; in the second, instance b had no samples (a gap of its own)
FRAME = increases(
    [
        ("2026-01-01 01:00", "a", 3600, 0, 3600, 360, 3600 * 2000, 3600 * 5000),  # 1 req/s, batch 10
        ("2026-01-01 01:00", "b", 7200, 8, 7200, 360, 7200 * 1000, 7200 * 5000),  # 2 req/s, batch 20
        ("2026-01-01 02:00", "a", 36000, 0, 36000, 1125, 36000 * 3000, 0),  # 10 req/s, batch 32
    ]
)


def test_each_step_sums_its_instances_and_is_labelled_by_its_start():
    steps = by_step(FRAME, step_s=3600, max_batch_size=32, capacity_rps=5.0)
    assert list(steps.index) == list(pd.to_datetime(["2026-01-01 00:00", "2026-01-01 01:00"], utc=True))
    first, second = steps.iloc[0], steps.iloc[1]
    assert first["throughput_rps"] == 3 and first["replicas"] == 2 and first["per_replica_rps"] == 1.5
    assert first["mean_batch"] == pytest.approx(10800 / 720) and first["fill_rate"] == pytest.approx(
        10800 / 720 / 32
    )
    assert first["queue_ms"] == pytest.approx((3600 * 2 + 7200 * 1) / 10800)
    assert first["error_rate"] == pytest.approx(8 / 10808) and first["ratio"] == pytest.approx(0.3)
    assert second["replicas"] == 1 and second["per_replica_rps"] == 10 and second["ratio"] == 2
    assert second["fill_rate"] == 1.0 and second["compute_ms"] == 0


def test_the_window_counts_the_time_with_samples_and_each_replicas_own():
    f = total(FRAME, max_batch_size=32)
    assert f.seconds == 7200 and f.replicas == 1.5  # 3 replica-hours over 2 hours
    assert f.throughput_rps == pytest.approx(46800 / 7200) and f.per_replica_rps == pytest.approx(
        46800 / 10800
    )
    assert f.mean_batch == pytest.approx(46800 / 1845) and f.fill_rate == pytest.approx(46800 / 1845 / 32)
    assert f.error_rate == pytest.approx(8 / 46808)


def test_a_replica_that_served_part_of_an_hour_is_divided_by_that_part():
    # b started at 00:36 (a scale-up): 24 minutes at 2 req/s; a served the whole hour at 2 req/s too
    frame = increases([("2026-01-01 01:00", "a", 7200, 0, 7200, 720, 0, 0),
                       ("2026-01-01 01:00", "b", 2880, 0, 2880, 288, 0, 0, 1440.0)])
    step = by_step(frame, step_s=3600, max_batch_size=32).iloc[0]
    assert step["per_replica_rps"] == pytest.approx(10080 / 5040) == 2.0  # not 10080 / 7200 = 1.4
    assert step["replicas"] == pytest.approx(1.4) and step["throughput_rps"] == pytest.approx(2.8)
    assert by_instance(frame, max_batch_size=32).loc["b", "throughput_rps"] == pytest.approx(2.0)
    f = total(frame, max_batch_size=32)
    assert f.seconds == 3600 and f.per_replica_rps == pytest.approx(2.0) and f.replicas == pytest.approx(1.4)


def test_each_instance_over_its_own_steps():
    inst = by_instance(FRAME, max_batch_size=32)
    assert inst.loc["a", "seconds"] == 7200 and inst.loc["a", "throughput_rps"] == pytest.approx(39600 / 7200)
    assert inst.loc["b", "seconds"] == 3600 and inst.loc["b", "mean_batch"] == 20


def test_no_requests_give_no_ratio_of_them_and_no_samples_give_nothing():
    quiet = increases([("2026-01-01 01:00", "a", 0, 0, 0, 0, 0, 0)])
    f = total(quiet, max_batch_size=32)
    assert f.throughput_rps == 0 and f.seconds == 3600
    assert f.mean_batch is None and f.fill_rate is None and f.queue_ms is None and f.error_rate is None
    empty = total(quiet.iloc[:0], max_batch_size=32)
    assert empty.seconds == 0 and empty.fill_rate is None


def test_a_model_without_batching_has_no_fill_rate():
    assert total(FRAME, max_batch_size=0).fill_rate is None
    assert by_step(FRAME, step_s=3600, max_batch_size=0)["fill_rate"].isna().all()


def test_without_a_baseline_no_step_has_a_ratio():
    assert by_step(FRAME, step_s=3600, max_batch_size=32)["ratio"].isna().all()


def test_the_hours_under_a_threshold_leave_out_those_without_a_value():
    values = pd.Series([0.4, 0.5, np.nan, 0.49], index=list("abcd"))
    assert hours_under(values, 0.5) == ["a", "d"]


def test_the_ratio_and_the_recoverable_budget():
    assert throughput_ratio(45.0, 100.0) == 0.45
    assert recoverable_per_month(0.45, replicas=4, price_per_hour=2.0) == pytest.approx(0.55 * 4 * 2 * 730)
    assert recoverable_per_month(1.2, replicas=4, price_per_hour=2.0) == 0.0
