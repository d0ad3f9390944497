"""tuner.llm.engine_watch: the stretch between two marks of the engine's series, and what a trial keeps of
it (`batch_figures`), on snapshots as Triton's /metrics gives them (pure). The watch's thread against a
real engine: tests/llm/test_tune.py."""

from __future__ import annotations

import dataclasses
import http.server
import math
import threading
import time

import pytest

from tuner.llm.engine_metrics import COUNTERS, EMULATED, GAUGES, EngineSnapshot
from tuner.llm.engine_watch import BATCH_FIGURES, EngineWatch, batch_figures, stretch_of
from tuner.localhost import free_ports
from tuner.trial.record import Figures


def snapshot(*, preemptions: float, running: float, waiting: float, kv: float, steps: float = 0,
             overruns: float = 0) -> EngineSnapshot:
    values = {COUNTERS["preemptions"]: preemptions, GAUGES["running"]: running, GAUGES["waiting"]: waiting,
              GAUGES["kv_cache_usage"]: kv}
    if steps:
        values.update({EMULATED["emulated_steps"]: steps, EMULATED["emulated_overruns"]: overruns})
    return EngineSnapshot(values=values)


def test_a_trial_keeps_the_engines_peaks_during_the_replay_not_its_state_after_it():
    start = snapshot(preemptions=3, running=0, waiting=0, kv=0.0)
    during = [snapshot(preemptions=3, running=12, waiting=0, kv=0.40),
              snapshot(preemptions=5, running=16, waiting=7, kv=0.97),
              snapshot(preemptions=9, running=9, waiting=2, kv=0.55)]
    at_rest = snapshot(preemptions=9, running=0, waiting=0, kv=0.0)
    figures = batch_figures(stretch_of(start, [*during, at_rest], seconds=6.0))
    assert figures["preemptions"] == 6  # the counter's difference over the stretch
    assert (figures["running_peak"], figures["waiting_peak"], figures["kv_cache_peak"]) == (16, 7, 0.97)
    assert math.isnan(figures["emulated_overrun_share"])  # a real engine counts no emulated steps


def test_an_emulated_gpus_overrun_share_is_kept_and_an_unread_engine_keeps_nothing():
    start = snapshot(preemptions=0, running=0, waiting=0, kv=0.0, steps=100, overruns=1)
    end = snapshot(preemptions=0, running=1, waiting=0, kv=0.1, steps=500, overruns=41)
    assert batch_figures(stretch_of(start, [end], seconds=2.0))["emulated_overrun_share"] == pytest.approx(0.10)
    assert batch_figures(None) == {}  # the server's /metrics could not be read at either end


def test_every_figure_kept_has_its_field_in_a_trials_figures():
    fields = {f.name for f in dataclasses.fields(Figures)}
    assert set(BATCH_FIGURES) <= fields
    start = snapshot(preemptions=0, running=0, waiting=0, kv=0.0)
    assert tuple(batch_figures(stretch_of(start, [start], seconds=1.0))) == BATCH_FIGURES


class _Metrics(http.server.BaseHTTPRequestHandler):
    text = ""  # what /metrics says now

    def do_GET(self):
        body = type(self).text.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_an_engine_whose_series_appear_with_its_first_request_is_measured_from_zero(tmp_path):
    # Triton's vLLM backend reports a model's vllm: series from its first request on: a watch opened
    # on the fresh engine saw an answer without them, and the replay's stretch came out as "none"
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics) as listener:
        threading.Thread(target=listener.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{listener.server_address[1]}/metrics"
        _Metrics.text = "# TYPE nv_inference_count counter\nnv_inference_count{model=\"llm\"} 0\n"
        with EngineWatch(url, "llm", interval_s=0.05) as watch:
            _Metrics.text = (f'# TYPE {COUNTERS["preemptions"]} counter\n{COUNTERS["preemptions"]}{{model="llm"}} 2\n'
                             f'# TYPE {GAUGES["running"]} gauge\n{GAUGES["running"]}{{model="llm"}} 5\n')
            time.sleep(0.3)
            stretch = watch.mark()
        listener.shutdown()
    assert stretch is not None and stretch.figures.preemptions == 2 and stretch.running_peak == 5
    unreachable = f"http://127.0.0.1:{free_ports(1)[0]}/metrics"
    with EngineWatch(unreachable, "llm", interval_s=0.05) as watch:
        assert watch.mark() is None  # nothing read at either end: no figures, not zeros
