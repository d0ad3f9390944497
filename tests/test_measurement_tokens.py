"""tuner.measurement_tokens: a generative replay's figures from its records, against hand-worked values."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

from tuner.measurement_tokens import RECORD_COLUMNS, TokenMeasurement, measure_tokens


def record(due: float, *, first: float, tokens: int, gap: float, prompt: int = 10, ok: bool = True,
           lag: float = 0.1) -> dict:
    """One request streamed `tokens` tokens, the first at `first` s after its due time, then one every `gap` s."""
    times = due + first + np.arange(tokens) * gap
    return {"row": 0, "due_s": due, "send_s": due + lag / 1000, "end_s": times[-1] + 0.001, "send_lag_ms": lag,
            "ok": ok, "error": "" if ok else "boom", "prompt_tokens": prompt, "output_tokens": tokens,
            "tokens": tokens, "first_token_s": times[0], "last_token_s": times[-1],
            "itl_ms": np.diff(times) * 1000}


def frame(rows: list[dict]) -> pd.DataFrame:
    out = pd.DataFrame(rows)
    out["row"] = np.arange(len(out))
    return out


def test_ttft_tpot_itl_e2e_and_tokens_per_second():
    rows = [record(0.0, first=9.0, tokens=3, gap=1.0)]  # in the warm-up: left out
    rows += [record(1.0 + k, first=0.1 * (k + 1), tokens=11, gap=0.02 * (k + 1), prompt=100) for k in range(4)]
    rows += [record(5.0, first=0.05, tokens=1, gap=0.0, prompt=40)]  # one token: no TPOT, no ITL
    rows += [record(5.5, first=0.05, tokens=4, gap=0.01, ok=False)]   # an error: counted, not timed
    m = measure_tokens(frame(rows), speed=1.0, warmup_s=1.0, lag_budget_ms=5.0, ttft_ms=250.0, tpot_ms=50.0)
    assert m.requests == 6 and m.errors == 1 and m.error_rate == pytest.approx(1 / 6)
    assert m.ttft_ms["p50"] == pytest.approx(200.0) and m.ttft_ms["max"] == pytest.approx(400.0)
    assert sorted(m.ttfts_ms) == pytest.approx([50, 100, 200, 300, 400])
    assert sorted(m.tpots_ms) == pytest.approx([20, 40, 60, 80])      # (last - first) / (tokens - 1)
    assert m.tpot_ms["p50"] == pytest.approx(50.0)
    assert m.itl_ms["p50"] == pytest.approx(50.0) and m.itl_ms["max"] == pytest.approx(80.0)  # 10 gaps each
    # end to end = last token - due: first + 10 gaps
    assert m.e2e_ms["max"] == pytest.approx(400 + 800) and m.e2e_ms["p50"] == pytest.approx(200 + 400)
    # the last successful completion: request 3 at 4.0 + 0.4 + 0.8 + 0.001
    span = 4.0 + 1.2 + 0.001 - 1.0
    assert m.output_tokens == 45 and m.prompt_tokens == 440
    assert m.output_tokens_per_s == pytest.approx(45 / span)
    assert m.total_tokens_per_s == pytest.approx((45 + 440) / span)
    assert m.throughput_rps == pytest.approx(5 / span)
    # goodput: TTFT <= 250 and TPOT <= 50: requests 0 (100 ms, 20) and 1 (200 ms, 40), and the one-token one
    assert m.good_requests == 3 and m.goodput_rps == pytest.approx(3 / span)
    assert m.valid and m.duration_s == pytest.approx(4.5) and m.offered_rps == pytest.approx(6 / 4.5)
    assert m.ttft(50) == m.ttft_ms["p50"] and m.tpot(100) == m.tpot_ms["max"]
    # busy: the union of the measured requests' spans, due to end (the one-token request at 5.0 lies inside
    # the span of the request due at 4.0; the error's span counts: the engine held it)
    assert m.busy_s == pytest.approx(0.301 + 0.601 + 0.901 + 1.201 + 0.081)


def test_goodput_counts_each_limit_given_and_none_without_limits():
    rows = [record(1.0 + k, first=0.1 * (k + 1), tokens=5, gap=0.01 * (k + 1)) for k in range(4)]
    records = frame(rows)
    only_ttft = measure_tokens(records, speed=1.0, warmup_s=0.0, lag_budget_ms=5.0, ttft_ms=200.5)
    assert only_ttft.good_requests == 2 and only_ttft.tpot_limit_ms is None
    only_tpot = measure_tokens(records, speed=1.0, warmup_s=0.0, lag_budget_ms=5.0, tpot_ms=30.5)
    assert only_tpot.good_requests == 3
    # end to end = first + 4 gaps = 140, 280, 420, 560 ms
    only_e2e = measure_tokens(records, speed=1.0, warmup_s=0.0, lag_budget_ms=5.0, e2e_ms=300.0)
    assert only_e2e.good_requests == 2 and only_e2e.e2e_limit_ms == 300.0 and only_e2e.e2e(100) == pytest.approx(560)
    both = measure_tokens(records, speed=1.0, warmup_s=0.0, lag_budget_ms=5.0, tpot_ms=30.5, e2e_ms=430.0)
    assert both.good_requests == 3
    no_limit = measure_tokens(records, speed=1.0, warmup_s=0.0, lag_budget_ms=5.0)
    assert no_limit.good_requests == 4 and no_limit.goodput_rps == pytest.approx(no_limit.throughput_rps)


def test_the_sla_percentile_is_kept_and_send_lag_decides_validity():
    rows = [record(float(k), first=0.01 * k, tokens=3, gap=0.01, lag=0.1 if k < 90 else 20.0) for k in range(100)]
    m = measure_tokens(frame(rows), speed=2.0, warmup_s=0.0, lag_budget_ms=5.0, sla_percentile=97.5)
    assert "p97.5" in m.ttft_ms and "p97.5" in m.tpot_ms and m.sla_percentile == 97.5
    assert not m.valid and m.invalid_reason.startswith("send lag p99 20.00 ms > budget 5 ms")
    assert m.ttft(97.5) == pytest.approx(np.percentile(np.arange(100) * 10.0, 97.5))


def test_no_request_in_the_window_is_invalid_with_nan_figures():
    m = measure_tokens(frame([record(0.0, first=0.1, tokens=2, gap=0.01)]), speed=1.0, warmup_s=5.0,
                       lag_budget_ms=5.0, duration_s=4.0)
    assert not m.valid and "no requests due in the measured window" in m.invalid_reason
    assert m.requests == 0 and math.isnan(m.ttft_ms["p99"]) and m.output_tokens_per_s == 0.0


def test_records_of_an_encoder_replay_are_refused_by_name():
    with pytest.raises(ValueError, match="no prompt_tokens, tokens, first_token_s"):
        measure_tokens(pd.DataFrame({"due_s": [0.0], "end_s": [0.1], "send_lag_ms": [0.1], "ok": [True]}),
                       speed=1.0, warmup_s=0.0, lag_budget_ms=5.0)
    assert set(RECORD_COLUMNS) <= set(record(0.0, first=0.1, tokens=2, gap=0.01))


def test_the_measurement_is_frozen():
    m = measure_tokens(frame([record(0.0, first=0.1, tokens=2, gap=0.01)]), speed=1.0, warmup_s=0.0,
                       lag_budget_ms=5.0)
    assert isinstance(m, TokenMeasurement)
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.speed = 2.0


def test_the_engines_streamed_rate_counts_every_requests_tokens_inside_the_window():
    """Tokens streamed between the window's start and the schedule's end, the warm-up's included and
    those after the end left out, per second: what the engine delivered while the load was offered."""
    rows = [record(0.0, first=0.45, tokens=11, gap=0.1)]  # warm-up: tokens at 0.45 .. 1.45, 5 from 1.0
    rows += [record(1.0, first=0.2, tokens=6, gap=0.2)]   # 1.2 .. 2.2: all 6 inside [1, 3)
    rows += [record(2.5, first=0.1, tokens=10, gap=0.1)]  # 2.6 .. 3.5: 4 inside
    m = measure_tokens(frame(rows), speed=1.0, warmup_s=1.0, lag_budget_ms=5.0, duration_s=3.0)
    assert m.streamed_tokens_per_s == pytest.approx((5 + 6 + 4) / 2.0)
    # a response that carried several tokens counts them all (2 responses of 3 tokens: 1.2 and 1.4)
    two = dict(record(1.0, first=0.2, tokens=2, gap=0.2), tokens=6, output_tokens=6)
    assert measure_tokens(frame([two]), speed=1.0, warmup_s=1.0, lag_budget_ms=5.0,
                          duration_s=3.0).streamed_tokens_per_s == pytest.approx(6 / 2.0)
    # a failed request's tokens streamed before its error count: the engine made them
    failed = dict(record(1.0, first=0.2, tokens=4, gap=0.1), ok=False)
    assert measure_tokens(frame([failed]), speed=1.0, warmup_s=1.0, lag_budget_ms=5.0,
                          duration_s=3.0).streamed_tokens_per_s == pytest.approx(4 / 2.0)


def test_streams_cut_at_the_windows_end_are_offered_not_errors_and_timed_by_none_of_the_percentiles():
    """A replay that cut its open streams at the window's end (its `cut` column): they count among the
    requests offered and asked for, not among the errors, their unfinished latencies in no percentile;
    the tokens they streamed inside the window count in the engine's rate as before."""
    done = [record(1.0 + 0.5 * k, first=0.1, tokens=5, gap=0.1) for k in range(3)]  # end by 2.5
    # open at the cut (3.0): 2 of 10 tokens streamed (2.6, 2.8), the second still waiting for its first
    open_ = dict(record(2.4, first=0.2, tokens=2, gap=0.2), ok=False, error="cut", output_tokens=10, end_s=3.0)
    waiting = dict(record(2.8, first=0.1, tokens=1, gap=0.0), ok=False, error="cut", output_tokens=10, end_s=3.0,
                   tokens=0, first_token_s=math.nan, last_token_s=math.nan, itl_ms=np.empty(0))
    records = frame(done + [open_, waiting])
    records["cut"] = [False, False, False, True, True]
    m = measure_tokens(records, speed=1.0, warmup_s=1.0, lag_budget_ms=5.0, ttft_ms=1000.0, duration_s=3.0)
    assert m.requests == 5 and m.cut_requests == 2 and m.errors == 0 and m.error_rate == 0.0
    assert sorted(m.ttfts_ms) == pytest.approx([100, 100, 100])  # the three that finished
    assert m.offered_tokens_per_s == pytest.approx((3 * 5 + 10 + 10) / 2.0)
    assert m.streamed_tokens_per_s == pytest.approx((3 * 5 + 2) / 2.0)
    # the same records without the column: the two are errors, as any failed request is
    uncut = measure_tokens(records.drop(columns="cut"), speed=1.0, warmup_s=1.0, lag_budget_ms=5.0,
                           duration_s=3.0)
    assert uncut.errors == 2 and uncut.cut_requests == 0
