"""`tuner exporter --triton` (tuner/production/_triton.py) against a real tritonserver serving `echo`: the
exporter scrapes its metrics port itself while tuner replays traffic against it, and its /metrics'
throughput and fill rate agree with Triton's own statistics (v2/models/echo/stats deltas) over the
interval the exporter's window covers (within 2 %, 0.02). Bad input, said before serving in one line
with exit 2: an unreachable metrics port, a port that answers no Triton metrics (Triton's HTTP port, a
prometheus_client exporter), a Triton without the study's model, neither or both of --prometheus and
--triton. And a Triton that stops answering: `tuner_exporter_up` 0, said once, its window kept."""

from __future__ import annotations

import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from prometheus_client import CollectorRegistry, Counter, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.production_audit import write_study
from tuner.cli import main
from tuner.localhost import free_ports
from tuner.production import AuditCollector, TritonSource
from tuner.replay import replay
from tuner.server.local import LocalLauncher
from tuner.settings import ReplaySettings, read_study

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "data" / "replay_models"  # echo: max_batch_size 32
RATE, DURATION_S, BURST, PRICE, SCRAPE_S = 250.0, 12.0, 8, 2.0, 1.0


@pytest.fixture(scope="module")
def server(triton_install):
    with LocalLauncher(MODELS, models=["echo"], install=triton_install) as launched:
        yield launched


def metrics_port(server) -> str:
    return urllib.parse.urlsplit(server.endpoints.metrics).netloc


def counts(stats: dict) -> tuple[int, int, int]:
    """Triton's own statistics: requests succeeded, inferences, executions."""
    return (int(stats["inference_stats"]["success"]["count"]), int(stats["inference_count"]),
            int(stats["execution_count"]))


def served(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.labels.get("model") == "echo"}


