"""The template models on a real server: the emulated encoder's padding, out-of-memory and shared GPU,
and real batching in matmul_cpu."""

from __future__ import annotations

import time
import urllib.error

import numpy as np
import pytest

from benchmarks.encoder_sim import emulation
from tuner import modelconfig

try:  # tests/ is a rootdir without __init__.py today; keep working if it becomes a package
    from .server.contract import burst, infer, settled_statistics, template, with_batching
except ImportError:
    from server.contract import burst, infer, settled_statistics, template, with_batching

pytestmark = pytest.mark.slow


def _params(config) -> dict[str, str]:
    return {k: v.string_value for k, v in config.parameters.items()}


def test_encoder_latency_curve_batches_well_then_turns_steeper(templates_dir):
    m = emulation()
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


# --- encoder_sim over time: cold start, fragmentation, a compute time that never settles -------------

OVER_TIME_OFF = {"cold_start_factor": "1", "new_shape_ms": "0", "fragmentation_per_1k_executions": "0",
                 "compute_drift_per_execution": "0"}


def _over_time(m, params: dict[str, str]) -> dict:
    """The template's over-time parameters as the pure functions' keyword arguments."""
    return {
        "cold": {"factor": float(params["cold_start_factor"]), "half_life": float(params["cold_start_half_life"])},
        "fragmentation": {"max_padded_tokens": int(params["max_padded_tokens"]),
                          "per_1k_executions": float(params["fragmentation_per_1k_executions"]),
                          "slowdown": float(params["fragmentation_slowdown"])},
    }


# the emulated H200's cold start (README.md): what the template's parameters are set to emulate it
H200 = {"cold_start_factor": "21", "new_shape_ms": "4"}


def test_cold_start_curve_is_the_measured_gpus(templates_dir):
    """The template's curve: ~11x over an instance's first 10 executions and ~1.5x over the next 40 (the
    H200 figures in the README: 114 ms, then 15.6 ms, against ~10 ms warm), then warm."""
    m = emulation()
    cold = _over_time(m, {**_params(template("encoder_sim")), **H200})["cold"]
    f = [m.cold_start_factor(k, **cold) for k in range(200)]
    assert sum(f[:10]) / 10 == pytest.approx(11.4, rel=0.05)
    assert sum(f[10:50]) / 40 == pytest.approx(1.56, rel=0.05)
    assert all(a > b for a, b in zip(f, f[1:], strict=False))  # decays with every execution
    # the documented warm-up: within 1% of warm after this many successful executions, not before
    k = m.cold_start_executions(0.01, **cold)
    assert f[k] <= 1.01 < f[k - 1] and 30 <= k <= 60
    assert m.cold_start_factor(0, factor=1.0, half_life=4.0) == 1.0  # off
    assert m.cold_start_executions(0.01, factor=1.0, half_life=4.0) == 0
    # buckets: rows exact, length rounded up to the bucket size
    assert m.shape_bucket(4, 400, bucket_tokens=64) == m.shape_bucket(4, 390, bucket_tokens=64) == (4, 448)
    assert m.shape_bucket(4, 449, bucket_tokens=64) == (4, 512) != m.shape_bucket(5, 449, bucket_tokens=64)


