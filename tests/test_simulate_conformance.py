"""The batcher simulation against a real tritonserver: the same scripted arrivals sent to Triton and to
`tuner.simulate.simulate`, Triton's executions per batch size (`batch_stats`) compared with the
simulator's batches, exactly.

The arrivals are spaced 10 ms apart and the queue delay is 300 ms, so that which requests batch
together depends on the batcher's rules, not on the timing of a shared machine: every request is in
the queue long before the delay expires. Model: `echo` (tests/data/replay_models, a 2 ms sleep per
execution) with a variable dim, with and without `allow_ragged_batch`.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tuner import modelconfig
from tuner.server.local import LocalLauncher
from tuner.simulate import BatcherConfig, Profile, Requests, equal_shapes_of, simulate

ECHO = Path(__file__).resolve().parent / "data" / "replay_models" / "echo"
SPACING_S, DELAY_US, MAX_BATCH = 0.010, 300_000, 8
LENGTHS = [4, 4, 4, 8, 8, 4, 4]  # a length change closes the forming batch when shapes must be equal

pytestmark = pytest.mark.slow


def model(repo: Path, name: str, *, ragged: bool) -> None:
    """The echo model under `name`, its input variable, ragged batching on or off."""
    shutil.copytree(ECHO / "1", repo / name / "1")
    config = modelconfig.load(ECHO / "config.pbtxt")
    config.name = name
    config.max_batch_size = MAX_BATCH
    config.dynamic_batching.max_queue_delay_microseconds = DELAY_US
    config.input[0].allow_ragged_batch = ragged
    (repo / name / "config.pbtxt").write_text(modelconfig.to_text(config))


@pytest.fixture(scope="module")
def server(triton_install, tmp_path_factory):
    repo = tmp_path_factory.mktemp("conformance")
    model(repo, "equal", ragged=False)
    model(repo, "ragged", ragged=True)
    with LocalLauncher(repo, models=["equal", "ragged"], install=triton_install) as launcher:
        yield launcher, repo


def send(address: str, name: str, lengths: list[int]) -> None:
    """One request of one row per length, each sent `SPACING_S` after the one before (in order)."""
    def infer(length: int) -> None:
        body = {"inputs": [{"name": "INPUT_IDS", "shape": [1, length], "datatype": "INT32", "data": [1] * length}]}
        request = urllib.request.Request(f"http://{address}/v2/models/{name}/infer", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200

    threads = []
    for length in lengths:
        threads.append(threading.Thread(target=infer, args=(length,)))
        threads[-1].start()
        time.sleep(SPACING_S)
    for thread in threads:
        thread.join()


def triton_batches(launcher, name: str) -> Counter:
    stats = launcher.statistics(name)  # the model's entry of v2/models/<name>/stats
    return Counter({int(item["batch_size"]): int(item["compute_infer"]["count"])
                    for item in stats.get("batch_stats", []) if int(item["compute_infer"]["count"])})


def simulated_batches(config_path: Path, lengths: list[int]) -> Counter:
    config = modelconfig.load(config_path)
    requests = Requests(due_s=np.arange(len(lengths)) * SPACING_S, rows=np.ones(len(lengths), dtype=np.int64),
                        length=np.asarray(lengths, dtype=np.int64))
    profile = Profile.from_function(lambda rows, length: 2.0, rows=[1, MAX_BATCH], lengths=[4, 8])
    batcher = BatcherConfig(max_batch_size=config.max_batch_size,
                            max_queue_delay_microseconds=config.dynamic_batching.max_queue_delay_microseconds,
                            equal_shapes=equal_shapes_of(config))
    return Counter(simulate(requests, batcher, profile).exec_requests.tolist())


@pytest.mark.parametrize(("name", "expected"), [("equal", {3: 1, 2: 2}), ("ragged", {7: 1})])
def test_the_simulated_batches_are_tritons(server, name, expected):
    launcher, repo = server
    send(launcher.endpoints.http, name, LENGTHS)
    measured = triton_batches(launcher, name)
    assert measured == simulated_batches(repo / name / "config.pbtxt", LENGTHS)
    assert measured == expected  # and what the rule says: [4 4 4] [8 8] [4 4], or all seven padded
