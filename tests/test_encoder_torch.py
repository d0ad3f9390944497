"""The encoder_torch template (a real PyTorch encoder) on a real tritonserver, on the CPU: it loads, answers
ragged requests in batches, and a request's embedding does not depend on the padding of its batch.

Needs PyTorch in this environment (the launcher hands tuner's site-packages to the Python backend):
without it these tests skip, unless TUNER_REQUIRE_ALL=1 (CI), where they fail saying what is missing.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc.model_config_pb2 import ModelInstanceGroup

from tuner import modelconfig
from tuner.errors import ServerSetupError
from tuner.server.client import compare_tuned_fields
from tuner.server.install import model_pythonpath
from tuner.server.local import LocalLauncher

try:  # tests/ is a rootdir without __init__.py today; keep working if it becomes a package
    from .server.contract import infer, settled_statistics, template, with_batching
except ImportError:
    from server.contract import infer, settled_statistics, template, with_batching

MODEL = "encoder_torch"
CPU_HIDDEN = 128  # the template's cpu_hidden: the embedding's width on a CPU


def _params(config) -> dict[str, str]:
    return {k: v.string_value for k, v in config.parameters.items()}


def _ids(length: int, seed: int, rows: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 30000, size=(rows, length), dtype=np.int32)


def _embedding(out: dict) -> np.ndarray:
    (tensor,) = out["outputs"]
    assert tensor["name"] == "EMBEDDING" and tensor["datatype"] == "FP32", tensor["name"]
    return np.array(tensor["data"], dtype=np.float32).reshape(tensor["shape"])


def _together(http: str, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Send every array at the same moment, one thread each; the embeddings in order."""
    start = threading.Barrier(len(arrays))

    def one(array):
        start.wait()
        return _embedding(infer(http, MODEL, "INPUT_IDS", array, timeout_s=60))

    with concurrent.futures.ThreadPoolExecutor(len(arrays)) as pool:
        return list(pool.map(one, arrays))


def test_template_declares_a_training_style_incumbent_on_either_device(templates_dir):
    config = modelconfig.load(templates_dir / MODEL / "config.pbtxt")
    assert config.name == MODEL and config.backend == "python"
    assert config.max_batch_size >= 64 and config.dynamic_batching.max_queue_delay_microseconds == 0
    (ids,) = config.input
    assert ids.allow_ragged_batch and list(ids.dims) == [-1]
    # KIND_AUTO: Triton makes it KIND_GPU where it sees a GPU, KIND_CPU elsewhere
    assert [(g.count, g.kind) for g in config.instance_group] == [(1, ModelInstanceGroup.KIND_AUTO)]
    p = _params(config)
    assert (p["gpu_layers"], p["gpu_hidden"], p["gpu_dtype"]) == ("24", "1024", "float16")  # BERT-large
    assert (p["cpu_layers"], p["cpu_hidden"]) == ("2", str(CPU_HIDDEN))
    assert (templates_dir / MODEL / "README.md").is_file()


def test_the_example_study_loads_and_points_at_the_template(templates_dir):
    from tuner.settings import read_study

    s = read_study(templates_dir.parent / "examples" / "encoder_torch.yaml")
    assert Path(s.model_repository) == templates_dir and s.model == MODEL
    assert Path(s.traffic.path).is_file() and s.search.remeasure_repeats >= 3
    assert s.search.capacity.start_speed >= s.traffic.speed  # the search starts at or above the load


def test_models_get_numpy_first_then_the_users_path_then_tuners_site_packages(triton_install):
    """How the Python backend's stub (system Python, no virtual environment) finds PyTorch."""
    import dataclasses
    import sys
    import sysconfig

    site = sysconfig.get_paths()["platlib"]
    numpy_dir = str(triton_install.model_pythonpath)
    same = dataclasses.replace(triton_install, python_version=f"{sys.version_info.major}.{sys.version_info.minor}")
    assert model_pythonpath(same, "").split(os.pathsep)[0] == numpy_dir
    assert site in model_pythonpath(same, "").split(os.pathsep)
    entries = model_pythonpath(same, os.pathsep.join(["/opt/venv/site", "", site])).split(os.pathsep)
    assert entries[:3] == [numpy_dir, "/opt/venv/site", site] and entries.count(site) == 1
    # another Python version: tuner's compiled packages would not load there, so they are not offered
    other = dataclasses.replace(triton_install, python_version="3.0")
    assert model_pythonpath(other, "/opt/venv/site").split(os.pathsep) == [numpy_dir, "/opt/venv/site"]