def test_fragmentation_budget_and_slowdown_in_closed_form(templates_dir):
    m = emulation()
    frag = _over_time(m, _params(template("encoder_sim")))["fragmentation"]
    assert frag["per_1k_executions"] == 0  # off in the template: the budget never moves
    assert m.fragmentation(10**6, **frag) == (frag["max_padded_tokens"], 1.0)
    assert m.first_failing_execution(32 * 512, max_padded_tokens=16384, per_1k_executions=0) is None
    assert m.first_failing_execution(33 * 512, max_padded_tokens=16384, per_1k_executions=0) == 0

    on = dict(frag, per_1k_executions=0.01, slowdown=0.5)  # 1% of the budget per 1000 executions
    assert m.fragmentation(0, **on) == (16384, 1.0)
    budget, slowdown = m.fragmentation(37_500, **on)  # 37.5% lost: the account's 16 -> 10 requests
    assert budget == pytest.approx(16384 * 0.625) and slowdown == pytest.approx(1.1875)
    assert budget // 512 == 20  # full-length rows that still fit: 32 at load, 20 now
    assert m.fragmentation(10**7, **on) == (0.0, 1.5)  # everything lost: nothing fits any more
    # the closed form agrees with a scan of budget(n) for every batch (rows x padded length)
    for rows, length in ((31, 512), (20, 512), (16, 512), (8, 448), (1, 512), (64, 64)):
        padded = rows * length
        n = m.first_failing_execution(padded, max_padded_tokens=16384, per_1k_executions=0.01)
        assert padded <= m.fragmentation(n - 1, **on)[0] and padded > m.fragmentation(n, **on)[0], (rows, length)
    assert m.first_failing_execution(32 * 512, max_padded_tokens=16384, per_1k_executions=0.01) == 1
    # the README's table
    assert [m.first_failing_execution(r * 512, max_padded_tokens=16384, per_1k_executions=0.01)
            for r in (31, 24, 20, 16)] == [3126, 25001, 37501, 50001]


def test_compute_drift_never_settles(templates_dir):
    m = emulation()
    assert m.drift_factor(10**6, per_execution=0.0) == 1.0
    # any two consecutive windows of w executions differ by the same (1 + d)^w, however late
    for start in (0, 100, 1000):
        ratio = m.drift_factor(start + 20, per_execution=0.01) / m.drift_factor(start + 10, per_execution=0.01)
        assert ratio == pytest.approx(1.01**10)


@pytest.fixture(scope="module")
def emulator(triton_install, templates_dir):
    """A private server with encoder_sim, which the over-time tests reconfigure (parameters included:
    Triton's config override carries them), so the session's shared server keeps the template's."""
    from tuner.server.local import LocalLauncher

    with LocalLauncher(templates_dir, models=["encoder_sim"], install=triton_install) as server:
        yield server


def _load(server, params: dict[str, str], max_batch_size: int = 64, instances: int = 1, delay_us: int = 0):
    """Load encoder_sim with the template's parameters changed by `params`. A changed configuration
    starts new instances; Triton keeps the running ones when the configuration is the same."""
    config = with_batching(template("encoder_sim"), max_batch_size, delay_us, instances=instances)
    for key, value in params.items():
        config.parameters[key].string_value = value
    server.apply_config("encoder_sim", config)
    return _params(config)


def _run(server, rows: int, length: int, count: int = 1) -> list[float]:
    """Send `count` requests of rows x length one after another; Triton's compute time (ms) of each."""
    out = []
    for _ in range(count):
        before = _compute(server.statistics("encoder_sim"), rows)
        infer(server.endpoints.http, "encoder_sim", "INPUT_IDS", np.ones((rows, length), np.int32))
        deadline = time.monotonic() + 5
        while (after := _compute(server.statistics("encoder_sim"), rows))[0] == before[0]:
            assert time.monotonic() < deadline, "statistics never counted the execution"
            time.sleep(0.01)
        out.append((after[1] - before[1]) / 1e6)
    return out


def _compute(stats: dict, rows: int) -> tuple[int, int]:
    """(successful executions, compute ns) of batches of `rows` (Triton's batch_stats)."""
    for b in stats.get("batch_stats", []):
        if int(b["batch_size"]) == rows:
            return int(b["compute_infer"]["count"]), int(b["compute_infer"]["ns"])
    return 0, 0


def _gpu_ms(m, params: dict[str, str], padded: int) -> float:
    """The emulated warm GPU time of a batch, scaled, as model.py computes it."""
    tokens, ms = m.parse_table(params["latency_table_ms"])
    return m.execute_ms(padded, tokens, ms, float(params["memory_bound_tokens"]),
                        float(params["memory_bound_slowdown"])) * float(params["time_scale"])


