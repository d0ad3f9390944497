"""measure(): percentiles, window, validity and Triton statistics deltas, on hand-made records."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from tuner.measurement import Measurement, measure


def records(n: int = 1000, rate: float = 100.0, latency_ms=None, lag_ms=None, ok=None) -> pd.DataFrame:
    due = np.arange(n) / rate
    latency = np.full(n, 10.0) if latency_ms is None else np.asarray(latency_ms, dtype=float)
    lag = np.full(n, 0.1) if lag_ms is None else np.asarray(lag_ms, dtype=float)
    return pd.DataFrame({
        "row": np.arange(n), "due_s": due, "send_s": due + lag / 1000, "end_s": due + latency / 1000,
        "latency_ms": latency, "send_lag_ms": lag,
        "ok": np.ones(n, dtype=bool) if ok is None else np.asarray(ok, dtype=bool),
        "error": "", "worker": 0,
    })


def stats(inferences: int, executions: int, batches: dict[int, int], queue_ns: int = 0,
          ns_per_execution: int = 1_000_000) -> dict:
    """A model entry of Triton's statistics, as `v2/models/<m>/stats` gives it."""
    def pair(count, ns):
        return {"count": count, "ns": ns}

    return {
        "name": "m", "version": "1", "inference_count": inferences, "execution_count": executions,
        "inference_stats": {"success": pair(inferences, 0), "queue": pair(inferences, queue_ns),
                            "compute_infer": pair(inferences, 10**12)},  # per request: not busy time
        "batch_stats": [
            {"batch_size": size, "compute_input": pair(count, 0),
             "compute_infer": pair(count, count * ns_per_execution), "compute_output": pair(count, 0)}
            for size, count in batches.items()
        ],
    }


def run(recs, before=None, after=None, **kw) -> Measurement:
    args = dict(speed=1.0, warmup_s=2.0, lag_budget_ms=2.0, max_batch_size=8)
    args.update(kw)
    return measure(recs, before, after, **args)


def test_latency_percentiles_come_from_the_measured_window_only():
    n = 1000  # 10 s at 100 req/s; the first 2 s are warm-up with huge latencies
    latency = np.where(np.arange(n) < 200, 5000.0, np.arange(n) % 100 + 1.0)
    m = run(records(n, latency_ms=latency))
    assert m.requests == 800
    assert m.duration_s == pytest.approx(9.99 - 2.0)
    assert m.offered_rps == pytest.approx(800 / 7.99)
    assert m.latency_ms["max"] == 100.0
    assert m.latency_ms["p50"] == pytest.approx(np.percentile(latency[200:], 50))
    assert m.latency_ms["p99"] == pytest.approx(np.percentile(latency[200:], 99))
    assert set(m.latency_ms) == {"p50", "p90", "p95", "p99", "max"}
    assert m.latency(99) == m.latency_ms["p99"]


def test_an_sla_percentile_outside_the_usual_ones_is_added():
    m = run(records(), sla_percentile=99.9)
    assert "p99.9" in m.latency_ms and m.latency(99.9) == pytest.approx(10.0)


def test_errors_are_counted_and_kept_out_of_latency():
    n = 1000
    ok = np.arange(n) % 10 != 0
    latency = np.where(ok, 10.0, 30_000.0)  # failures that timed out
    recs = records(n, latency_ms=latency, ok=ok)
    recs.loc[0, "error"] = "HTTP 400: in the warm-up"  # before the measured window: not this one's
    recs.loc[~ok & (recs["due_s"] >= 2.0), "error"] = "HTTP 400: unexpected shape for input 'INPUT_IDS'"
    m = run(recs)
    assert m.errors == 80 and m.error_rate == pytest.approx(0.1)
    assert m.first_error == "HTTP 400: unexpected shape for input 'INPUT_IDS'"  # what `tuner replay` prints
    assert run(records()).first_error == ""
    from tuner.cli.replay_cmd import format_measurement

    assert "errors          80 (10.00%); the first: HTTP 400: unexpected shape" in format_measurement(m)
    assert m.latency_ms["max"] == 10.0
    assert m.throughput_rps == pytest.approx(720 / (9.99 + 0.01 - 2.0))


def test_throughput_falls_below_the_offered_rate_when_the_server_falls_behind():
    n = 1000
    latency = np.arange(n) * 5.0  # each response 5 ms later than the last: a growing backlog
    m = run(records(n, latency_ms=latency))
    assert m.throughput_rps < 0.7 * m.offered_rps