# --- on a real server ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(triton_install, templates_dir, tmp_path_factory):
    """A LocalLauncher serving encoder_torch alone (the session's shared server does not need PyTorch)."""
    if importlib.util.find_spec("torch") is None:
        reason = "PyTorch is not installed (pip install -e '.[torch]'; scripts/run-tests.sh installs a CPU build)"
        if os.environ.get("TUNER_REQUIRE_ALL") == "1":  # CI: a missing dependency is a failure
            pytest.fail(f"TUNER_REQUIRE_ALL=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    # the whole log kept where the test can read it: logs() quotes only the latest configuration's lines
    log_path = tmp_path_factory.mktemp("encoder_torch") / "tritonserver.log"
    with LocalLauncher(templates_dir, models=[MODEL], install=triton_install, log_path=log_path) as launcher:
        yield launcher


@pytest.fixture
def incumbent(server):
    """The server running the template's own configuration (reloaded only if a test changed it: a load
    starts a new Python process that imports PyTorch, seconds on a CPU)."""
    if compare_tuned_fields(template(MODEL), server.model_config(MODEL)):
        server.apply_config(MODEL, template(MODEL))
    return server


@pytest.mark.slow
def test_the_incumbent_batches_a_burst(incumbent):
    """No queue delay: requests that arrive while an execution runs still form the next batch."""
    server = incumbent
    before = settled_statistics(server, MODEL, 0)
    arrays = [_ids(512, seed=i) for i in range(32)]
    embeddings = _together(server.endpoints.http, arrays)
    after = settled_statistics(server, MODEL, before["inference_count"] + 32)
    assert all(e.shape == (1, CPU_HIDDEN) and np.isfinite(e).all() for e in embeddings)
    requests = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert requests == 32 and executions < requests, after["batch_stats"]


@pytest.mark.slow
def test_a_bad_shape_is_refused_by_name(incumbent):
    server = incumbent
    config = template(MODEL)
    config.parameters["cpu_heads"].string_value = "3"  # 128 is no multiple of 3
    with pytest.raises(ServerSetupError, match=r"cpu_hidden must be a positive multiple of parameters.cpu_heads"):
        server.apply_config(MODEL, config)
    assert server.is_alive()


@pytest.mark.slow
def test_loads_on_the_cpu_and_answers_ragged_requests_in_batches(server):
    running = server.model_config(MODEL)
    assert [g.kind for g in running.instance_group] == [ModelInstanceGroup.KIND_CPU]
    assert "2 layers x 128" in server.log_path.read_text(), "the model did not log its CPU shape at its load"

    server.apply_config(MODEL, with_batching(template(MODEL), 16, 200_000))
    before = settled_statistics(server, MODEL, 0)
    lengths = [5, 700, 64, 512, 1000, 33, 128, 300] * 2  # 700 and 1000 are truncated to 512
    arrays = [_ids(n, seed=i) for i, n in enumerate(lengths)]
    embeddings = _together(server.endpoints.http, arrays)
    after = settled_statistics(server, MODEL, before["inference_count"] + 16)

    for e in embeddings:
        assert e.shape == (1, CPU_HIDDEN) and np.isfinite(e).all()
    # different requests, different embeddings
    assert min(np.abs(embeddings[0] - e).max() for e in embeddings[1:8]) > 1e-3
    requests = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert requests == 16 and executions <= 4, after["batch_stats"]

    # a request of several rows answers one embedding per row
    rows = _embedding(infer(server.endpoints.http, MODEL, "INPUT_IDS", _ids(40, seed=99, rows=3)))
    assert rows.shape == (3, CPU_HIDDEN) and np.isfinite(rows).all()


@pytest.mark.slow
def test_padding_does_not_change_an_embedding(server):
    """The same short request alone and batched with a longer one (so padded to it): the same embedding.
    Without the attention mask (or with a mean over the padding) the two differ by far more."""
    http = server.endpoints.http
    # A batch of exactly two: the second request to arrive completes it; the 1-s delay is a safety net
    # (the first request alone waits it out).
    server.apply_config(MODEL, with_batching(template(MODEL), 2, 1_000_000))
    short, long = _ids(17, seed=1), _ids(400, seed=2)
    alone = _embedding(infer(http, MODEL, "INPUT_IDS", short, timeout_s=60))
    before = settled_statistics(server, MODEL, 0)
    batched, long_batched = _together(http, [short, long])
    after = settled_statistics(server, MODEL, before["inference_count"] + 2)
    assert after["execution_count"] - before["execution_count"] == 1, "the two requests were not batched"

    np.testing.assert_allclose(batched, alone, rtol=1e-4, atol=1e-5)
    assert np.abs(long_batched - alone).max() > 1e-2  # the comparison means something
