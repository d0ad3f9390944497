"""Triton's /metrics held in memory (tuner/production/_samples.py) on hand-written samples: the parse of
a Triton exposition, the window's increases and its trimming, counter resets (a restarted server counts
from zero), several servers, and the exporter's metrics before the window holds two samples. Pure: the
exporter's collector is fed by hand, nothing is scraped. The real Triton: tests/production/test_triton.py."""

from __future__ import annotations

import pytest

from benchmarks.production_audit import write_study
from tuner.errors import UnmeasuredError
from tuner.production import AuditCollector, CounterWindow, TritonSource, judge, parse_scrape
from tuner.settings import read_study

TRITON = """\
# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="m",version="1"} 100
nv_inference_request_success{model="m",version="2"} 20
nv_inference_request_success{model="other",version="1"} 7
# HELP nv_inference_request_failure Number of failed inference requests, all batch sizes
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="m",reason="REJECTED",version="1"} 2
nv_inference_request_failure{model="m",reason="BACKEND",version="1"} 1
nv_inference_request_failure{model="m",reason="OTHER",version="2"} 0
# TYPE nv_inference_count counter
nv_inference_count{model="m",version="1"} 100
nv_inference_count{model="m",version="2"} 20
# TYPE nv_inference_exec_count counter
nv_inference_exec_count{model="m",version="1"} 25
nv_inference_exec_count{model="m",version="2"} 10
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{model="m",version="1"} 5000
# TYPE nv_inference_compute_infer_duration_us counter
nv_inference_compute_infer_duration_us{model="m",version="1"} 9000
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{gpu_uuid="GPU-0"} 0.5
"""


def counts(succeeded, inferences=None, executions=None, failed=0.0):
    """One series' counters in COLUMNS' order: queue and compute 1 ms and 2 ms per request."""
    inferences = succeeded if inferences is None else inferences
    executions = succeeded if executions is None else executions
    return (succeeded, failed, inferences, executions, 1000.0 * succeeded, 2000.0 * succeeded)


def row(window: CounterWindow, instance: str = "a") -> dict:
    c, _ = window.counters(now=1e9)
    return c.increases.xs(instance, level="instance").iloc[0].to_dict()


def test_a_triton_exposition_is_summed_by_version_and_every_model_is_seen():
    scrape = parse_scrape(TRITON, "m")
    assert scrape.models == {"m", "other"}
    assert scrape.series["1"] == (100, 3, 100, 25, 5000, 9000)  # the failure reasons summed
    assert scrape.series["2"] == (20, 0, 20, 10, 0, 0)
    assert parse_scrape(TRITON, "absent").series == {}


@pytest.mark.parametrize(
    "text",
    ["# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.5\n",  # another exporter
     "<html><body>Not Found</body></html>\n",  # a page
     ""],
)
def test_no_triton_counters_is_none(text):
    assert parse_scrape(text, "m") is None


def test_the_increase_is_the_last_sample_less_the_first_over_their_span():
    w = CounterWindow(60)
    for t, n in ((100, 1000), (110, 1300), (120, 1600)):
        w.add("a", t, {"1": counts(n, inferences=n, executions=n / 4)})
    c, step_s = w.counters(now=125)
    assert step_s == 20 and c.resets == {"a": 0} and list(c.gaps) == []
    assert row(w)["succeeded"] == 600 and row(w)["executions"] == 150
    assert c.ends[0].timestamp() == 120


def test_a_counter_that_goes_down_is_a_restart_counted_from_zero():
    w = CounterWindow(60)
    w.add("a", 0, {"1": counts(100)})
    w.add("a", 10, {"1": counts(150)})
    w.add("a", 20, {"1": counts(30)})  # restarted: 30 since, not -120
    w.add("a", 30, {"1": counts(60)})
    assert row(w)["succeeded"] == 50 + 30 + 30
    assert row(w)["queue_us"] == 1000 * 110
    assert w.counters(now=30)[0].resets == {"a": 1}


