"""tuner.llm.engine_metrics: vLLM's series read from a Prometheus text exposition as Triton writes it
(the llm_vllm template's custom metrics), differences over a replay, Prometheus's histogram quantile.
The template's real /metrics is read in tests/llm/test_template.py and benchmarks/llm_replay_truth.py."""

from __future__ import annotations

import math

import pytest

from tuner.llm.engine_metrics import TTFT, Histogram, engine_delta, read_engine


def exposition(*, ttft_counts: tuple[int, int, int, int], preemptions: int, other_model: int = 0) -> str:
    """Triton's /metrics with one model's vLLM series (and another model's, to be left out)."""
    bounds = ("0.01", "0.02", "0.04", "+Inf")
    cumulative = [sum(ttft_counts[:k + 1]) for k in range(4)]
    lines = [
        "# HELP nv_inference_count Number of inferences performed",
        "# TYPE nv_inference_count counter",
        'nv_inference_count{model="llm",version="1"} 7',
        "# HELP vllm:num_preemptions Cumulative number of preemptions.",
        "# TYPE vllm:num_preemptions counter",
        f'vllm:num_preemptions{{model="llm",version="1"}} {preemptions}',
        f'vllm:num_preemptions{{model="other",version="1"}} {other_model}',
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
        "# TYPE vllm:generation_tokens_total counter",
        f'vllm:generation_tokens_total{{model="llm",version="1"}} {64 * cumulative[-1]}',
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        'vllm:kv_cache_usage_perc{model="llm",version="1"} 0.25',
        "# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.",
        "# TYPE vllm:time_to_first_token_seconds histogram",
        *(f'vllm:time_to_first_token_seconds_bucket{{model="llm",version="1",le="{b}"}} {c}'
          for b, c in zip(bounds, cumulative, strict=True)),
        f'vllm:time_to_first_token_seconds_sum{{model="llm",version="1"}} {0.015 * cumulative[-1]}',
        f'vllm:time_to_first_token_seconds_count{{model="llm",version="1"}} {cumulative[-1]}',
        f'vllm:time_to_first_token_seconds_bucket{{model="other",version="1",le="0.01"}} {other_model}',
    ]
    return "\n".join(lines) + "\n"


def test_a_snapshot_keeps_one_models_vllm_series():
    snap = read_engine(exposition(ttft_counts=(2, 4, 4, 0), preemptions=3, other_model=99), "llm")
    assert snap.values["vllm:num_preemptions"] == 3 and snap.values["vllm:kv_cache_usage_perc"] == 0.25
    assert snap.values["vllm:generation_tokens"] == 640
    assert "nv_inference_count" not in snap.values
    hist = snap.histograms[TTFT]
    assert hist.bounds == (0.01, 0.02, 0.04) and hist.counts == (2, 4, 4, 0) and hist.count == 10


def test_the_difference_of_two_snapshots_is_what_happened_between_them():
    before = read_engine(exposition(ttft_counts=(2, 4, 4, 0), preemptions=3), "llm")
    after = read_engine(exposition(ttft_counts=(2, 10, 4, 1), preemptions=5), "llm")
    figures = engine_delta(before, after)
    assert figures.preemptions == 2 and figures.generation_tokens == 64 * 7 and figures.kv_cache_usage == 0.25
    hist = figures.seconds(TTFT)
    assert hist.counts == (0, 6, 0, 1) and hist.count == 7
    assert hist.mean() == pytest.approx(0.015)


def test_the_quantile_is_prometheus_histogram_quantile():
    hist = Histogram((0.01, 0.02, 0.04), (2, 4, 4, 0), total=0.2, count=10)
    assert hist.quantile(0.5) == pytest.approx(0.01 + 0.01 * (5 - 2) / 4)   # rank 5: 3 into the 2nd bucket
    assert hist.quantile(0.1) == pytest.approx(0.005)                       # the first bucket from 0
    assert hist.quantile(0.99) == pytest.approx(0.02 + 0.02 * (9.9 - 6) / 4)
    assert Histogram((0.01,), (0, 3), total=1.0, count=3).quantile(0.5) == 0.01  # in +Inf: the last bound
    assert math.isnan(Histogram((0.01,), (0, 0), total=0.0, count=0).quantile(0.5))


def test_observations_binned_into_a_histograms_buckets_are_counted_as_prometheus_counts_them():
    like = Histogram((0.01, 0.02, 0.04), (0, 0, 0, 0), total=0.0, count=0)
    # a value on a bound is in that bound's bucket (le); past the last, in +Inf
    same = like.binned([0.005, 0.01, 0.015, 0.02, 0.03, 0.03, 0.05])
    assert same.counts == (2.0, 2.0, 2.0, 1.0) and same.count == 7 and same.total == pytest.approx(0.16)
    assert same.quantile(0.5) == pytest.approx(0.01 + 0.01 * (3.5 - 2) / 2)  # linear within its bucket, not 0.02


def test_an_emulated_gpus_step_counters_are_read_and_differenced_with_the_engines():
    def with_steps(steps: int, overruns: int) -> str:
        return exposition(ttft_counts=(1, 0, 0, 0), preemptions=0) + "\n".join([
            "# HELP tuner_emulated_gpu_steps_total Engine steps held to the emulated GPU's time.",
            "# TYPE tuner_emulated_gpu_steps_total counter",
            f'tuner_emulated_gpu_steps_total{{model="llm",version="1"}} {steps}',
            'tuner_emulated_gpu_steps_total{model="other",version="1"} 5000',
            "# HELP tuner_emulated_gpu_overrun_steps_total Engine steps the CPU took longer.",
            "# TYPE tuner_emulated_gpu_overrun_steps_total counter",
            f'tuner_emulated_gpu_overrun_steps_total{{model="llm",version="1"}} {overruns}']) + "\n"

    figures = engine_delta(read_engine(with_steps(100, 1), "llm"), read_engine(with_steps(500, 21), "llm"))
    assert (figures.emulated_steps, figures.emulated_overruns) == (400, 20) and figures.overrun_share == 0.05
    real = engine_delta(*(read_engine(exposition(ttft_counts=(1, 0, 0, 0), preemptions=0), "llm"),) * 2)
    assert real.emulated_steps == 0 and math.isnan(real.overrun_share)  # a real engine: no share to judge
