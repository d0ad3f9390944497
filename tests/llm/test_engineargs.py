"""A vLLM-backend model's engine arguments (tuner/llm/engineargs.py): which models are vLLM's, reading,
checking as vLLM would, vLLM's defaults, writing whole into a served copy, the version directory as a
load request's file overrides. Pure: no server (tests/server/test_engine_args.py has a real Triton
serve what is written)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tuner.errors import ConfigError
from tuner.llm import engineargs

PYTHON_MODEL = """
name: "llm"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
"""


def _model(root: Path, *, config: str = PYTHON_MODEL, args: dict | None = None, version: str = "1") -> Path:
    model = root / "llm"
    (model / version).mkdir(parents=True)
    (model / "config.pbtxt").write_text(config)
    if args is not None:
        (model / version / "model.json").write_text(json.dumps(args))
    return model


def test_a_vllm_model_is_the_vllm_backend_or_a_python_model_with_a_model_json(tmp_path):
    assert engineargs.is_vllm_model(_model(tmp_path / "a", config='backend: "vllm"'))
    assert engineargs.is_vllm_model(_model(tmp_path / "b", args={"model": "m"}))
    assert not engineargs.is_vllm_model(_model(tmp_path / "c"))  # python, no model.json
    assert not engineargs.is_vllm_model(tmp_path / "nothing")


def test_the_served_version_is_the_highest_numbered(tmp_path):
    model = _model(tmp_path, args={"max_num_seqs": 4})
    (model / "2").mkdir()
    (model / "10").mkdir()
    (model / "notes").mkdir()
    assert engineargs.version_dir(model) == model / "10"
    assert engineargs.version_dir(tmp_path / "new") == tmp_path / "new" / "1"


def test_read_gives_the_model_json_and_refuses_what_vllm_refuses_in_one_line(tmp_path):
    model = _model(tmp_path / "ok", args={"model": "m", "max_num_seqs": 16, "enforce_eager": True})
    assert engineargs.read(model) == {"model": "m", "max_num_seqs": 16, "enforce_eager": True}
    with pytest.raises(ConfigError, match=r"model\.json: no such file"):
        engineargs.read(_model(tmp_path / "none"))
    broken = _model(tmp_path / "broken")
    (broken / "1" / "model.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"model\.json"):
        engineargs.read(broken)


@pytest.mark.parametrize("args,message", [
    ({"max_num_seq": 8}, "max_num_seq: not an engine argument vLLM takes (did you mean max_num_seqs?)"),
    ({"max_num_seqs": 0}, "max_num_seqs: must be an integer >= 1, got 0"),
    ({"max_num_seqs": 8.5}, "max_num_seqs: must be an integer >= 1, got 8.5"),
    ({"max_num_seqs": True}, "max_num_seqs: must be an integer >= 1, got true"),
    ({"enable_chunked_prefill": "yes"}, 'enable_chunked_prefill: must be true or false, got "yes"'),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization: must be a number in (0, 1], got 1.5"),
    ({"max_num_seqs": 256, "max_num_batched_tokens": 128},
     "max_num_batched_tokens (128) must be greater than or equal to max_num_seqs (256)"),
    ({"max_num_batched_tokens": 512, "max_model_len": 2048, "enable_chunked_prefill": False},
     "max_num_batched_tokens (512) is smaller than max_model_len (2048) without chunked prefill"),
    # no max_model_len: vLLM takes the model's own context, and refuses the same (a trial ended FAIL, unsaid)
    ({"model": "tuner-tiny-llama", "max_num_batched_tokens": 690, "enable_chunked_prefill": False},
     "max_num_batched_tokens (690) is smaller than the model's context (its max_model_len) (2048) without"),
])
def test_check_names_the_key_and_the_rule(args, message):
    with pytest.raises(ConfigError) as exc:
        engineargs.check(args, source="m/1/model.json")
    assert str(exc.value).startswith("m/1/model.json: ") and message in str(exc.value)
    assert "\n" not in str(exc.value)


def test_what_vllm_accepts_passes():
    engineargs.check({"model": "m", "max_num_seqs": 8, "max_num_batched_tokens": 512, "max_model_len": 2048,
                      "enable_chunked_prefill": True, "gpu_memory_utilization": 0.5, "kv_cache_memory_bytes": None,
                      "enable_log_requests": False, "dtype": "float32"})


def test_vllms_defaults_by_device():
    cpu = engineargs.defaults("cpu")
    assert cpu == {"max_num_seqs": 128, "max_num_batched_tokens": 2048, "enable_chunked_prefill": True,
                   "gpu_memory_utilization": 0.92, "kv_cache_memory_bytes": None}
    assert engineargs.defaults("gpu_70gib")["max_num_seqs"] == 1024
    assert engineargs.resolved({"max_num_seqs": 32}, "gpu")["max_num_batched_tokens"] == 2048
    assert engineargs.resolved({"max_num_seqs": 32})["max_num_seqs"] == 32
    with pytest.raises(ConfigError, match="unknown device class 'tpu'"):
        engineargs.defaults("tpu")


def test_write_is_whole_checked_and_never_into_the_users_directory(tmp_path):
    user = _model(tmp_path / "user", args={"max_num_seqs": 4})
    served = _model(tmp_path / "served", args={"max_num_seqs": 4})
    path = engineargs.write(served, {"max_num_seqs": 64}, user_dir=user)
    assert path == served / "1" / "model.json" and json.loads(path.read_text()) == {"max_num_seqs": 64}
    with pytest.raises(ConfigError, match="refusing to write the user's own model directory"):
        engineargs.write(user, {"max_num_seqs": 64}, user_dir=user)
    with pytest.raises(ConfigError, match="not an engine argument"):
        engineargs.write(served, {"bogus": 1})
    assert json.loads(path.read_text()) == {"max_num_seqs": 64}  # a refused write leaves the file as it was
    assert json.loads((user / "1" / "model.json").read_text()) == {"max_num_seqs": 4}


def test_a_hard_linked_model_json_is_replaced_not_written_through(tmp_path):
    """The launchers' copies hard-link large files: a write must never reach the user's file."""
    user = _model(tmp_path / "user", args={"max_num_seqs": 4})
    served = tmp_path / "served" / "llm"
    (served / "1").mkdir(parents=True)
    os.link(user / "1" / "model.json", served / "1" / "model.json")
    engineargs.write(served, {"max_num_seqs": 64})
    assert json.loads((user / "1" / "model.json").read_text()) == {"max_num_seqs": 4}


def test_the_version_directory_as_file_overrides(tmp_path):
    model = _model(tmp_path, args={"max_num_seqs": 4})
    (model / "1" / "model.py").write_text("print('engine')\n")
    (model / "1" / "lib").mkdir()
    (model / "1" / "lib" / "util.py").write_text("x = 1\n")
    (model / "1" / "__pycache__").mkdir()
    (model / "1" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    files = engineargs.version_files(model, {"max_num_seqs": 8})
    assert sorted(files) == ["file:1/lib/util.py", "file:1/model.json", "file:1/model.py"]
    assert json.loads(files["file:1/model.json"]) == {"max_num_seqs": 8}
    assert engineargs.version_files(None, {"max_num_seqs": 8}).keys() == {"file:1/model.json"}
    (model / "1" / "weights.bin").write_bytes(b"\0" * (engineargs.MAX_SENT_BYTES + 1))
    with pytest.raises(ConfigError, match="keep weights out of it"):
        engineargs.version_files(model, {"max_num_seqs": 8})


@pytest.mark.slow  # vLLM imports in seconds
@pytest.mark.skipif(engineargs.installed_vllm() is None, reason="no vLLM installed here")
def test_the_tables_are_the_installed_vllms_when_it_is_their_version():
    """The keys and defaults kept here against vLLM's own AsyncEngineArgs (read in a child process)."""
    fields = engineargs.introspect()
    assert fields is not None, "vLLM is installed but does not import"
    if engineargs.installed_vllm() != engineargs.TABLE_VERSION:
        pytest.skip(f"vLLM {engineargs.installed_vllm()} here; the tables are {engineargs.TABLE_VERSION}'s")
    assert set(fields) == set(engineargs.known_keys())
    assert fields["gpu_memory_utilization"] == engineargs.defaults()["gpu_memory_utilization"]
    unset = {"max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "kv_cache_memory_bytes"}
    assert {k: fields[k] for k in unset} == dict.fromkeys(unset)  # resolved at start: the _RESOLVED table


def test_the_context_is_max_model_len_else_the_models_own(tmp_path):
    from tuner.llm.engineargs import context_tokens

    assert context_tokens({"model": "tuner-tiny-llama"}) == 2048
    assert context_tokens({"model": "tuner-tiny-llama", "max_model_len": 1024}) == 1024
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 8192}')
    assert context_tokens({"model": str(tmp_path)}) == 8192
    assert context_tokens({"model": "meta-llama/Llama-3.1-8B-Instruct"}) is None  # vLLM would download it


def test_the_gpu_memory_share_is_not_in_effect_where_the_kv_cache_is_set_in_bytes():
    from tuner.llm.engineargs import in_effect

    assert "gpu_memory_utilization" not in in_effect({"kv_cache_memory_bytes": 2**30}, "gpu")
    assert in_effect({}, "gpu")["gpu_memory_utilization"] == 0.92  # vLLM sizes the cache from it
    assert in_effect({"gpu_memory_utilization": 0.5}, "gpu_70gib")["max_num_seqs"] == 1024
