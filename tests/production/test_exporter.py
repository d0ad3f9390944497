"""The exporter and the dashboard against real parts: a tritonserver serving `echo` takes replayed
traffic; a Prometheus of the test's own scrapes it and `tuner exporter` (a process of its own, on
127.0.0.1), and evaluates deploy/prometheus/tuner-rules.yml. Prometheus holds what the exporter's
/metrics said; every query of deploy/grafana/tuner-dashboard.json (its panels and its annotation, the
variables substituted) returns data; the recording rules agree with the dashboard's fill rate; the
exporter serves until SIGTERM and
stops cleanly."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.production_audit import PROFILE, prometheus_server, write_study
from tuner.localhost import free_ports
from tuner.production import Prometheus
from tuner.replay import replay
from tuner.server.local import LocalLauncher
from tuner.settings import ReplaySettings

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "data" / "replay_models"  # echo: max_batch_size 32
DASHBOARD = ROOT / "deploy" / "grafana" / "tuner-dashboard.json"
RULES = ROOT / "deploy" / "prometheus" / "tuner-rules.yml"
RATE, DURATION_S, BURST, PRICE, CAPACITY = 250.0, 12.0, 8, 2.0, 1000.0

pytestmark = pytest.mark.slow


def wait_for(what: str, check, timeout_s: float = 60.0):
    """`check()`'s first truthy answer, polled; fails naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = check()
        if answer:
            return answer
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s:g} s")
        time.sleep(0.5)


def baseline_dir(tmp: Path) -> Path:
    """A `tuner tune` output as the baseline: capacity CAPACITY req/s on the study's SLA and traffic."""
    out = tmp / "tuned"
    out.mkdir()
    summary = {
        "best": {"params": {"max_batch_size": 32, "max_queue_delay_microseconds": 1000}, "capacity_rps": CAPACITY},
        "sla": {"latency_ms": 200, "percentile": 99.0},
        "traffic": {"path": str(PROFILE)},
    }
    (out / "summary.json").write_text(json.dumps(summary))
    return out


def nightly_dir(tmp: Path, night: datetime) -> Path:
    out = tmp / "nightly"
    out.mkdir()
    entry = {"night": night.strftime("%Y-%m-%dT%H%M%SZ"), "decision": "keep", "exit_code": 0}
    (out / "history.jsonl").write_text(json.dumps(entry) + "\n")
    return out