def test_send_lag_over_budget_makes_the_measurement_invalid():
    lag = np.full(1000, 0.2)
    lag[-20:] = 9.0
    m = run(records(lag_ms=lag))
    assert not m.valid and "send lag p99" in m.invalid_reason
    assert m.send_lag_ms["p50"] == pytest.approx(0.2)
    assert run(records()).valid
    # a server that failed every request it was sent missed the SLA, whatever the lag: not a load generator's
    # bottleneck to measure again (three more replays of a hung server, each to its request timeout)
    failing = records(lag_ms=lag, ok=np.zeros(1000, dtype=bool)).assign(error="timed out")
    dead = run(failing)
    assert dead.valid and dead.error_rate == 1.0 and dead.send_lag_ms["p99"] > 2.0
    # ... unless the load generator did not send them: then the lag says why
    unsent = run(failing.assign(error="not sent: 4 requests already in flight (replay.max_in_flight)"))
    assert not unsent.valid and "send lag p99" in unsent.invalid_reason


def test_a_schedule_shorter_than_the_warmup_is_invalid_not_a_crash():
    m = run(records(100), warmup_s=5.0)
    assert m.requests == 0 and not m.valid and "no requests" in m.invalid_reason
    assert math.isnan(m.latency_ms["p99"]) and m.throughput_rps == 0.0


def test_statistics_deltas_give_counts_fill_rate_histogram_and_busy_time():
    before = stats(100, 50, {1: 20, 2: 30}, queue_ns=5_000_000)
    after = stats(100 + 800, 50 + 200, {1: 20, 2: 30 + 50, 4: 100, 6: 50}, queue_ns=5_000_000 + 800 * 2_000_000)
    m = run(records(), before, after)
    assert m.inference_count == 800 and m.execution_count == 200
    assert m.mean_batch_size == 4.0 and m.fill_rate == 0.5
    assert m.batch_histogram == {2: 50, 4: 100, 6: 50}
    assert m.queue_ms_mean == pytest.approx(2.0)
    # busy time is per execution (batch_stats), not the per-request inference_stats.compute_infer
    assert m.busy_s == pytest.approx(200 * 0.001)
    assert m.compute_ms_mean == pytest.approx(1.0)


def test_busy_time_of_instances_running_at_once_is_at_most_the_wall_time():
    # two instances, each busy most of a 10-s replay: Triton sums their executions to 14.5 s; the device
    # was busy at most the 10 s they ran in (the utilization score charges that time)
    recs = records()
    after = stats(1000, 500, {2: 500}, ns_per_execution=29_000_000)
    m = run(recs, None, after)
    assert m.busy_s == pytest.approx(float(recs["end_s"].max()))
    assert m.compute_ms_mean == pytest.approx(29.0)  # per execution: as Triton timed it


def test_statistics_in_grpc_json_form_and_wrapped_in_model_stats():
    after = stats(10, 5, {2: 5})
    stringly = {"model_stats": [{
        **after, "inference_count": "10", "execution_count": "5",
        "batch_stats": [{"batch_size": "2", "compute_infer": {"count": "5", "ns": "5000000"}}],
    }]}
    m = run(records(), None, stringly)
    assert m.inference_count == 10 and m.execution_count == 5 and m.batch_histogram == {2: 5}
    assert m.busy_s == pytest.approx(0.005)


def test_load_generator_figures_are_passed_through():
    m = run(records(), load_generator_cpu=0.4, workers=3)
    assert m.load_generator_cpu == 0.4 and m.workers == 3


def test_the_mean_batch_is_the_histograms_when_executions_failed():
    """Triton counts a failed execution in execution_count and batch_stats, but not its rows in
    inference_count: the mean batch and fill rate come from the histogram alone (at least 1 per
    execution), and the replay's table says so, one line per figure (a reviewer's figures: 58 rows in 33
    executions, 15 of them succeeded)."""
    from tuner.cli.replay_cmd import format_measurement

    recs = records(58, ok=np.arange(58) >= 43)
    recs.loc[:42, "error"] = ("Failed to process the request(s) for model 'm_0_0', message: TritonModelException: "
                              "odd length 3\n\nAt:\n  /tmp/tuner-triton-x/models/m/1/model.py(21): execute\n")
    m = run(recs, stats(0, 0, {}), stats(15, 33, {1: 18, 2: 7, 3: 6, 4: 2}), warmup_s=0.0, max_batch_size=16)
    assert m.mean_batch_size == pytest.approx(58 / 33) and m.fill_rate == pytest.approx(58 / 33 / 16)
    table = format_measurement(m)
    assert "executions      33 for 58 rows, 15 of them succeeded (Triton's inference_count)" in table
    assert "batch size      mean 1.76 of max 16 (fill rate 0.11)" in table
    assert "histogram       1:18 2:7 3:6 4:2" in table
    errors = [line for line in table.splitlines() if line.startswith("errors")]
    assert errors == ["errors          43 (74.14%); the first: Failed to process the request(s) for model 'm_0_0', "
                      "message: TritonModelException: odd length 3"], table
    assert "At:" not in table and len(table.splitlines()) == 12
