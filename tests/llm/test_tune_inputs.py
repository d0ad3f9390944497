"""A generative study's bad input, refused before any server starts: one line, exit 2, nothing written.
Checked by `tuner tune --check` (the real run makes the same checks first) and by the commands that do
not take a generative study yet."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tuner.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llm_quickstart.yaml"
TEMPLATE = ROOT / "model_repository_templates" / "llm_vllm"


def study(tmp_path: Path, *, traffic: pd.DataFrame | None = None, repo: Path | None = None, **changes) -> Path:
    s = yaml.safe_load(EXAMPLE.read_text())
    s["model_repository"] = str(repo or TEMPLATE.parent)
    if traffic is None:
        s["traffic"]["path"] = str((EXAMPLE.parent / s["traffic"]["path"]).resolve())
    else:
        traffic.to_csv(tmp_path / "tokens.csv", index=False)
        s["traffic"] = {"path": str(tmp_path / "tokens.csv")}
    s["output"] = str(tmp_path / "out")
    for key, value in changes.items():
        section, _, name = key.partition("__")
        if name:
            s.setdefault(section, {})[name] = value
        elif value is None:
            s.pop(section, None)
        else:
            s[section] = value
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(s))
    return path


def refused(capsys, *args: str) -> str:
    assert main(list(args)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def tokens(prompt, output) -> pd.DataFrame:
    return pd.DataFrame({"timestamp": [0.0, 0.5, 1.0], "prompt_tokens": prompt, "output_tokens": output})


def test_the_example_checks_and_says_what_it_tunes(tmp_path, capsys):
    assert main(["tune", str(study(tmp_path)), "--check"]) == 0
    out = capsys.readouterr().out
    assert "vLLM batches: its engine arguments in model.json" in out
    assert "incumbent  seqs 128, batched tokens 2048, chunked prefill true" in out
    # without chunked prefill, batched tokens under the 2,048-token context: vLLM refuses those points
    assert "refused    21 of the 70 grid points: vLLM refuses them (e.g. max_num_batched_tokens (256) is " \
           "smaller than max_model_len (2048) without chunked prefill" in out
    assert "p99 TTFT <= 1000 ms, p99 TPOT <= 100 ms" in out and "output tokens per dollar" in out
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("gpu, incumbent", [
    ("a100-80gb", "seqs 256, batched tokens 2048"),  # vLLM's values under 70 GiB, and on any A100
    ("h100", "seqs 1024, batched tokens 8192"),  # an H100-class GPU's (they read 256 / 2048 there)
])
def test_the_incumbent_takes_vllms_values_for_the_studys_gpu(tmp_path, capsys, gpu, incumbent):
    assert main(["tune", str(study(tmp_path, cost={"gpu": gpu})), "--check"]) == 0
    assert f"incumbent  {incumbent}, chunked prefill true" in capsys.readouterr().out


@pytest.mark.parametrize(("changes", "expected"), [
    ({"search__max_batch_size": {"low": 1, "high": 8}}, "Triton's dynamic batcher does nothing on a vLLM-backend"),
    ({"search__strategy": "model"}, "search.strategy: model simulates Triton's dynamic batcher"),
    ({"sla": {"latency_ms": 200}}, "needs sla.ttft_ms, sla.tpot_ms and/or sla.e2e_ms"),
    ({"sla__latency_ms": 2000}, "sla.latency_ms: the encoder's limit, not used by a generative study"),
])
def test_a_study_of_the_wrong_kind_is_one_line(tmp_path, capsys, changes, expected):
    assert expected in refused(capsys, "tune", str(study(tmp_path, **changes)), "--check")


def test_traffic_without_output_lengths_is_one_line(tmp_path, capsys):
    traffic = pd.DataFrame({"timestamp": [0.0, 1.0], "prompt_tokens": [10, 20]})
    assert "no 'output_tokens' column" in refused(capsys, "tune", str(study(tmp_path, traffic=traffic)), "--check")


def test_a_request_longer_than_the_context_is_one_line(tmp_path, capsys):
    line = refused(capsys, "tune", str(study(tmp_path, traffic=tokens([100, 2000, 10], [10, 100, 10]))), "--check")
    assert "1 of 3 requests need more tokens than llm_vllm's context of 2,048" in line and "tuner traffic" not in line


def test_engine_arguments_vllm_refuses_and_a_model_that_does_not_stream_are_one_line(tmp_path, capsys):
    repo = tmp_path / "repo"
    shutil.copytree(TEMPLATE, repo / "llm_vllm", ignore=shutil.ignore_patterns("__pycache__"))
    engine = repo / "llm_vllm" / "1" / "model.json"
    good = engine.read_text()
    engine.write_text(good.replace('"seed": 0', '"seed": 0, "max_num_seqs": 0'))
    line = refused(capsys, "tune", str(study(tmp_path, repo=repo)), "--check")
    assert "max_num_seqs" in line and "model.json" in line
    engine.write_text(good)
    config = repo / "llm_vllm" / "config.pbtxt"
    config.write_text(config.read_text().replace("decoupled: true", "decoupled: false"))
    assert "not decoupled" in refused(capsys, "tune", str(study(tmp_path, repo=repo)), "--check")
    assert not (tmp_path / "out").exists()


def test_an_engine_on_more_gpus_than_the_server_is_priced_for_is_one_line(tmp_path, capsys):
    # priced as one H100 while model.json spreads the engine over 4: its tokens per dollar 4x too high
    repo = tmp_path / "repo"
    shutil.copytree(TEMPLATE, repo / "llm_vllm", ignore=shutil.ignore_patterns("__pycache__"))
    engine = repo / "llm_vllm" / "1" / "model.json"
    engine.write_text(engine.read_text().replace('"seed": 0', '"seed": 0, "tensor_parallel_size": 2, '
                                                                '"pipeline_parallel_size": 2'))
    line = refused(capsys, "tune", str(study(tmp_path, repo=repo, cost={"gpu": "h100", "gpus_per_server": 2})),
                   "--check")
    assert line.endswith("cost.gpus_per_server is 2, but llm_vllm's model.json runs its engine on 4 GPUs "
                         "(tensor_parallel_size 2 x pipeline_parallel_size 2): the server's price counts them, "
                         "set cost.gpus_per_server: 4"), line
    for cost in ({"gpu": "h100", "gpus_per_server": 4}, {"price_per_hour": 12.0}):  # counted; the server's own price
        assert main(["tune", str(study(tmp_path, repo=repo, cost=cost)), "--check"]) == 0, capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", [["profile"], ["simulate", "--profile", "p.csv"]])
def test_commands_that_read_the_dynamic_batcher_refuse_a_generative_study(tmp_path, capsys, command):
    (tmp_path / "p.csv").write_text("rows,length,ms\n1,4,1.0\n")
    line = refused(capsys, command[0], str(study(tmp_path)), *[str(tmp_path / a) if a.endswith(".csv") else a
                                                              for a in command[1:]])
    assert f"tuner {command[0]} does not take a generative study yet" in line
    assert not (tmp_path / "out").exists()
