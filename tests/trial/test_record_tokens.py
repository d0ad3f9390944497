"""A generative model's trial record: its token measurement checked (TTFT, TPOT), scored in output tokens
per dollar both ways, kept as Figures, and through Optuna's attributes and back (pure)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

from tuner.measurement_tokens import measure_tokens
from tuner.score import check_tokens
from tuner.settings import CapacitySettings, SlaSettings
from tuner.trial.capacity import find_capacity
from tuner.trial.record import TOKENS, Figures, assess, from_attrs, to_attrs

PRICE = 3.6  # $/h: a token per second is 1,000 tokens per dollar


def replay_at(speed: float, *, n: int = 40, tokens: int = 11) -> pd.DataFrame:
    """Records of `n` requests a second apart (at speed 1) whose first token takes 50 ms x speed and whose
    tokens come every 10 ms x speed: a server that slows with the load."""
    due = np.arange(n) / speed
    first = due + 0.05 * speed
    last = first + (tokens - 1) * 0.01 * speed
    return pd.DataFrame({"row": np.arange(n), "due_s": due, "send_s": due, "end_s": last + 0.001, "send_lag_ms": 0.1,
                         "ok": True, "error": "", "prompt_tokens": 100, "output_tokens": tokens, "tokens": tokens,
                         "first_token_s": first, "last_token_s": last,
                         "itl_ms": [np.full(tokens - 1, 10.0 * speed)] * n})


def measured(speed: float):
    return measure_tokens(replay_at(speed), speed=speed, warmup_s=0.0, lag_budget_ms=5.0, ttft_ms=200.0)


SLA = SlaSettings(ttft_ms=200.0, tpot_ms=30.0, percentile=99.0, max_error_rate=0.0)


def test_the_token_check_reads_ttft_and_tpot_at_the_percentile():
    ok, broken = check_tokens(measured(1.0), SLA), check_tokens(measured(5.0), SLA)
    assert ok.ok and ok.latency_ms == pytest.approx(50.0) and ok.violation == pytest.approx(max(50 / 200, 10 / 30) - 1)
    # at 5x: TTFT 250 ms > 200, TPOT 50 ms > 30: the worse, relative to its limit, is the violation
    assert not broken.ok and broken.violation == pytest.approx(50 / 30 - 1)
    assert "p99 TTFT 250.0 ms > 200 ms" in broken.reason and "p99 TPOT 50.0 ms > 30 ms" in broken.reason


def test_a_generative_trial_is_scored_in_output_tokens_per_dollar_and_survives_the_storage():
    def capacity(lower):
        return find_capacity(measured, SLA, CapacitySettings(start_speed=2.0, tolerance=0.05, max_speed=16, max_steps=8),
                             lower=lower, check=check_tokens, rate=1.0)

    load = measured(1.0)
    record = assess({"max_num_seqs": 8}, load, SLA, capacity=capacity, price_per_hour=PRICE, load_speed=1.0,
                    peak_rps=1.0, scoring=TOKENS)
    assert record.meets_sla and record.unit == "tokens" and record.at_load.generative
    # TPOT 10 ms x speed breaks 30 ms above speed 3: the capacity lies just below
    assert 2.8 <= record.capacity.speed <= 3.0 and record.capacity.upper_speed <= 3.2
    at_cap = record.capacity.at_capacity
    assert at_cap.ttft_ms["p99"] == pytest.approx(50.0 * at_cap.speed, rel=1e-6)
    # capacity: the output tokens per second at capacity, per dollar of a dedicated server
    assert record.scores["capacity"] == pytest.approx(at_cap.output_tokens_per_s * 3600 / PRICE)
    # utilization: output tokens over the price of the busy seconds (each request's 151 ms span at speed 1)
    assert record.scores["utilization"] == pytest.approx(load.output_tokens / (40 * 0.151 * PRICE / 3600), rel=1e-3)
    assert len(record.latencies_ms) == 40  # the TTFTs at capacity, for the report's CDF
    back = from_attrs(to_attrs(record))
    assert back.unit == "tokens" and back.scores == record.scores
    assert back.at_load.ttft_ms == record.at_load.ttft_ms and back.at_load.tpot_ms == record.at_load.tpot_ms
    assert back.capacity.at_capacity.output_tokens_per_s == pytest.approx(at_cap.output_tokens_per_s)
    assert back.at_load.latency_ms == record.at_load.latency_ms  # end to end


def test_the_engines_batching_is_kept_at_the_load_and_at_capacity_and_survives_the_storage():
    engine = {"preemptions": 4.0, "running_peak": 16.0, "waiting_peak": 3.0, "kv_cache_peak": 0.91,
              "emulated_overrun_share": math.nan}

    def watched(speed: float):  # as tuner.trial.generate's probe returns it: the replay, the engine beside it
        return dataclasses.replace(measured(speed), engine={**engine, "preemptions": 4.0 * speed})

    def capacity(lower):
        return find_capacity(watched, SLA, CapacitySettings(start_speed=2.0, tolerance=0.05, max_speed=16, max_steps=8),
                             lower=lower, check=check_tokens, rate=1.0)

    record = assess({"max_num_seqs": 8}, watched(1.0), SLA, capacity=capacity, price_per_hour=PRICE, load_speed=1.0,
                    peak_rps=1.0, scoring=TOKENS)
    attrs = to_attrs(record)
    assert attrs["kv_cache_peak"] == 0.91 and attrs["preemptions"] == 4.0 and attrs["running_peak"] == 16.0
    assert attrs["capacity_preemptions"] == pytest.approx(4.0 * record.capacity.speed)
    assert attrs["emulated_overrun_share"] is None  # NaN (a real engine) is stored as not measured
    back = from_attrs(attrs)
    assert back.at_load.kv_cache_peak == 0.91 and back.at_load.waiting_peak == 3.0
    assert back.capacity.at_capacity.preemptions == pytest.approx(4.0 * record.capacity.speed)
    # a replay nobody watched (the engine's metrics unread) keeps none of them
    plain = Figures.of_tokens(measured(1.0))
    assert plain.kv_cache_peak is None and plain.preemptions is None