def test_first_executions_after_a_load_are_slower(emulator, templates_dir):
    """The template's defaults: an instance's first executions are ~11x slower, failed ones do not warm
    it, and a reload of a changed configuration (new instances) starts cold again."""
    m = emulation()
    params = _load(emulator, H200)
    cold = _over_time(m, params)["cold"]
    for _ in range(3):  # out of memory: fails fast and does not count as a warm-up
        with pytest.raises(urllib.error.HTTPError):
            infer(emulator.endpoints.http, "encoder_sim", "INPUT_IDS", np.ones((40, 512), np.int32))
    first = _run(emulator, 1, 512, 10)
    _run(emulator, 1, 512, 40)
    warm = _run(emulator, 1, 512, 10)
    expected = _gpu_ms(m, params, 512) * sum(m.cold_start_factor(k, **cold) for k in range(10)) / 10
    print(f"encoder_sim cold start: {np.mean(first):.1f} ms per execution over the first 10 "
          f"(emulated {expected:.1f}), {np.mean(warm):.1f} ms after 50")
    assert np.mean(first) >= 0.9 * expected
    assert np.mean(first) > 5 * np.mean(warm) and np.mean(warm) < 2 * _gpu_ms(m, params, 512)
    _load(emulator, H200, delay_us=100)  # as a new trial: Triton starts new instances, which start cold
    assert np.mean(_run(emulator, 1, 512, 3)) > 5 * np.mean(warm)


def test_a_repeated_shape_is_faster_than_its_first_execution(emulator, templates_dir):
    m = emulation()
    params = _load(emulator, {"cold_start_factor": "1", "new_shape_ms": "4"})  # the per-shape cost alone
    extra = float(params["new_shape_ms"]) * float(params["time_scale"])
    _run(emulator, 1, 512, 2)
    new, repeat = _run(emulator, 4, 400, 2)
    same_bucket = _run(emulator, 4, 390)[0]  # 390 and 400 both round up to 448
    other_bucket = _run(emulator, 4, 449)[0]  # 512: a new bucket
    print(f"encoder_sim 4 x 400: first {new:.1f} ms, repeat {repeat:.1f} ms, 4 x 390 {same_bucket:.1f} ms, "
          f"4 x 449 {other_bucket:.1f} ms (new_shape {extra:.0f} ms)")
    assert new - repeat >= 0.8 * extra
    assert same_bucket < repeat + 0.5 * extra
    assert other_bucket - _gpu_ms(m, params, 4 * 449) >= 0.8 * extra


def test_fragmentation_fails_a_large_batch_after_enough_executions_and_a_reload_resets_it(emulator, templates_dir):
    """An aggressive rate (2% of the budget per execution), two instances sharing the count: a batch of
    16 x 512 (half the budget) succeeds until budget(n) drops below it, exactly where the closed form
    says, counting every execution of the model (Triton's execution_count); compute time creeps up as
    slowdown(n) says; a reload resets both."""
    m = emulation()
    # time_scale 24 (4x the template's): the emulated times (45-80 ms) stand well above the few ms a busy
    # machine adds to each execution, which at the template's 11-20 ms squeezed the ratio (CI read x1.29
    # where x1.77 was due: 17.7 ms early where 11 were)
    params = _load(emulator, {**OVER_TIME_OFF, "fragmentation_per_1k_executions": "20",
                              "fragmentation_slowdown": "4", "time_scale": "24"}, instances=2)
    frag = _over_time(m, params)["fragmentation"]
    fails_at = m.first_failing_execution(16 * 512, max_padded_tokens=frag["max_padded_tokens"],
                                         per_1k_executions=frag["per_1k_executions"])
    assert fails_at == 26
    http = emulator.endpoints.http
    large = np.ones((16, 512), np.int32)
    assert infer(http, "encoder_sim", "INPUT_IDS", large)["outputs"][0]["shape"] == [16, 8]  # n = 0
    # both instances run once (the first execution of a Python-backend process is slow by itself)
    ok, errors = burst(http, "encoder_sim", "INPUT_IDS", [np.ones((1, 512), np.int32)] * 4, concurrency=2)
    assert (ok, errors) == (4, [])
    n0 = settled_statistics(emulator, "encoder_sim", 1 + 4)["execution_count"]  # 5, or fewer if batched
    times = _run(emulator, 1, 512, fails_at - 1 - n0)  # executions n0 .. 24
    assert emulator.statistics("encoder_sim")["execution_count"] == fails_at - 1
    assert infer(http, "encoder_sim", "INPUT_IDS", large)  # n = 25: budget 8192, still fits
    with pytest.raises(urllib.error.HTTPError) as info:  # n = 26: 7864.32 tokens left
        infer(http, "encoder_sim", "INPUT_IDS", large)
    message = info.value.read().decode()
    assert "out of memory" in message and "budget of 7864 (fragmented from 16384)" in message
    # compute time crept up as the closed form says: the first five executions' median against the last
    # five's (2.76x at n = 22 against 1.56x at n = 7), medians as one execution slowed by a busy machine
    # moves a single time (CI once read 15.4 ms at n = 5 where 11 were due: x1.45 against x2.09)
    first, last = n0 + 2, fails_at - 4
    ratio = m.fragmentation(last, **frag)[1] / m.fragmentation(first, **frag)[1]
    early, late = float(np.median(times[:5])), float(np.median(times[-5:]))
    print(f"encoder_sim fragmented: 1 x 512 around n = {first}: {early:.1f} ms, around n = {last}: "
          f"{late:.1f} ms (x{late / early:.2f}; closed form x{ratio:.2f})")
    assert late / early == pytest.approx(ratio, rel=0.25)
    assert late >= 0.9 * _gpu_ms(m, params, 512) * m.fragmentation(last, **frag)[1]  # a sleep never runs short
    # a reload (a changed configuration, as a restart) gives the memory back
    _load(emulator, {**OVER_TIME_OFF, "fragmentation_per_1k_executions": "20"}, instances=2)
    assert infer(http, "encoder_sim", "INPUT_IDS", large)["outputs"][0]["shape"] == [16, 8]


