"""The production audit over a week of history (tuner/production/_audit.py, _series.py, _result.py):
Triton's counters of two replicas written at 15 s resolution from a diurnal profile, with a server
restart (a counter reset) and scrape gaps, backfilled with promtool into a real Prometheus of the
test's own (benchmarks/production_audit.py). The audit must recover the profile: throughput and fill
rate within 2 %, the hours under the thresholds exactly."""

from __future__ import annotations

import datetime
import json
import math
import re
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.production_audit import (
    ERROR_SHARE,
    PROFILE,
    backfill,
    expected,
    prometheus_server,
    synthetic_week,
    write_study,
)
from tuner.audit import Baseline
from tuner.cli import main
from tuner.errors import EXIT_ACT as EXIT_INEFFICIENT
from tuner.errors import EXIT_OK as EXIT_HEALTHY
from tuner.errors import UnmeasuredError
from tuner.production import NoSeriesError, Prometheus, production_audit
from tuner.settings import read_study

WEEK_S = 7 * 86400
BASELINE = Baseline("tuned", {"max_batch_size": 32, "max_queue_delay_microseconds": 1000}, 100.0)
PRICE = 2.0

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def week(prometheus_tools, tmp_path_factory):
    """The week (ending at the last whole hour) in a Prometheus of our own; yields (Week, its URL)."""
    tmp = tmp_path_factory.mktemp("week")
    w = synthetic_week(tmp / "openmetrics", end=math.floor(time.time() / 3600) * 3600, idle_model="idle")
    backfill(w.files, tmp / "data")
    with prometheus_server(tmp / "data", retention="30d") as url:
        yield w, url


def settings(tmp_path, model: str = "m"):
    return read_study(write_study(tmp_path, model=model, price_per_hour=PRICE))


def by_check(audit) -> dict:
    return {f.check: f for f in audit.findings if f.check}


def test_the_audit_recovers_the_week_it_was_given(week, tmp_path):
    w, url = week
    a = production_audit(settings(tmp_path), Prometheus(url), window_s=WEEK_S, end=w.end, baseline=BASELINE)
    want = expected(w)
    assert a.figures.throughput_rps == pytest.approx(want["throughput_rps"], rel=0.02)
    assert a.figures.fill_rate == pytest.approx(want["fill_rate"], rel=0.02)
    assert a.figures.error_rate == pytest.approx(ERROR_SHARE, rel=0.02)
    assert a.figures.queue_ms == pytest.approx(2.0, rel=0.02) and a.figures.compute_ms == pytest.approx(
        5.0, rel=0.02
    )
    # hour by hour, the restart's and the partial gap's hours included
    hours = w.hours[~w.hours["gap"]]
    served = hours["per_replica_rps"] * (1 - ERROR_SHARE)
    assert list(a.steps.index) == list(hours.index)
    assert a.steps["per_replica_rps"].to_numpy() == pytest.approx(served.to_numpy(), rel=0.02)
    assert a.steps["fill_rate"].to_numpy() == pytest.approx(hours["fill_rate"].to_numpy(), abs=0.02)
    # the hours under the thresholds, exactly
    assert a.fill_under == list(hours.index[hours["fill_rate"] < 0.5]) and len(a.fill_under) > 20
    assert (
        a.ratio_under == list(hours.index[served / BASELINE.capacity_rps < 0.6]) and len(a.ratio_under) > 20
    )
    # the gap and the restart said, each replica on its own
    assert a.gaps == list(w.hours.index[w.hours["gap"]])
    assert a.restarts == {"10.0.0.1:8002": 0, "10.0.0.2:8002": 1}
    inst = a.instances["throughput_rps"]
    assert inst["10.0.0.2:8002"] / inst["10.0.0.1:8002"] == pytest.approx(2.0, rel=0.02)  # its share: 2/3
    assert a.figures.replicas == 2
    # the verdict: a replica serves 44 % of what the tuned configuration can
    assert a.ratio == pytest.approx(want["throughput_rps"] / 2 / 100, rel=0.02)
    assert a.recoverable_per_month == pytest.approx((1 - a.ratio) * 2 * PRICE * 730)
    found = by_check(a)
    assert found["throughput ratio"].verdict == "inefficient" and a.exit_code == EXIT_INEFFICIENT
    assert found["scrape gaps"].value.startswith("2 steps of 1h without samples")
    assert found["server restarts"].value == "10.0.0.2:8002 1"
    assert found["steps of 1h with fill rate < 0.5"].value.startswith(f"{len(a.fill_under)} of 166: ")
    assert found["fill rate over the window"].verdict == "ok" and found["error rate"].verdict == "ok"


