"""Triton's counters as Prometheus scrapes them from a real tritonserver (tuner/production/_series.py)
while tuner replays traffic against it: the production audit's figures over the replay's minutes
agree with what the replay itself measured (throughput within 2 %, fill rate within 0.02), across a
restart of the server (a counter reset) and the scrape gap while it was down too. And Triton's own
HTTP port given as --prometheus: one line, exit 2, nothing replayed."""

from __future__ import annotations

import math
import time
import urllib.parse
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from benchmarks.production_audit import prometheus_server, write_study
from tuner.cli import main
from tuner.localhost import free_ports
from tuner.measurement import measure
from tuner.production import Prometheus, production_audit
from tuner.replay import replay
from tuner.server.local import LocalLauncher
from tuner.settings import ReplaySettings, read_study

MODELS = Path(__file__).resolve().parents[1] / "data" / "replay_models"  # echo: max_batch_size 32
RATE, DURATION_S, WARMUP_S, BURST = 250.0, 24.0, 2.0, 8

pytestmark = pytest.mark.slow
COUNTER = 'max(timestamp(nv_inference_request_success{model="echo"}))'


def scraped_after(url: str, moment: float, *, timeout_s: float = 30.0) -> float:
    """Wait until Prometheus holds a sample of echo's counter scraped after wall-clock `moment`; its time.
    A fixed sleep of 2.5 scrape intervals once lost ~1 s of requests in CI (a scrape came late or failed)."""
    deadline = time.monotonic() + timeout_s
    while not ((last := Prometheus(url).query(COUNTER)) and float(last[0]["value"][1]) > moment):
        assert time.monotonic() < deadline, f"Prometheus scraped echo's counter nothing after {moment:.3f}"
        time.sleep(0.2)
    return float(last[0]["value"][1])


@pytest.fixture(scope="module")
def scraped(prometheus_tools, triton_install, tmp_path_factory):
    """A tritonserver serving `echo`, scraped every second by a Prometheus of our own; (server, URL)."""
    tmp = tmp_path_factory.mktemp("scraped")
    with LocalLauncher(MODELS, models=["echo"], install=triton_install) as server:
        metrics = urllib.parse.urlsplit(server.endpoints.metrics).netloc
        with prometheus_server(tmp / "data", scrape=[metrics], scrape_s=1.0) as url:
            yield server, url