@pytest.fixture(scope="module")
def stack(prometheus_tools, triton_install, tmp_path_factory):
    """tritonserver (echo) with replayed traffic, Prometheus scraping it and the exporter; yields a dict."""
    tmp = tmp_path_factory.mktemp("stack")
    prom_port, exporter_port = free_ports(2)
    night = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=3)
    with LocalLauncher(MODELS, models=["echo"], install=triton_install) as server:
        metrics = urllib.parse.urlsplit(server.endpoints.metrics).netloc
        exporter = f"127.0.0.1:{exporter_port}"
        with prometheus_server(tmp / "data", scrape=[metrics, exporter], scrape_s=1.0, port=prom_port,
                               rules=[RULES], wait_for=1) as url:
            n = int(RATE * DURATION_S)  # bursts of BURST due together: batches form
            traffic = pd.DataFrame({"timestamp": (np.arange(n) // BURST) * BURST / RATE, "seq_len": 16})
            replay(server.endpoints, "echo", traffic, speed=1.0, settings=ReplaySettings(workers=1, warmup_s=0.0))
            study = write_study(tmp, model="echo", repository=MODELS, price_per_hour=PRICE)
            log = open(tmp / "exporter.log", "w")
            proc = subprocess.Popen(
                [sys.executable, "-m", "tuner", "exporter", str(study), "--prometheus", url,
                 "--port", str(exporter_port), "--window", "1m", "--baseline", str(baseline_dir(tmp)),
                 "--nightly", str(nightly_dir(tmp, night))],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                start_new_session=True,
            )
            try:
                prom = Prometheus(url)
                # Prometheus has scraped the exporter's audit (which saw the replay's minute)
                wait_for("Prometheus scraping the exporter's fill rate",
                         lambda: prom.query('tuner_batch_fill_ratio{model="echo"}'))
                yield {"url": url, "prom": prom, "exporter": exporter, "night": night, "requests": n}
            finally:
                if proc.poll() is None:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait()
                log.close()


def value(result: list[dict]) -> float:
    (only,) = result
    return float(only["value"][1])


def test_prometheus_holds_what_the_exporters_metrics_say(stack):
    prom = stack["prom"]
    up = prom.query(f'up{{instance="{stack["exporter"]}"}}')
    assert value(up) == 1
    with urllib.request.urlopen(f"http://{stack['exporter']}/metrics", timeout=10) as r:
        text = r.read().decode()
    served = {s.name: s for f in text_string_to_metric_families(text) for s in f.samples}
    for name in ("tuner_requests_per_dollar", "tuner_batch_fill_ratio", "tuner_throughput_ratio",
                 "tuner_recoverable_dollars_per_month", "tuner_baseline_requests_per_dollar",
                 "tuner_gpu_price_dollars_per_hour", "tuner_exporter_up"):
        assert name in served, name
        stored = value(prom.query(f'{name}{{model="echo"}}'))
        assert stored == pytest.approx(served[name].value), name
        assert served[name].labels["model"] == "echo" and served[name].labels["gpu"] == "cpu"
        assert served[name].labels["version"] == "1"
    assert served["tuner_exporter_up"].value == 1
    # the minute's figures: the replay's requests (all of them in the window), in batches
    rps = served["tuner_production_requests_per_second"].value
    assert served["tuner_requests_per_dollar"].value == pytest.approx(rps * 3600 / PRICE)
    # what Prometheus says of the exporter's window; and about the replay's requests in it. Prometheus
    # started scraping Triton just before the replay, inside the minute: the figures divide by the
    # seconds its samples cover, not by the minute (increase() extrapolates to the window's edges, or
    # half a scrape interval where the samples start later: a few per cent)
    end = served["tuner_audit_window_end_timestamp_seconds"].value
    covered = served["tuner_audit_covered_seconds"].value
    assert DURATION_S <= covered < 60
    increase = prom.query('sum(increase(nv_inference_request_success{model="echo"}[60s]))', at=end)
    assert rps == pytest.approx(value(increase) / covered, rel=0.05)
    assert rps == pytest.approx(stack["requests"] / covered, rel=0.1)
    assert 3 / 32 < served["tuner_batch_fill_ratio"].value <= 1
    assert served["tuner_throughput_ratio"].value == pytest.approx(rps / CAPACITY)
    assert served["tuner_baseline_requests_per_dollar"].value == pytest.approx(CAPACITY * 3600 / PRICE)
    verdict = prom.query('tuner_nightly_verdict{model="echo", decision="keep"}')
    assert value(verdict) == 1
    when = value(prom.query('tuner_nightly_last_run_timestamp_seconds{model="echo"}'))
    assert when == stack["night"].timestamp()


def substituted(expr: str) -> str:
    """A dashboard query as Grafana sends it: the model and every instance chosen."""
    return expr.replace("$model", "echo").replace("$instance", ".*")


def dashboard_queries() -> list[tuple[str, str]]:
    board = json.loads(DASHBOARD.read_text())
    queries = [(f"{p['title']} / {t['refId']}", t["expr"]) for p in board["panels"] for t in p["targets"]]
    queries += [(f"annotation {a['name']}", a["expr"]) for a in board["annotations"]["list"] if "expr" in a]
    return queries


def test_the_dashboard_has_its_variables_and_lines():
    board = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert {"datasource", "model", "instance"} <= set(variables)
    assert variables["instance"]["includeAll"] and variables["instance"]["allValue"] == ".*"
    panels = {p["title"]: p for p in board["panels"]}
    assert set(panels) == {"Requests per dollar", "Batch fill rate", "Throughput ratio",
                           "Queue vs compute time per request", "Recoverable budget"}

    def lines(title: str) -> list:
        return [s["value"] for s in panels[title]["fieldConfig"]["defaults"]["thresholds"]["steps"]][1:]

    assert lines("Batch fill rate") == [0.5] and lines("Throughput ratio") == [0.6, 0.75]
    assert any("baseline" in t["legendFormat"] for t in panels["Requests per dollar"]["targets"])
    for _, expr in dashboard_queries():  # every panel follows the variables
        assert '$model' in expr
        if "nv_inference" in expr:
            assert re.search(r'instance=~"\$instance"', expr), expr


@pytest.mark.parametrize("name, expr", dashboard_queries())
def test_every_dashboard_query_returns_data(stack, name, expr):
    result = stack["prom"].query(substituted(expr))
    values = [float(r["value"][1]) for r in result]
    assert values and all(math.isfinite(v) for v in values), f"{name}: {substituted(expr)} -> {result}"


def recorded(prom: Prometheus, rule: str) -> tuple[float, float]:
    """The recording rule's latest (timestamp, value) for echo, waited for."""
    (series,) = wait_for(f"the recording rule {rule}", lambda: prom.query(f'{rule}{{model="echo"}}[10s]'))
    at, v = series["values"][-1]
    return float(at), float(v)


@pytest.mark.parametrize(
    "rule, panel",
    [("model:tuner_batch_fill_ratio:rate5m", "Batch fill rate"),
     ("model:tuner_requests_per_dollar:rate5m", "Requests per dollar"),
     ("model:tuner_throughput_ratio:rate1h", None)],
)
def test_the_recording_rules_agree_with_the_dashboard(stack, rule, panel):
    prom = stack["prom"]
    at, v = recorded(prom, rule)
    assert v > 0
    if panel is None:  # the ratio over an hour: what a replica served / the baseline's capacity
        served = value(prom.query('sum(rate(nv_inference_request_success{model="echo"}[1h]))', at=at))
        assert v == pytest.approx(served / CAPACITY, rel=1e-6)
        return
    board = {p["title"]: p for p in json.loads(DASHBOARD.read_text())["panels"]}
    # the panel's query at the rule's own evaluation time: the same window of the same samples
    assert v == pytest.approx(value(prom.query(substituted(board[panel]["targets"][0]["expr"]), at=at)), rel=0.01)


def test_the_exporter_serves_until_sigterm_and_stops_cleanly(stack, tmp_path, exporter_process):
    # an exporter of its own: the stack's keeps serving the other tests, in whatever order they run
    port = free_ports(1)[0]
    study = write_study(tmp_path, model="echo", repository=MODELS, price_per_hour=PRICE)
    with exporter_process(str(study), "--prometheus", stack["url"], port=port) as (_, line):  # stopped by SIGTERM
        assert line.startswith(f"serving http://127.0.0.1:{port}/metrics (model echo"), line
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            assert "tuner_gpu_price_dollars_per_hour" in r.read().decode()
