"""A trial's engine arguments (model.json) applied to a real tritonserver by each launcher that can run
here (local; remote, attached to it), proved by a Python-backend model that answers with the model.json
it read when it was loaded (tests/data/engine_models/engine_echo). The user's files stay unchanged."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from tuner import modelconfig
from tuner.errors import ConfigError
from tuner.llm import engineargs
from tuner.server.local import LocalLauncher
from tuner.server.remote import RemoteLauncher

from .contract import infer

pytestmark = pytest.mark.slow

MODELS = Path(__file__).resolve().parent.parent / "data" / "engine_models"
MODEL = "engine_echo"


def _served_args(http: str) -> dict:
    """The model.json the served model read when it was loaded."""
    answer = infer(http, MODEL, "DUMMY", np.zeros(1, dtype=np.int32))
    return json.loads(answer["outputs"][0]["data"][0])


def _tree_hash(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def server(triton_install):
    with LocalLauncher(MODELS, models=[MODEL], install=triton_install) as launcher:
        yield launcher


def test_the_local_launcher_serves_the_trials_model_json(server):
    before = _tree_hash(MODELS)
    config = modelconfig.load(MODELS / MODEL / "config.pbtxt")
    base = engineargs.read(MODELS / MODEL)
    assert _served_args(server.endpoints.http) == base  # the incumbent, as the user wrote it
    for seqs in (32, 64):
        trial = {**base, "max_num_seqs": seqs, "max_num_batched_tokens": 4096, "enable_chunked_prefill": False}
        running = server.apply_engine_args(MODEL, config, trial)
        assert running.name == MODEL
        assert _served_args(server.endpoints.http) == trial
        assert engineargs.read(server.repository / MODEL) == trial  # the served copy holds it
    assert _tree_hash(MODELS) == before  # the user's repository is never written
    assert engineargs.read(MODELS / MODEL) == base


def test_engine_arguments_vllm_refuses_are_one_line_before_any_load(server):
    config = modelconfig.load(MODELS / MODEL / "config.pbtxt")
    served = _served_args(server.endpoints.http)
    with pytest.raises(ConfigError, match=r"max_num_batched_tokens \(16\) must be greater than or equal to "
                                          r"max_num_seqs \(64\)"):
        server.apply_engine_args(MODEL, config, {"max_num_seqs": 64, "max_num_batched_tokens": 16})
    with pytest.raises(ConfigError, match="max_num_seq: not an engine argument vLLM takes"):
        server.apply_engine_args(MODEL, config, {"max_num_seq": 64})
    assert _served_args(server.endpoints.http) == served  # nothing was loaded


def test_the_remote_launcher_sends_the_version_directory_and_puts_the_original_back(server):
    before = _tree_hash(MODELS)
    config = modelconfig.load(MODELS / MODEL / "config.pbtxt")
    original = _served_args(server.endpoints.http)
    remote = RemoteLauncher(server.endpoints.http, models=[MODEL], model_repository=MODELS)
    with remote:
        for seqs in (3, 5):  # a second override differs only in model.json's content: read anew too
            trial = {**engineargs.read(MODELS / MODEL), "max_num_seqs": seqs, "kv_cache_memory_bytes": 2**30}
            remote.apply_engine_args(MODEL, config, trial)
            # loaded from the overrides: the model's code and the trial's model.json, sent whole
            assert _served_args(server.endpoints.http) == trial
    # stop() loads the original configuration from the server's own repository again
    assert _served_args(server.endpoints.http) == original
    assert _tree_hash(MODELS) == before


@pytest.mark.parametrize("load_models, loads", [(True, 2), (False, 1)])
def test_a_model_its_first_step_loads_is_loaded_once_when_the_launcher_loads_none_at_start(
        triton_install, tmp_path, load_models, loads):
    # a vLLM model's engine would start twice (the repository's model.json, then the trial's): the study
    # starts its server with load_models=False (tuner.trial.run.session, the nightly's and the soak's)
    log = tmp_path / "tritonserver.log"
    config = modelconfig.load(MODELS / MODEL / "config.pbtxt")
    trial = {**engineargs.read(MODELS / MODEL), "max_num_seqs": 8}
    with LocalLauncher(MODELS, models=[MODEL], install=triton_install, log_path=log,
                       load_models=load_models) as launcher:
        assert server_has_it_ready(launcher) == load_models
        launcher.apply_engine_args(MODEL, config, trial)
        assert _served_args(launcher.endpoints.http) == trial
    assert log.read_text().count(f"successfully loaded '{MODEL}'") == loads, log.read_text()[-2000:]


def server_has_it_ready(launcher: LocalLauncher) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{launcher.endpoints.http}/v2/models/{MODEL}/ready", timeout=5) as r:
            return r.status == 200
    except urllib.error.HTTPError:
        return False