def test_the_command_prints_the_table_and_writes_the_json(week, tmp_path, capsys):
    w, url = week
    baseline = tmp_path / "tuned"
    baseline.mkdir()
    (baseline / "summary.json").write_text(
        json.dumps(
            {
                "best": {"params": BASELINE.params, "capacity_rps": BASELINE.capacity_rps},
                "sla": {"latency_ms": 200, "percentile": 99.0},
                "traffic": {"path": str(PROFILE)},
            }
        )
    )
    study = str(write_study(tmp_path, price_per_hour=PRICE))
    code = main(
        ["audit", study, "--prometheus", url, "--until", str(w.end), "--baseline", str(baseline),
         "--json", str(tmp_path / "a.json"), "--textfile", str(tmp_path / "a.prom")]
    )
    out = capsys.readouterr().out
    assert code == EXIT_INEFFICIENT, out
    assert "throughput ratio" in out and "inefficient" in out and "recoverable budget" in out
    report = json.loads((tmp_path / "a.json").read_text())
    assert report["exit_code"] == EXIT_INEFFICIENT and report["model"] == "m"
    assert report["figures"]["throughput_rps"] == pytest.approx(expected(w)["throughput_rps"], rel=0.02)
    assert len(report["steps"]) >= 165 and report["restarts"]["10.0.0.2:8002"] == 1
    assert report["findings"][0]["check"] == "production window"
    # the same figures for node_exporter's textfile collector
    metrics = {
        s.name: s.value
        for f in text_string_to_metric_families((tmp_path / "a.prom").read_text())
        for s in f.samples
    }
    assert metrics["tuner_throughput_ratio"] == pytest.approx(report["throughput_ratio"])
    assert metrics["tuner_recoverable_dollars_per_month"] == pytest.approx(report["recoverable_per_month"])
    assert metrics["tuner_batch_fill_ratio"] == pytest.approx(report["figures"]["fill_rate"])
    assert metrics["tuner_audit_exit_code"] == EXIT_INEFFICIENT
    # without a baseline: no ratio, and the week is otherwise healthy
    # --until as a date and time (naive: UTC), the same instant
    until = datetime.datetime.fromtimestamp(w.end, datetime.UTC).replace(tzinfo=None).isoformat()
    assert main(["audit", study, "--prometheus", url, "--window", "7d", "--until", until]) == EXIT_HEALTHY
    assert "no baseline" in capsys.readouterr().out


def test_a_model_with_no_traffic_is_said_and_its_whole_cost_is_recoverable(week, tmp_path):
    w, url = week
    a = production_audit(settings(tmp_path, "idle"), Prometheus(url), window_s=WEEK_S, end=w.end)
    found = by_check(a)
    assert a.figures.throughput_rps == 0 and a.figures.fill_rate is None
    assert found["production throughput"].why == "no requests in the window"
    assert "fill rate over the window" not in found and a.exit_code == EXIT_HEALTHY
    judged = production_audit(
        settings(tmp_path, "idle"), Prometheus(url), window_s=WEEK_S, end=w.end, baseline=BASELINE
    )
    assert judged.ratio == 0 and judged.recoverable_per_month == pytest.approx(PRICE * 730)
    assert judged.exit_code == EXIT_INEFFICIENT


def test_a_window_inside_a_scrape_gap_is_unmeasured_not_zero(week, tmp_path):
    w, url = week
    gap = w.hours.index[w.hours["gap"]][0].timestamp()  # its first hour: one sample, at its start
    a = production_audit(settings(tmp_path), Prometheus(url), window_s=3600, end=gap + 3600)
    assert a.exit_code == UnmeasuredError.exit_code and a.figures.seconds == 0
    assert [(f.check, f.verdict) for f in a.findings] == [("production window", "broken")]
    assert "no 1h of the window has two samples" in a.findings[0].why


def test_a_window_before_any_data_has_no_triton_metrics(week, tmp_path):
    w, url = week
    with pytest.raises(
        NoSeriesError, match=r"no Triton metrics \(nv_inference_request_success\) in the window"
    ):
        production_audit(settings(tmp_path), Prometheus(url), window_s=86400, end=w.start - 86400)


