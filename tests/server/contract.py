"""The launcher contract: the same tests for every way of getting a Triton (local, remote, docker).

A test module subclasses `LauncherContract` and provides a module-scoped fixture `launcher`: a started,
ready launcher serving the template models `encoder_sim` and `matmul_cpu`, which the tests may
reconfigure (each test reloads the template configuration it changes). Like
optuna/testing/pytest_samplers.py: write a behaviour here once, and every launcher is held to it.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tuner import modelconfig
from tuner.errors import ServerSetupError
from tuner.modelconfig import ModelConfig

TEMPLATES_DIR = Path(__file__).resolve().parents[2] / "model_repository_templates"


def template(model: str) -> ModelConfig:
    return modelconfig.load(TEMPLATES_DIR / model / "config.pbtxt")


def with_batching(config: ModelConfig, max_batch_size: int, delay_us: int, instances: int | None = None) -> ModelConfig:
    out = ModelConfig()
    out.CopyFrom(config)
    out.max_batch_size = max_batch_size
    out.dynamic_batching.max_queue_delay_microseconds = delay_us
    del out.dynamic_batching.preferred_batch_size[:]
    if instances is not None:
        for group in out.instance_group:
            group.count = instances
    return out


def infer(http: str, model: str, name: str, array: np.ndarray, timeout_s: float = 30.0) -> dict:
    """One inference over plain HTTP/JSON (thread-safe: no shared client). Raises urllib's HTTPError."""
    datatype = {"int32": "INT32", "float32": "FP32"}[str(array.dtype)]
    body = {"inputs": [{"name": name, "shape": list(array.shape), "datatype": datatype,
                        "data": array.ravel().tolist()}]}
    req = urllib.request.Request(f"http://{http}/v2/models/{model}/infer", data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def settled_statistics(launcher, model: str, inferences: int, timeout_s: float = 5.0) -> dict:
    """The model's statistics once they count `inferences` and its executions have stopped changing.

    Triton updates them just after it answers, and a backend reports a batch's requests and the batch
    itself in two calls: CI once read an execution_count one short of what inference_count had already
    counted. So the executions must read the same twice, 0.2 s apart."""
    deadline = time.monotonic() + timeout_s
    stats = launcher.statistics(model)
    while stats["inference_count"] < inferences and time.monotonic() < deadline:
        time.sleep(0.05)
        stats = launcher.statistics(model)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        again = launcher.statistics(model)
        if again["execution_count"] == stats["execution_count"]:
            return again
        stats = again
    return stats


def burst(http: str, model: str, name: str, arrays: list[np.ndarray], concurrency: int) -> tuple[int, list[str]]:
    """Send all `arrays` from `concurrency` threads at once; (successes, error messages)."""

    def one(array):
        try:
            infer(http, model, name, array)
            return None
        except urllib.error.HTTPError as exc:
            return exc.read().decode(errors="replace")

    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(one, arrays))
    errors = [r for r in results if r is not None]
    return len(results) - len(errors), errors


class LauncherContract:
    """Subclass in a test module that provides a module-scoped `launcher` fixture."""

    def test_endpoints_are_loopback_and_alive(self, launcher):
        ep = launcher.endpoints
        assert ep.http.startswith("127.0.0.1:") and ep.grpc.startswith("127.0.0.1:")
        assert ep.metrics.startswith("http://127.0.0.1:") and ep.metrics.endswith("/metrics")
        assert launcher.is_alive()
        launcher.wait_ready(10)

    def test_a_running_server_has_not_exited(self, launcher):
        # what a replay's watch asks every second: a live server's replay must never be cut short
        assert launcher.exited() is False

    def test_apply_config_is_read_back(self, launcher):
        base = template("matmul_cpu")
        try:
            for mbs, delay in ((8, 1000), (32, 0)):
                running = launcher.apply_config("matmul_cpu", with_batching(base, mbs, delay))
                assert running.max_batch_size == mbs
                assert running.dynamic_batching.max_queue_delay_microseconds == delay
                now = launcher.model_config("matmul_cpu")
                assert (now.max_batch_size, now.dynamic_batching.max_queue_delay_microseconds) == (mbs, delay)
        finally:
            launcher.apply_config("matmul_cpu", base)

    def test_instance_count_is_applied(self, launcher):
        base = template("matmul_cpu")
        try:
            running = launcher.apply_config("matmul_cpu", with_batching(base, 16, 0, instances=2))
            assert [g.count for g in running.instance_group] == [2]
        finally:
            launcher.apply_config("matmul_cpu", base)

    def test_concurrent_requests_are_batched(self, launcher):
        base = template("matmul_cpu")
        try:
            launcher.apply_config("matmul_cpu", with_batching(base, 16, 100000))
            rows = [np.full((1, 256), i, dtype=np.float32) for i in range(48)]
            ok, errors = burst(launcher.endpoints.http, "matmul_cpu", "INPUT", rows, concurrency=16)
            assert (ok, errors) == (48, [])
            stats = settled_statistics(launcher, "matmul_cpu", 48)
            assert stats["inference_count"] == 48, stats
            assert stats["execution_count"] < stats["inference_count"] / 2, stats["batch_stats"]
            metrics = launcher.metrics()
            assert metrics["nv_inference_count"] >= 48
            assert metrics["nv_inference_exec_count"] < metrics["nv_inference_count"]
        finally:
            launcher.apply_config("matmul_cpu", base)

    def test_refused_config_is_a_setup_error(self, launcher):
        bad = with_batching(template("matmul_cpu"), 8, 0)
        bad.dynamic_batching.preferred_batch_size.append(64)  # Triton: preferred size must be <= max batch size
        with pytest.raises(ServerSetupError, match="matmul_cpu.*refused"):
            launcher.apply_config("matmul_cpu", bad)
        # the server and the model survive a refused load
        assert launcher.is_alive()
        launcher.apply_config("matmul_cpu", template("matmul_cpu"))

    def test_missing_model_is_a_setup_error(self, launcher):
        config = template("matmul_cpu")
        config.name = "no_such_model"
        with pytest.raises(ServerSetupError, match="no_such_model"):
            launcher.apply_config("no_such_model", config)

    def test_statistics_of_a_missing_model_is_a_setup_error(self, launcher):
        with pytest.raises(ServerSetupError, match="no_such_model"):
            launcher.statistics("no_such_model")

    def test_calls_answer_quickly(self, launcher):
        started = time.monotonic()
        launcher.statistics("encoder_sim")
        launcher.model_config("encoder_sim")
        launcher.metrics()
        assert time.monotonic() - started < 3
