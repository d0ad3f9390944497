"""The tiny generative model: N words are N tokens with nothing added at the start, the weights come from a
fixed seed, a second call reuses the directory, and two processes making it at once both get a whole
model and leave nothing half-written behind."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tuner
from tuner.llm.tiny import NAME, SHAPE, cache_dir, tiny_model

if importlib.util.find_spec("transformers") is None:
    if os.environ.get("TUNER_REQUIRE_ALL") == "1":  # CI: a missing dependency is a failure
        raise RuntimeError("TUNER_REQUIRE_ALL=1 but transformers is not installed (the 'llm' extra)")
    pytest.skip("transformers is not installed (pip install -e '.[llm]')", allow_module_level=True)

ROOT = Path(tuner.__file__).resolve().parent.parent


@pytest.fixture(autouse=True, scope="module")
def engine_files_take_turns():
    """This file starts no vLLM engine: it does not wait for the engine lock that tests/llm/conftest.py's
    fixture of this name takes for every file here (in CI that wait was this file's whole setup time)."""
    yield


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("llm"))


def test_n_words_are_n_prompt_tokens_with_nothing_added(made):
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(made)
    for n in (1, 7, 300):
        text = " ".join(f"w{(i * 37) % 4000}" for i in range(n))
        ids = tokenizer(text)["input_ids"]
        assert len(ids) == n
        assert tokenizer.decode(ids) == text  # the words round-trip, joined by spaces
    assert len(tokenizer) == SHAPE["vocab_size"]
    config = AutoConfig.from_pretrained(made)
    assert (config.num_hidden_layers, config.hidden_size, config.max_position_embeddings) == (4, 256, 2048)


def test_a_second_call_reuses_the_model(made):
    weights = made / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert tiny_model(made.parent) == made and weights.stat().st_mtime_ns == stamp


def test_two_processes_at_once_both_get_a_whole_model_of_the_same_weights(made, tmp_path):
    code = "from tuner.llm.tiny import tiny_model; print(tiny_model())"
    env = {**os.environ, "TUNER_LLM_CACHE": str(tmp_path), "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs[0] == outs[1] and Path(outs[0]).parent == tmp_path
    assert sorted(p.name for p in tmp_path.iterdir()) == [Path(outs[0]).name]  # no scratch left behind
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in Path(outs[0]).iterdir()}
    # a fixed seed: made in other processes, the weights are this process's, byte for byte
    digest = [hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest() for d in (made, Path(outs[0]))]
    assert digest[0] == digest[1]


def test_the_cache_is_the_users_unless_named(monkeypatch, tmp_path):
    monkeypatch.delenv("TUNER_LLM_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "tuner" / "llm"
    monkeypatch.setenv("TUNER_LLM_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine" and NAME == "tuner-tiny-llama"
