"""benchmarks/llm_step_curve.py's arithmetic (no GPU, no PyTorch, no engine: so not in tests/llm, whose
files take turns on the engine lock): its roofline is llm_sim's own step time (the template's
`_StepTime`, loaded with Triton's module stubbed), and its fit finds the numbers a roofline was made of."""

from __future__ import annotations

import os

import pytest

from benchmarks.llm_step_curve import DECODE, PREFILL, Point, fit_roofline, roofline_ms, template_model

H200_FIT = {"step_overhead_ms": 0.80, "weights_ms": 4.582, "kv_us_per_token": 0.0377,
            "compute_us_per_token": 26.59}  # docs/gpu-check.md


def steps() -> list[tuple[str, int, int, int]]:
    """The benchmark's own grid: (kind, sequences, tokens computed, context read)."""
    return [("decode", b, b, b * c) for b, c in DECODE] + [("prefill", 1, t, t) for t in PREFILL]


def test_the_roofline_is_the_templates_step_time_the_longer_of_reading_and_computing():
    # 8 decodes of 2,048 tokens: weights and 16,384 tokens of KV cache read; 4,096 prompt tokens: computed
    assert roofline_ms(H200_FIT, 8, 8 * 2048) == pytest.approx(0.80 + 4.582 + 0.0377 * 16384 / 1000)
    assert roofline_ms(H200_FIT, 4096, 4096) == pytest.approx(0.80 + 26.59 * 4096 / 1000)
    step = template_model()._StepTime([H200_FIT[k] for k in template_model()._StepTime.KEYS[:-1]] + [4.0])
    for _, _, tokens, context in steps():  # time_scale multiplies the whole step
        assert step.seconds(tokens, context) * 1e3 == pytest.approx(4.0 * roofline_ms(H200_FIT, tokens, context))


def test_loading_the_template_leaves_the_callers_environment_as_it_was(monkeypatch):
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    template_model()  # the model file sets it to 0 for the server's process
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ


def test_the_fit_finds_the_numbers_a_roofline_was_made_of():
    # steps timed exactly as the roofline says, on both sides of its knee (decodes read, prefills compute)
    points = [Point(kind=kind, sequences=b, tokens=t, context=c, eager_ms=roofline_ms(H200_FIT, t, c), graph_ms=None)
              for kind, b, t, c in steps()]
    assert fit_roofline(points) == pytest.approx(H200_FIT, rel=0.02)
    # and a GPU 20 % slower is found 20 % slower, term by term
    slower = [Point(kind=p.kind, sequences=p.sequences, tokens=p.tokens, context=p.context, eager_ms=1.2 * p.ms,
                    graph_ms=None) for p in points]
    assert fit_roofline(slower) == pytest.approx({k: 1.2 * v for k, v in H200_FIT.items()}, rel=0.02)