def test_the_audit_from_prometheus_agrees_with_the_replay(scraped, tmp_path):
    server, url = scraped
    n = int(RATE * DURATION_S)
    # bursts of BURST requests due together: the batcher forms batches, the fill rate compared is not ~1/32
    traffic = pd.DataFrame({"timestamp": (np.arange(n) // BURST) * BURST / RATE, "seq_len": 16})
    result = replay(server.endpoints, "echo", traffic, speed=1.0, settings=ReplaySettings(workers=1, warmup_s=WARMUP_S))
    m = measure(
        result.records,
        result.stats_before,
        result.stats_after,
        speed=1.0,
        warmup_s=WARMUP_S,
        lag_budget_ms=50,
        max_batch_size=32,
    )
    assert m.errors == 0 and m.throughput_rps == pytest.approx(RATE, rel=0.05)
    # the schedule's start on the wall clock (the load generator announces it on the monotonic one):
    # the audit's window is the whole seconds of the replay's measured part
    t0 = time.time() - (time.monotonic() - result.details["t0_monotonic"])
    start, end = math.ceil(t0 + WARMUP_S), math.floor(t0 + DURATION_S)
    scraped_after(url, end)
    settings = read_study(write_study(tmp_path, model="echo", repository=MODELS))
    a = production_audit(settings, Prometheus(url), window_s=end - start, end=end, step_s=end - start)
    assert a.max_batch_size == 32 and a.figures.seconds == end - start and a.figures.replicas == 1
    assert a.figures.throughput_rps == pytest.approx(m.throughput_rps, rel=0.02)
    assert a.figures.fill_rate == pytest.approx(m.fill_rate, abs=0.02)
    assert a.figures.mean_batch > 3  # batches formed
    assert a.figures.error_rate == 0 and a.restarts == {next(iter(a.restarts)): 0}


def test_triton_http_port_is_not_a_prometheus_and_nothing_is_replayed(scraped, tmp_path, capsys):
    server, _ = scraped
    before = int(server.statistics("echo")["inference_count"])
    study = str(write_study(tmp_path, model="echo", repository=MODELS))
    code = main(["audit", study, "--prometheus", server.endpoints.http])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1, out + err
    assert "not a Prometheus query API (GET /api/v1/query answered HTTP" in err, err
    assert int(server.statistics("echo")["inference_count"]) == before



def test_a_restart_and_its_scrape_gap_mid_window_keep_the_figures(prometheus_tools, triton_install, tmp_path):
    # two tritonservers one after the other on the same metrics port (one `instance` to Prometheus), each
    # scraped before and after its traffic: the window holds both replays, the restart (a counter reset) and
    # the failed scrapes while no server was up (checked below: `up` was 0 in between).
    # The second server takes the first one's ports while Prometheus's last connection to the first lingers
    # (closed by the server: TIME_WAIT on the metrics port), as a restarted deployment does.
    ports = free_ports(3)
    metrics = ports[2]
    n = int(RATE * 8)
    traffic = pd.DataFrame({"timestamp": (np.arange(n) // BURST) * BURST / RATE, "seq_len": 16})
    starts, ends, counts = [], [], []  # each replay's start and its ok requests' ends (wall clock); stats
    down = []  # on the wall clock: the first server stopped, the second about to start, the second stopped
    zeros, lasts = [], []  # each server's first sample, before its traffic, and one after its last response
    with prometheus_server(tmp_path / "data", scrape=[f"127.0.0.1:{metrics}"], wait_for=0) as url:
        for k in range(2):
            if k:
                time.sleep(3.0)  # down for three scrapes at least
                down.append(time.time())
            with LocalLauncher(MODELS, models=["echo"], install=triton_install, ports=ports) as server:
                assert urllib.parse.urlsplit(server.endpoints.metrics).port == metrics
                zeros.append(scraped_after(url, time.time()))  # scraped before its traffic: its counters' zero
                result = replay(server.endpoints, "echo", traffic, speed=1.0,
                                settings=ReplaySettings(workers=1, warmup_s=0.0))
                t0 = time.time() - (time.monotonic() - result.details["t0_monotonic"])
                starts.append(t0)
                ends.append(t0 + result.records.loc[result.records["ok"], "end_s"].to_numpy())
                stats = server.statistics("echo")
                counts.append((int(stats["inference_count"]), int(stats["execution_count"])))
                # and after it: what a server serves after its last scrape is lost to Prometheus
                lasts.append(scraped_after(url, ends[-1].max()))
            down.append(time.time())
        # the window ends on the second server's scrape after its last response: increase() extrapolates a
        # range's last sample to its end at the window's mean rate (up to a 1 s scrape interval here: 3 % of
        # a 34 s window, seen in CI as +2.3 %); it starts half a scrape before the first server's zero (its
        # first sample in the window), and a counter's extrapolation stops at zero, so that edge adds none
        start, end = zeros[0] - 0.5, lasts[1]
        settings = read_study(write_study(tmp_path, model="echo", repository=MODELS))
        a = production_audit(settings, Prometheus(url), window_s=end - start, end=end, step_s=end - start)
        gap = {f: Prometheus(url).query(f"{f}_over_time(up[3s])", at=down[1]) for f in ("max", "count")}
    # the scrapes in the 3 s no server was up were made, and failed
    assert [float(r["value"][1]) for r in gap["max"]] == [0.0] and float(gap["count"][0]["value"][1]) >= 2
    assert a.restarts == {f"127.0.0.1:{metrics}": 1} and a.figures.replicas == 1
    served = sum(len(e) for e in ends)
    assert served == 2 * n and a.figures.throughput_rps == pytest.approx(served / (end - start), rel=0.02)
    inferences, executions = (sum(c) for c in zip(*counts, strict=True))
    assert a.figures.fill_rate == pytest.approx(inferences / executions / 32, abs=0.02)
    assert a.figures.mean_batch > 3 and a.figures.error_rate == 0
