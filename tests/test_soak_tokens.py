"""A generative soak's analysis (pure): windows of a vLLM-served model in tokens, constructed here, read
by the one `analyze` as soak.json's `unit: tokens` says: the drift verdict on TTFT, TPOT, KV-cache use
and preemptions with the offered tokens as covariate, the token SLA's projected and observed breach,
the engine table, no batch or capacity figures; the window's row and the engine's gauges over it; what
a generative soak soaks (its engine arguments) and the one-line refusals, with no server."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tuner.cli import main
from tuner.llm import engineargs
from tuner.llm.engine_metrics import EngineFigures
from tuner.measurement_tokens import measure_tokens
from tuner.settings import read_study
from tuner.soak import NOT_MEASURED, analyze, soak_engine
from tuner.soak.analysis import observed_break, summary_lines
from tuner.soak.analysis._tokens import gauge_figures, offered_tokens_per_s, window_row

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "llm_quickstart.yaml"
SLA = {"latency_ms": None, "percentile": 99.0, "max_error_rate": 0.001, "ttft_ms": 1000.0, "tpot_ms": 100.0}
META = {"unit": "tokens", "sla": SLA, "window_hours": 0.5, "capacity": None}


def windows(n: int = 12, *, seed: int = 0, ttft=None, kv=None, preempt=None, tokens=None) -> pd.DataFrame:
    """`n` half-hour windows of a generative soak, flat with small noise unless a figure's series is
    given (a function of the age in hours and the offered tokens per second)."""
    rng = np.random.default_rng(seed)
    age = (np.arange(n) + 0.5) * 0.5
    load = (tokens(age) if tokens else 400.0) + 40.0 * rng.standard_normal(n)

    def series(given, base, noise):
        return (given(age, load) if given else np.full(n, base)) * (1 + noise * rng.standard_normal(n))

    requests = np.full(n, 200)
    preemptions = np.round(series(preempt, 0.0, 0.0)).astype(int)
    return pd.DataFrame({
        "window": np.arange(n), "segment": 0, "restarted": False, "t_hours": age, "age_hours": age,
        "start_hours": age - 0.25, "end_hours": age + 0.25, "requests": requests, "valid": True,
        "offered_rps": 2.0, "offered_tokens_per_s": load, "errors": 0, "error_rate": 0.0,
        "ttft_p50_ms": series(None, 120.0, 0.02), "ttft_p99_ms": series(ttft, 400.0, 0.02),
        "tpot_p50_ms": series(None, 30.0, 0.02), "tpot_p99_ms": series(None, 45.0, 0.02),
        "kv_cache_usage_peak": series(kv, 0.30, 0.02), "kv_cache_usage_mean": series(None, 0.12, 0.02),
        "engine_requests": requests, "preemptions": preemptions, "preemptions_per_request": preemptions / requests,
        "running_peak": 20.0, "waiting_peak": 0.0, "memory_mb": series(None, 1800.0, 0.002),
        "sla_ok": True,
    })


def trends(findings) -> dict:
    return {t.figure: t for t in findings.analysis.trends}


def test_a_flat_generative_soak_has_no_drift_and_says_what_an_engine_does_not_measure():
    findings = analyze(windows(), pd.DataFrame(), META)
    assert findings.verdict == "no drift detected" and findings.unit == "tokens"
    by = trends(findings)
    assert {"ttft_p99_ms", "ttft_p50_ms", "tpot_p99_ms", "tpot_p50_ms", "error_rate", "kv_cache_usage_peak",
            "kv_cache_usage_mean", "preemptions_per_request", "memory_mb"} == set(by)
    assert not any(name.startswith(("compute", "latency", "fill")) for name in by)
    assert by["kv_cache_usage_peak"].load == "offered_tokens_per_s"  # the load covariate is in tokens
    assert findings.analysis.batches is None and findings.analysis.capacity is None
    assert NOT_MEASURED in findings.notes and NOT_MEASURED in findings.text()
    assert "batches" not in findings.tables()
    assert findings.analysis.limits == {"ttft_p99_ms": "> 1000", "tpot_p99_ms": "> 100"}
    engine = findings.tables()["engine (vLLM's own statistics)"].set_index("figure")
    assert engine.loc["preemptions", "total"] == 0 and engine.loc["kv_cache_usage_peak", "largest"] < 0.4
    data = findings.as_dict()
    assert data["unit"] == "tokens" and data["batches"] is None
    assert json.loads(json.dumps(data, default=str))["engine"][0]["figure"] == "preemptions"


def test_kv_cache_use_and_preemptions_that_grow_with_age_are_drift_and_ttft_that_does_not_is_not():
    findings = analyze(windows(kv=lambda t, load: 0.30 + 0.05 * t, preempt=lambda t, load: 4.0 * t), pd.DataFrame(),
                       META)
    by = trends(findings)
    assert findings.verdict == "drift"
    assert by["kv_cache_usage_peak"].verdict == "drift" and by["kv_cache_usage_peak"].direction == "up"
    assert by["kv_cache_usage_peak"].slope_low <= 0.05 <= by["kv_cache_usage_peak"].slope_high
    assert by["preemptions_per_request"].verdict == "drift"
    assert by["ttft_p99_ms"].verdict == "no drift detected"
    lines = summary_lines(findings.as_dict(), {**META, "plan": {"hours": 6, "speed": 1}})
    assert "vLLM engine, in tokens" in lines[0] and "kv_cache_usage_peak" in lines[0]
    assert "preemption(s)" in lines[1] and "KV cache at most" in lines[1]


def test_kv_cache_use_that_follows_the_offered_tokens_is_not_drift():
    findings = analyze(windows(tokens=lambda t: 300.0 + 40.0 * t,  # the load rises over the soak
                               kv=lambda t, load: 0.001 * load), pd.DataFrame(), META)
    kv = trends(findings)["kv_cache_usage_peak"]
    assert kv.verdict == "no drift detected", kv
    assert kv.load_slope == pytest.approx(0.001, rel=0.2)


def test_ttft_creeping_towards_its_limit_projects_the_breach_and_the_restart():
    findings = analyze(windows(ttft=lambda t, load: 400.0 + 50.0 * t), pd.DataFrame(), META)
    breach = findings.analysis.breach
    assert breach is not None and breach.figure == "ttft_p99_ms"
    assert breach.hours == pytest.approx((1000.0 - 400.0) / 50.0, rel=0.15)
    assert findings.restart is not None and findings.restart.breach is breach


def test_a_persistent_token_sla_break_is_observed_by_the_figure_that_broke():
    table = windows()
    table.loc[8:, "tpot_p99_ms"] = 150.0  # over the 100 ms TPOT limit from window 8 on
    table.loc[8:, "sla_ok"] = False
    table.loc[3, "sla_ok"] = False  # a single bad window: a blip
    seen = observed_break(table, SLA, window_hours=0.5, tokens=True)
    assert seen.figure == "tpot_p99_ms" and seen.limit == 100.0
    assert seen.hours == pytest.approx(table.loc[8, "age_hours"] - 0.25)
    table.loc[10:, "error_rate"] = 0.05
    table.loc[8:9, "sla_ok"] = True
    assert observed_break(table, SLA, window_hours=0.5, tokens=True).figure == "error_rate"
    findings = analyze(table, pd.DataFrame(), META)
    assert findings.observed.figure == "error_rate" and findings.restart is not None
    # the TPOT trend through the jump reaches its limit before the errors began: that breach is the advice's
    assert findings.analysis.breach.figure == "tpot_p99_ms" and findings.analysis.breach.hours < findings.observed.hours


def test_a_window_is_named_broken_by_the_figure_over_its_limit_not_by_a_missing_tpot():
    table = windows()
    table["latency_p99_ms"] = 2000.0
    table.loc[8:, "latency_p99_ms"] = 9000.0  # end to end over its 5,000 ms limit from window 8 on
    table.loc[8:, "tpot_p99_ms"] = math.nan  # every request one token: no TPOT, which meets its limit
    table.loc[8:, "sla_ok"] = False
    e2e = {**SLA, "e2e_ms": 5000.0}
    seen = observed_break(table, e2e, window_hours=0.5, tokens=True)
    assert seen.figure == "latency_p99_ms" and seen.limit == 5000.0
    assert "latency_p99_ms" in [t.figure for t in analyze(table, pd.DataFrame(), {**META, "sla": e2e}).analysis.trends]
    table.loc[8:, "ttft_p99_ms"] = math.nan  # no token came back at all: TTFT is the one that broke
    table.loc[8:, "latency_p99_ms"] = math.nan
    assert observed_break(table, e2e, window_hours=0.5, tokens=True).figure == "ttft_p99_ms"


def test_too_few_windows_still_give_the_engine_table_and_the_reason():
    findings = analyze(windows(3, preempt=lambda t, load: np.array([0, 2, 5])), pd.DataFrame(), META)
    assert findings.analysis is None and "the trend test needs at least 6" in findings.error
    engine = findings.tables()["engine (vLLM's own statistics)"].set_index("figure")
    assert engine.loc["preemptions", "total"] == 7 and engine.loc["preemptions", "last window"] == 5


def test_the_window_row_counts_tokens_and_the_engine_gauges_over_the_window():
    records = pd.DataFrame({
        "due_s": [0.0, 0.5, 1.0, 1.5], "end_s": [1.0, 1.4, 2.2, 2.4], "send_lag_ms": [1.0] * 4,
        "ok": [True, True, True, False], "prompt_tokens": [10, 20, 30, 40], "tokens": [5, 8, 4, 0],
        "first_token_s": [0.2, 0.6, 1.3, np.nan], "last_token_s": [1.0, 1.4, 2.2, np.nan],
        "itl_ms": [[200.0] * 4, [100.0] * 7, [300.0] * 3, []],
    })
    m = measure_tokens(records, speed=1.0, warmup_s=0.5, lag_budget_ms=50.0, ttft_ms=1000.0, tpot_ms=100.0)
    engine = EngineFigures(requests=3, prompt_tokens=60, generation_tokens=17, preemptions=2, running=0.0,
                           waiting=0.0, kv_cache_usage=0.0, histograms={})
    gauges = gauge_figures([{"kv_cache_usage": 0.2, "running": 2, "waiting": 1},
                            {"kv_cache_usage": 0.6, "running": 3, "waiting": 0}], engine)
    assert gauges["kv_cache_usage_peak"] == 0.6 and gauges["kv_cache_usage_end"] == 0.0
    assert gauges["kv_cache_usage_mean"] == pytest.approx(0.8 / 3) and gauges["waiting_peak"] == 1
    part = pd.DataFrame({"timestamp": [0.0, 0.5, 1.0, 1.5], "prompt_tokens": [10, 20, 30, 40],
                         "output_tokens": [5, 8, 4, 6]})
    offered = offered_tokens_per_s(part, speed=1.0, warmup_s=0.5, duration_s=m.duration_s)
    assert offered == pytest.approx((28 + 34 + 46) / 1.0)
    row = window_row(m, sla_ok=False, sla_reason="errors", engine=engine, gauges=gauges, sent_output_tokens=17,
                     offered_tokens=offered, memory={"memory_mb": 100.0})
    assert row["output_tokens"] == 12 and row["errors"] == 1 and row["requests"] == 3
    assert row["sent_output_tokens"] == row["engine_generation_tokens"] == 17
    assert row["preemptions"] == 2 and row["preemptions_per_request"] == pytest.approx(2 / 3)
    assert row["ttft_p99_ms"] == pytest.approx(m.ttft(99)) and row["latency_max_ms"] == pytest.approx(1200.0)
    assert math.isnan(window_row(m, sla_ok=True, sla_reason="", engine=None, gauges=gauge_figures([], None),
                                 sent_output_tokens=0, offered_tokens=offered, memory={})["preemptions"])
    assert math.isnan(row["emulated_overrun_share"])  # a real engine counts no emulated steps
    emulated = dataclasses.replace(engine, emulated_steps=200, emulated_overruns=30)
    assert window_row(m, sla_ok=True, sla_reason="", engine=emulated, gauges=gauges, sent_output_tokens=17,
                      offered_tokens=offered, memory={})["emulated_overrun_share"] == pytest.approx(0.15)


def test_an_emulated_gpu_running_late_in_a_window_is_in_the_engine_table_and_the_summary():
    late = windows(8).assign(emulated_overrun_share=[0.01] * 7 + [0.12])
    findings = analyze(late, pd.DataFrame(), META)
    engine = findings.tables()["engine (vLLM's own statistics)"].set_index("figure")
    assert engine.loc["emulated_overrun_share", "largest"] == pytest.approx(0.12)
    assert "emulated GPU: up to 12% of a window's steps ran past" in "\n".join(summary_lines(findings.as_dict(), META))
    on_time = analyze(windows(8).assign(emulated_overrun_share=0.01), pd.DataFrame(), META)
    assert "emulated GPU" not in "\n".join(summary_lines(on_time.as_dict(), META))
    real = analyze(windows(8), pd.DataFrame(), META)  # no column, or NaN: a real engine has no such row
    assert "emulated_overrun_share" not in real.tables()["engine (vLLM's own statistics)"]["figure"].tolist()


# --- what a generative soak soaks (no server) ------------------------------------------------------


@pytest.fixture
def study(tmp_path) -> Path:
    s = yaml.safe_load(EXAMPLE.read_text())
    repo = tmp_path / "models"
    shutil.copytree(ROOT / "model_repository_templates" / "llm_vllm", repo / "llm_vllm")
    s.update(model_repository=str(repo), output=str(tmp_path / "out"))
    s["traffic"]["path"] = str((EXAMPLE.parent / s["traffic"]["path"]).resolve())
    path = tmp_path / "llm.yaml"
    path.write_text(yaml.safe_dump(s))
    return path


def test_the_engine_soaked_is_the_models_resolved_then_the_recommendation_then_config(study, tmp_path):
    settings = read_study(str(study))
    out = tmp_path / "out"
    _, args, source = soak_engine(settings, out)
    own = engineargs.read(Path(settings.model_repository) / "llm_vllm")
    assert args == engineargs.in_effect(own, "cpu") and "(the model's own)" in source
    # the KV cache is set in bytes: vLLM ignores gpu_memory_utilization, which the soak said it ran with (0.92)
    assert "gpu_memory_utilization" not in args and "gpu_memory_utilization" in engineargs.resolved(own, "cpu")
    assert args["max_num_seqs"] == 128 and args["kv_cache_memory_bytes"] == own["kv_cache_memory_bytes"]
    (out / "recommended").mkdir(parents=True)
    (out / "recommended" / "model.json").write_text(json.dumps({**own, "max_num_seqs": 8}))
    _, args, source = soak_engine(settings, out, ["max_num_batched_tokens=512"])
    assert args["max_num_seqs"] == 8 and args["max_num_batched_tokens"] == 512
    assert "recommendation" in source and "max_num_batched_tokens=512" in source
    given = tmp_path / "mine.json"
    given.write_text(json.dumps({**own, "max_num_seqs": 4}))
    assert soak_engine(settings, out, config_path=given)[1]["max_num_seqs"] == 4


def test_an_encoder_study_soaks_no_engine():
    settings = read_study(str(ROOT / "examples" / "quickstart.yaml"))
    assert soak_engine(settings, "/nonexistent") is None


@pytest.mark.parametrize("args, message", [
    (["--set", "max_batch_size=8"], "--set max_batch_size: a field of Triton's dynamic batcher; llm_vllm is "
                                    "batched by vLLM"),
    (["--set", "max_num_seqs=64", "--set", "max_num_batched_tokens=32"], "must be greater than or equal to"),
    (["--config", "{bad"], "not valid JSON"),
])
def test_a_generative_soaks_bad_input_is_one_line_and_exit_2(study, tmp_path, capsys, args, message):
    if args[0] == "--config":
        (tmp_path / "bad.json").write_text(args[1])
        args = ["--config", str(tmp_path / "bad.json")]
    assert main(["soak", str(study), "--hours", "0.05", "--speed", "1", "--window", "0.5", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "out" / "soak").exists()


def test_a_generative_study_without_a_token_sla_is_refused(study, capsys):
    s = yaml.safe_load(study.read_text())
    s["sla"] = {"latency_ms": 200}
    study.write_text(yaml.safe_dump(s))
    assert main(["soak", str(study), "--hours", "0.05", "--speed", "1", "--window", "0.5"]) == 2
    assert "needs sla.ttft_ms, sla.tpot_ms and/or sla.e2e_ms" in capsys.readouterr().err


def test_the_printed_time_counts_each_windows_wait_for_its_last_requests(study, tmp_path, capsys, monkeypatch):
    # a generative window ends when its last requests have streamed: on a CPU that doubled the wall time
    # the soak announced (18-s windows took 33 s). The estimate adds a mean request's life at the SLA's
    # limits per window: 1 s + (mean output tokens - 1) x 100 ms
    import types

    from tuner import soak
    from tuner.soak import SoakFindings
    from tuner.study import study_traffic

    findings = SoakFindings(analysis=None, restart=None, error="not run")
    monkeypatch.setattr(soak, "run_soak", lambda *a, **k: types.SimpleNamespace(findings=findings,
                                                                               folder=tmp_path / "out" / "soak"))
    assert main(["soak", str(study), "--hours", "0.0125", "--speed", "0.25", "--window", "0.3",
                 "--no-capacity", "--quiet"]) == 1
    out = capsys.readouterr().out
    tokens = study_traffic(read_study(str(study)))["output_tokens"].mean()
    drain = 1.0 + (tokens - 1) * 0.1
    assert drain == pytest.approx(soak.window_drain_s(read_study(str(study)), study_traffic(read_study(str(study)))))
    windows, replay_s = 10, 0.0125 * 3600 / 0.25  # 10 windows of 18 s
    assert f"{windows} windows of 0.3 min" in out and "3.0 min of replay" in out, out
    assert f"up to about {(replay_s + windows * drain) / 60:.1f} min" in out, out
    assert f"up to {drain:.0f} s for its last requests to finish generating" in out, out
