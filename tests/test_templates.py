"""The template models on a real server: the emulated encoder's padding, out-of-memory and shared GPU,
and real batching in matmul_cpu."""

from __future__ import annotations

import importlib.util
import time
import urllib.error

import numpy as np
import pytest

from tuner import modelconfig

try:  # tests/ is a rootdir without __init__.py today; keep working if it becomes a package
    from .server.contract import burst, infer, settled_statistics, template, with_batching
except ImportError:
    from server.contract import burst, infer, settled_statistics, template, with_batching

pytestmark = pytest.mark.slow


def _encoder_module(templates_dir):
    """The encoder's model.py, for its pure latency function (it imports triton_python_backend_utils,
    which only exists inside the server, so stub that import)."""
    import sys
    import types

    sys.modules.setdefault("triton_python_backend_utils", types.ModuleType("triton_python_backend_utils"))
    spec = importlib.util.spec_from_file_location("encoder_sim_model", templates_dir / "encoder_sim/1/model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _params(config) -> dict[str, str]:
    return {k: v.string_value for k, v in config.parameters.items()}


def test_encoder_latency_curve_batches_well_then_turns_steeper(templates_dir):
    m = _encoder_module(templates_dir)
    p = _params(template("encoder_sim"))
    tokens, ms = m.parse_table(p["latency_table_ms"])
    knee, slow = float(p["memory_bound_tokens"]), float(p["memory_bound_slowdown"])

    def per_row(rows, length=512):
        return m.execute_ms(rows * length, tokens, ms, knee, slow) / rows

    # batching pays: 8 rows cost much less per row than 1 ...
    assert per_row(8) < per_row(1) / 3
    # ... up to an interior optimum: past the memory-bound point a row costs more again
    best = min(range(1, 65), key=per_row)
    assert 4 <= best <= 32 and per_row(32) > per_row(best) * 1.2
    # the table itself is matched at its points
    assert m.execute_ms(3072, tokens, ms, knee, slow) == pytest.approx(2.22)


def test_encoder_out_of_memory_fails_every_request_in_the_batch(local_server, restore_template_config):
    http = local_server.endpoints.http
    budget = int(_params(template("encoder_sim"))["max_padded_tokens"])
    rows = budget // 512 + 1  # one request whose padded size is over the budget
    with pytest.raises(urllib.error.HTTPError) as info:
        infer(http, "encoder_sim", "INPUT_IDS", np.ones((rows, 512), np.int32))
    assert "out of memory" in info.value.read().decode()
    # the same rows in a shorter sequence fit
    out = infer(http, "encoder_sim", "INPUT_IDS", np.ones((rows, 256), np.int32))
    assert out["outputs"][0]["shape"] == [rows, 8]
    # many small requests batched past the budget: each one fails, the server lives on
    local_server.apply_config("encoder_sim", with_batching(template("encoder_sim"), 64, 200000))
    arrays = [np.ones((1, 512), np.int32) for _ in range(64)]
    ok, errors = burst(http, "encoder_sim", "INPUT_IDS", arrays, concurrency=64)
    # (a batch of 33+ full-length rows is over the budget; threads arriving late may form a smaller one)
    assert ok + len(errors) == 64 and len(errors) >= rows and all("out of memory" in e for e in errors)
    assert local_server.is_alive()
    ok, errors = burst(http, "encoder_sim", "INPUT_IDS", arrays[:8], concurrency=8)
    assert (ok, errors) == (8, [])


def test_encoder_batches_ragged_requests_and_truncates(local_server, restore_template_config):
    config = with_batching(template("encoder_sim"), 16, 30000)
    local_server.apply_config("encoder_sim", config)
    lengths = [5, 700, 64, 512, 1000, 33, 128, 300] * 2
    arrays = [np.arange(1, n + 1, dtype=np.int32).reshape(1, -1) for n in lengths]
    ok, errors = burst(local_server.endpoints.http, "encoder_sim", "INPUT_IDS", arrays, concurrency=16)
    assert (ok, errors) == (16, [])
    stats = settled_statistics(local_server, "encoder_sim", 16)
    assert stats["inference_count"] == 16 and stats["execution_count"] <= 4, stats["batch_stats"]


def test_encoder_instances_share_one_gpu(local_server, restore_template_config):
    """Two instances, no batching: executions take turns on the emulated GPU, so 16 requests take
    at least 16 execution times even when sent two at a time."""
    config = with_batching(template("encoder_sim"), 1, 0, instances=2)
    config.parameters["time_scale"].string_value = "20"
    local_server.apply_config("encoder_sim", config)
    m_ms = 1.15 + (512 - 384) / (768 - 384) * (1.33 - 1.15)  # the table at 512 tokens
    gpu_s = m_ms * 20 / 1000
    arrays = [np.ones((1, 512), np.int32) for _ in range(16)]
    burst(local_server.endpoints.http, "encoder_sim", "INPUT_IDS", arrays[:2], concurrency=2)  # warm up
    started = time.monotonic()
    ok, errors = burst(local_server.endpoints.http, "encoder_sim", "INPUT_IDS", arrays, concurrency=2)
    wall = time.monotonic() - started
    assert (ok, errors) == (16, [])
    assert wall >= 0.95 * 16 * gpu_s, f"executions overlapped: {wall:.3f} s for 16 x {gpu_s * 1000:.1f} ms"
    stats = settled_statistics(local_server, "encoder_sim", 18)
    assert stats["execution_count"] == stats["inference_count"] == 18


def _execution_ns(stats: dict) -> int:
    return sum(int(b["compute_infer"]["ns"]) for b in stats.get("batch_stats", []))


def test_matmul_batches_and_batching_pays(local_server, restore_template_config):
    """Real CPU work: compute time per inference (Triton's own, per execution) drops when batched."""
    http = local_server.endpoints.http
    rows = [np.full((1, 256), 0.01 * i, np.float32) for i in range(64)]
    per_inference_ms, sizes = {}, {}
    for mbs, delay in ((1, 0), (32, 300000)):
        local_server.apply_config("matmul_cpu", with_batching(template("matmul_cpu"), mbs, delay))
        burst(http, "matmul_cpu", "INPUT", rows[:mbs], concurrency=mbs)  # warm up (first run is slow)
        before = settled_statistics(local_server, "matmul_cpu", mbs)
        ok, errors = burst(http, "matmul_cpu", "INPUT", rows, concurrency=64)
        after = settled_statistics(local_server, "matmul_cpu", mbs + 64)
        assert (ok, errors) == (64, [])
        executions = after["execution_count"] - before["execution_count"]
        sizes[mbs] = 64 / executions
        # batch_stats count each execution once (inference_stats count it once per request)
        per_inference_ms[mbs] = (_execution_ns(after) - _execution_ns(before)) / 64 / 1e6
    print(f"matmul_cpu compute per inference: unbatched {per_inference_ms[1]:.2f} ms, "
          f"batched {per_inference_ms[32]:.2f} ms (mean batch {sizes[32]:.1f})")
    assert sizes[1] == 1 and sizes[32] >= 8, sizes
    # ~2.9 ms per row alone, ~1.1 ms per row in batches of 32 on an idle machine; room for a busy one
    assert per_inference_ms[32] < 0.75 * per_inference_ms[1], per_inference_ms
    # the answers are deterministic (fixed weights) and squashed by tanh
    out = infer(http, "matmul_cpu", "INPUT", rows[3])["outputs"][0]
    assert out["shape"] == [1, 256] and all(-1 <= v <= 1 for v in out["data"])
    assert infer(http, "matmul_cpu", "INPUT", rows[3])["outputs"][0]["data"] == out["data"]


def test_templates_parse_and_declare_their_incumbents(templates_dir):
    for name in ("encoder_sim", "matmul_cpu"):
        config = modelconfig.load(templates_dir / name / "config.pbtxt")
        assert config.name == name and config.backend == "python"
        assert config.max_batch_size >= 64
        assert config.dynamic_batching.max_queue_delay_microseconds == 0
        assert (templates_dir / name / "README.md").is_file()


def test_a_bad_parameter_is_refused_by_name(local_server, restore_template_config):
    from tuner.errors import ServerSetupError

    config = template("encoder_sim")
    config.parameters["time_scale"].string_value = "fast"
    with pytest.raises(ServerSetupError, match=r"parameters.time_scale: expected float, got 'fast'"):
        local_server.apply_config("encoder_sim", config)