def test_compute_time_that_never_settles(emulator, templates_dir):
    m = emulation()
    _load(emulator, {**OVER_TIME_OFF, "compute_drift_per_execution": "0.05"})
    times = _run(emulator, 1, 512, 31)[1:]  # past the process's own first execution (slow by itself)
    # medians: one execution slowed by a busy machine moves a mean of 10 (CI once read 15.6, 16.4, 26.5 ms)
    windows = [np.median(times[i:i + 10]) for i in (0, 10, 20)]
    growth = m.drift_factor(10, per_execution=0.05)  # 1.63 per window of 10
    print(f"encoder_sim drifting: windows of 10 executions at {', '.join(f'{w:.1f}' for w in windows)} ms")
    assert windows[1] / windows[0] == pytest.approx(growth, rel=0.25)
    assert windows[2] / windows[1] == pytest.approx(growth, rel=0.25)


def test_with_everything_over_time_off_the_model_is_as_before(emulator, templates_dir):
    m = emulation()
    params = _load(emulator, {**OVER_TIME_OFF, "fragmentation_slowdown": "4"})
    # (a Python-backend process's very first execution is slow by itself, ~40 ms here: not emulated)
    first = _run(emulator, 1, 512, 4)[1:]
    later = _run(emulator, 1, 512, 20)[-10:]
    new, repeat = _run(emulator, 4, 400, 2)
    gpu = _gpu_ms(m, params, 512)
    assert np.mean(first) < 1.5 * np.mean(later) and np.mean(later) < 2 * gpu
    assert new < repeat + 0.5 * float(H200["new_shape_ms"]) * float(params["time_scale"])
    # the full budget after all these executions: a batch of exactly the budget still fits
    assert infer(emulator.endpoints.http, "encoder_sim", "INPUT_IDS", np.ones((32, 512), np.int32))


def test_a_bad_over_time_parameter_is_refused_by_name(local_server, restore_template_config):
    from tuner.errors import ServerSetupError

    # (on the shared server, like the test above: a refused load makes a server's stop wait its exit timeout)
    config = template("encoder_sim")
    config.parameters["fragmentation_per_1k_executions"].string_value = "-1"
    with pytest.raises(ServerSetupError, match=r"parameters.fragmentation_per_1k_executions: must be >= 0.0, got '-1'"):
        local_server.apply_config("encoder_sim", config)