@pytest.mark.parametrize(
    "case, message",
    [
        ("absent model", "model 'absent' has no series in the window (models with Triton metrics: idle, m)"),
        ("past the retention", "--window 60d: longer than Prometheus's retention (30d)"),
    ],
)
def test_bad_input_against_a_real_prometheus_is_one_line_exit_2(week, tmp_path, capsys, case, message):
    w, url = week
    model, window = ("absent", "7d") if case == "absent model" else ("m", "60d")
    code = main(["audit", str(write_study(tmp_path, model=model)), "--prometheus", url, "--window", window,
                 "--until", str(w.end)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err, out + err


def test_a_prometheus_without_triton_metrics_is_one_line_exit_2(prometheus_tools, tmp_path, capsys):
    # a real Prometheus whose last hour holds another exporter's series, none of Triton's: as when
    # Triton runs without --allow-metrics (or its metrics port is not scraped)
    end = math.floor(time.time() / 3600) * 3600
    other = tmp_path / "other.om"
    samples = "".join(f'node_load1{{instance="10.0.0.1:9100"}} 1 {t}\n' for t in range(end - 3600, end + 1, 15))
    other.write_text(f"# TYPE node_load1 gauge\n{samples}# EOF\n")
    backfill([other], tmp_path / "data")
    with prometheus_server(tmp_path / "data") as url:
        assert Prometheus(url).query("count(node_load1)", at=end - 1800)  # the window is not empty
        code = main(["audit", str(write_study(tmp_path)), "--prometheus", url, "--window", "1h", "--until", str(end)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1, out + err
    assert f"Prometheus {url}: no Triton metrics (nv_inference_request_success) in the window" in err, err


def test_replicas_that_join_or_leave_inside_an_hour_are_divided_by_the_time_they_served(
    prometheus_tools, tmp_path
):
    # three hours at 10 req/s a replica: a serves them all; b joins 36 minutes into the second hour (a
    # scale-up) and c leaves 12 minutes into the third (a scale-down). Counting each replica's hour
    # as a whole one put the second hour's per-replica rate at (10 + 4) / 2 = 7 req/s.
    end = math.floor(time.time() / 3600) * 3600
    start = end - 3 * 3600
    spans = {"a": (start, end), "b": (start + 3600 + 36 * 60, end), "c": (start, start + 2 * 3600 + 12 * 60)}
    lines = []
    for name, per_s in (("nv_inference_request_success", 10), ("nv_inference_request_failure", 0),
                        ("nv_inference_count", 10), ("nv_inference_exec_count", 1),
                        ("nv_inference_queue_duration_us", 10 * 2000), ("nv_inference_compute_infer_duration_us", 10 * 5000)):
        lines.append(f"# TYPE {name} unknown\n")
        for replica, (first, last) in spans.items():
            labels = f'{{model="m",version="1",instance="{replica}:8002",job="triton"}}'
            lines += [f"{name}{labels} {(t - first) * per_s} {t}\n" for t in range(first, last + 1, 15)]
    (tmp_path / "scaled.om").write_text("".join(lines) + "# EOF\n")
    backfill([tmp_path / "scaled.om"], tmp_path / "data")
    with prometheus_server(tmp_path / "data") as url:
        a = production_audit(settings(tmp_path), Prometheus(url), window_s=3 * 3600, end=end)
    assert a.steps["per_replica_rps"].to_numpy() == pytest.approx([10, 10, 10], rel=0.02)
    assert a.steps["replicas"].to_numpy() == pytest.approx([2, 2.4, 2.2], rel=0.02)
    assert a.figures.per_replica_rps == pytest.approx(10, rel=0.02)
    assert a.figures.replicas == pytest.approx(6.6 / 3, rel=0.02)
    assert a.instances.loc["b:8002", "throughput_rps"] == pytest.approx(10, rel=0.02)
    assert a.instances.loc["c:8002", "seconds"] == pytest.approx(2 * 3600 + 12 * 60, rel=0.02)


def test_the_benchmark_script_runs_to_its_figures(prometheus_tools, tmp_path):
    """benchmarks/production_audit.py at its smallest (its figures, in docs/production-audit.md, are its
    own runs'): the script stays in step with the library (tests/test_benchmark_scripts.py says why)."""
    from tests.test_benchmark_scripts import run_benchmark

    done = run_benchmark("production_audit.py", ["--replicas", "2", "--days", "1", "--runs", "1"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(s for s in done.stdout.splitlines() if s.startswith("run 1: audit of 1 d x 2 replicas"))
    audit, profile = (float(x) for x in re.findall(r"throughput ([\d.]+) req/s \(profile ([\d.]+)\)", line)[0])
    assert audit == pytest.approx(profile, rel=0.02)
    assert "`tuner audit --prometheus` (a process): " in done.stdout and ", exit 0;" in done.stdout