@pytest.mark.slow
def test_the_exporters_figures_agree_with_tritons_statistics(server, tmp_path, exporter_process):
    port = free_ports(1)[0]
    study = write_study(tmp_path, model="echo", repository=MODELS, price_per_hour=PRICE)
    with exporter_process(str(study), "--triton", metrics_port(server), "--window", "10m",
                          "--scrape-interval", f"{SCRAPE_S:g}s", port=port) as (proc, line):  # line: after its first scrape
        assert line.startswith(f"serving http://127.0.0.1:{port}/metrics (model echo"), line
        before = counts(server.statistics("echo"))  # no traffic since that scrape: its counters
        n = int(RATE * DURATION_S)  # bursts of BURST due together: batches form
        traffic = pd.DataFrame({"timestamp": (np.arange(n) // BURST) * BURST / RATE, "seq_len": 16})
        replay(server.endpoints, "echo", traffic, speed=1.0, settings=ReplaySettings(workers=1, warmup_s=0.0))
        after = counts(server.statistics("echo"))
        time.sleep(3 * SCRAPE_S)  # scraped since the last request: the window's last sample holds it all
        got = served(port)
        ok, inferences, executions = (b - a for a, b in zip(before, after, strict=True))
        assert ok == n and executions > 0
        print(f"exporter {got['tuner_production_requests_per_second']:.2f} req/s fill "
              f"{got['tuner_batch_fill_ratio']:.4f} over {got['tuner_audit_window_seconds']:.1f} s; Triton's stats "
              f"{ok / got['tuner_audit_window_seconds']:.2f} req/s fill {inferences / executions / 32:.4f}")
        window_s = got["tuner_audit_window_seconds"]
        assert DURATION_S < window_s < 600  # the samples from the first scrape to the last
        assert got["tuner_production_requests_per_second"] == pytest.approx(ok / window_s, rel=0.02)
        assert got["tuner_batch_fill_ratio"] == pytest.approx(inferences / executions / 32, abs=0.02)
        assert got["tuner_batch_fill_ratio"] > 3 / 32  # batches formed: the comparison is not of 1/32s
        assert got["tuner_requests_per_dollar"] == pytest.approx(ok / window_s * 3600 / PRICE, rel=0.02)
        assert got["tuner_production_replicas"] == 1 and got["tuner_production_error_ratio"] == 0
        assert got["tuner_exporter_up"] == 1


def exporter(tmp_path, *triton: str, model: str = "echo", extra: tuple[str, ...] = ()) -> int:
    """`tuner exporter --triton ...` run in-process: its exit code."""
    repository = MODELS if model == "echo" else None
    study = write_study(tmp_path, model=model, repository=repository)
    port = free_ports(1)[0]
    return main(["exporter", str(study), "--port", str(port), *extra, *(["--triton", *triton] if triton else [])])


def one_line(capsys, code: int) -> str:
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1, out + err
    return err


@pytest.mark.slow
def test_tritons_http_port_is_not_its_metrics_port(server, tmp_path, capsys):
    http = server.endpoints.http.split("://")[-1].rstrip("/")  # HOST:PORT, with a scheme or without
    err = one_line(capsys, exporter(tmp_path, http))
    assert f"--triton {http}: not Triton's metrics port" in err or "no Triton metrics" in err, err


@pytest.mark.slow
def test_a_triton_without_the_model_is_one_line(server, tmp_path, capsys):
    err = one_line(capsys, exporter(tmp_path, metrics_port(server), model="absent"))
    assert f"--triton {metrics_port(server)}: model 'absent' has no series" in err and "echo" in err, err


def test_an_unreachable_metrics_port_is_one_line(tmp_path, capsys):
    free = free_ports(1)[0]
    err = one_line(capsys, exporter(tmp_path, f"127.0.0.1:{free}"))
    assert f"--triton 127.0.0.1:{free}: cannot read http://127.0.0.1:{free}/metrics" in err, err


def test_another_exporters_metrics_are_not_tritons(tmp_path, capsys):
    registry = CollectorRegistry()
    Counter("other_requests", "not Triton's", registry=registry).inc()
    port = free_ports(1)[0]
    http, _thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        err = one_line(capsys, exporter(tmp_path, f"127.0.0.1:{port}"))
    finally:
        http.shutdown()
    assert f"--triton 127.0.0.1:{port}: no Triton metrics at http://127.0.0.1:{port}/metrics" in err, err


@pytest.mark.parametrize("flags", [(), ("--prometheus", "http://127.0.0.1:1", "--triton", "127.0.0.1:1")])
def test_exactly_one_source(tmp_path, capsys, flags):
    err = one_line(capsys, exporter(tmp_path, extra=flags))
    assert "give exactly one of --prometheus URL and --triton HOST:PORT" in err, err


def test_a_window_shorter_than_two_scrapes_is_one_line(tmp_path, capsys):
    # it would never hold two samples: no figure, ever, and no word why
    err = one_line(capsys, exporter(tmp_path, "127.0.0.1:1", extra=("--window", "1s", "--scrape-interval", "2s")))
    assert "--window 1s: shorter than two scrapes (--scrape-interval 2s)" in err, err


def test_a_target_that_is_not_host_port_is_one_line(tmp_path, capsys):
    err = one_line(capsys, exporter(tmp_path, "127.0.0.1"))
    assert "--triton '127.0.0.1': not HOST:PORT" in err, err


def test_a_triton_that_stops_answering_is_up_0_and_its_window_stays(tmp_path, capsys):
    settings = read_study(write_study(tmp_path, model="m"))
    gone = f"127.0.0.1:{free_ports(1)[0]}"  # nobody listens: as a Triton that went down
    source = TritonSource([gone], model="m", window_s=60)
    collector = AuditCollector(settings, source, window_s=60, refresh_s=0.0)
    now = time.time()
    source.window.add(gone, now - 10, {"1": (0.0,) * 6})
    source.window.add(gone, now, {"1": (100.0, 0.0, 100.0, 10.0, 0.0, 0.0)})
    assert list(source.scrape()) == [gone] and list(source.scrape()) == [gone]
    got = {s.name: s.value for f in collector.collect() for s in f.samples}
    assert got["tuner_exporter_up"] == 0 and got["tuner_production_requests_per_second"] == 10
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--triton {gone}: cannot read" in err, err  # said once, not per scrape