def test_a_restart_is_seen_in_any_version_and_a_new_version_counts_from_zero():
    w = CounterWindow(60)
    w.add("a", 0, {"1": counts(100)})
    w.add("a", 10, {"1": counts(120), "2": counts(5)})  # version 2 loaded: its 5 are new
    w.add("a", 20, {"1": counts(130), "2": counts(3)})  # version 2 went down: a restart
    assert row(w)["succeeded"] == 20 + 5 + 10 + 3
    assert w.counters(now=20)[0].resets == {"a": 1}


def test_samples_older_than_the_window_and_their_restarts_age_out():
    w = CounterWindow(15)
    w.add("a", 0, {"1": counts(500)})
    w.add("a", 10, {"1": counts(10)})  # a restart at 10
    w.add("a", 20, {"1": counts(40)})
    w.add("a", 30, {"1": counts(100)})  # the window: 15 to 30, the samples at 20 and 30
    c, step_s = w.counters(now=30)
    assert step_s == 10 and row(w)["succeeded"] == 60 and c.resets == {"a": 0}


def test_several_servers_are_kept_apart_and_a_shorter_one_served_its_own_span():
    w = CounterWindow(60)
    for t in (0, 10, 20):
        w.add("a", t, {"1": counts(10 * t)})
    w.add("b", 10, {"1": counts(0)})  # b joined later: 10 s of samples at 4 req/s
    w.add("b", 20, {"1": counts(40)})
    c, step_s = w.counters(now=20)
    assert step_s == 20 and sorted(c.increases.index.get_level_values("instance")) == ["a", "b"]
    assert row(w, "a")["succeeded"] == 200 and row(w, "a")["seconds"] == 20
    assert row(w, "b")["succeeded"] == 40 and row(w, "b")["seconds"] == 10  # 4 req/s over its 10 s


@pytest.fixture
def settings(tmp_path):
    return read_study(write_study(tmp_path, model="m", price_per_hour=2.0))  # max_batch_size 32


def test_the_window_judged_gives_throughput_fill_and_queue(settings):
    w = CounterWindow(60)
    w.add("a", 0, {"1": counts(0)})
    w.add("a", 20, {"1": counts(2000, inferences=2000, executions=125)})  # batches of 16
    c, step_s = w.counters(now=20)
    a = judge(c, model="m", prometheus="triton a", start=0, end=20, step_s=step_s, max_batch_size=32,
              price_per_hour=2.0, max_error_rate=0.01)
    assert a.figures.throughput_rps == 100 and a.figures.fill_rate == 0.5 and a.figures.mean_batch == 16
    assert a.figures.queue_ms == 1 and a.figures.compute_ms == 2 and a.figures.replicas == 1


def served(collector) -> dict:
    """What a scrape of the exporter's /metrics gets, by name (one series each here)."""
    return {s.name: s.value for f in collector.collect() for s in f.samples}


def test_before_two_samples_the_exporter_says_nothing_to_measure_not_an_error(settings):
    # the collector of `tuner exporter --triton`, its window filled by hand (nothing is scraped)
    source = TritonSource(["127.0.0.1:1"], model="m", window_s=60)
    collector = AuditCollector(settings, source, window_s=60, refresh_s=0.0)
    source.window.add("127.0.0.1:1", 1000.0, {"1": counts(100, executions=10)})
    first = served(collector)
    # as the Prometheus source with no step of two samples: the window and the exit code, no figures
    assert first["tuner_exporter_up"] == 1 and first["tuner_audit_exit_code"] == UnmeasuredError.exit_code
    assert first["tuner_audit_window_seconds"] == 60
    assert "tuner_batch_fill_ratio" not in first and "tuner_requests_per_dollar" not in first
    assert first["tuner_gpu_price_dollars_per_hour"] == 2.0  # the study's constants are served all along
    source.window.add("127.0.0.1:1", 1010.0, {"1": counts(600, inferences=600, executions=50)})
    second = served(collector)
    assert second["tuner_production_requests_per_second"] == 50
    assert second["tuner_batch_fill_ratio"] == pytest.approx(500 / 40 / 32)
    assert second["tuner_requests_per_dollar"] == pytest.approx(50 * 3600 / 2.0)
    assert second["tuner_audit_window_seconds"] == 10 and second["tuner_audit_window_end_timestamp_seconds"] == 1010
    assert second["tuner_audit_exit_code"] != UnmeasuredError.exit_code
