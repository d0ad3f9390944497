"""The tuner's figures as Prometheus metrics (tuner/production/_metrics.py): the families of a
production audit worked out by hand, the textfile as node_exporter reads it (parsed back with
prometheus_client's own parser), the nightly verdict, and the commands' --textfile: a missing
directory and a busy exporter port are one line, exit 2. What the exporter serves (its collector fed by
hand, served on 127.0.0.1) holds one family per name; it and the textfiles pass promtool check
metrics (no `quantile` label on a gauge). No Triton: the exporter scraped by a real Prometheus is
tests/production/test_exporter.py."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import urllib.error
import urllib.request
from collections import Counter

import pandas as pd
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.production_audit import write_study
from tuner.audit import AuditResult, Baseline
from tuner.cli import main
from tuner.localhost import free_ports
from tuner.production import (
    AuditCollector,
    TritonSource,
    audit_families,
    judge,
    labels_for,
    nightly_families,
    replay_audit_families,
    serve,
    study_families,
    write_textfile,
)
from tuner.production._figures import COLUMNS, SECONDS
from tuner.production._series import Counters
from tuner.settings import read_study
from tuner.trial import Bracket, Figures, TrialRecord

BASELINE = Baseline("tuned", {"max_batch_size": 32}, 10.0)
PRICE = 2.0


def audit(tmp_path, *, baseline: Baseline | None = BASELINE):
    """Two instances over one hour: 3600 + 7200 requests (3 req/s, 1.5 per replica), batches of 8 of 32."""
    rows = [("2026-01-01 01:00", "a", 3600, 0, 3600, 450, 0, 0, 3600),
            ("2026-01-01 01:00", "b", 7200, 0, 7200, 900, 0, 0, 3600)]
    frame = pd.DataFrame(rows, columns=["end", "instance", *COLUMNS, SECONDS])
    frame["end"] = pd.to_datetime(frame["end"], utc=True)
    counters = Counters(
        increases=frame.set_index(["end", "instance"]),
        ends=pd.DatetimeIndex(frame["end"].unique()),
        resets={"a": 0, "b": 0},
    )
    start = pd.Timestamp("2026-01-01 00:00", tz="UTC").timestamp()
    return judge(counters, model="m", prometheus="http://p", start=start, end=start + 3600, step_s=3600,
                 max_batch_size=32, price_per_hour=PRICE, max_error_rate=0.001, baseline=baseline)


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """{(name, ((label, value), ...)): value} of an exposition text, parsed by prometheus_client."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def study(tmp_path):
    settings = read_study(write_study(tmp_path, price_per_hour=PRICE))
    (tmp_path / "models" / "m" / "1").mkdir()
    (tmp_path / "models" / "m" / "3").mkdir()
    return settings


LABELS = (("gpu", "cpu"), ("model", "m"), ("version", "3"))


def lab(**extra: str) -> tuple:
    """LABELS and `extra`, sorted as `samples` keys them."""
    return tuple(sorted((*LABELS, *extra.items())))


def test_the_textfile_holds_the_audits_figures_with_units_and_labels(tmp_path):
    settings = study(tmp_path)
    labels = labels_for(settings)
    assert (labels.model, labels.version, labels.gpu) == ("m", "3", "cpu")  # the newest version directory
    shouted = dataclasses.replace(settings, cost=dataclasses.replace(settings.cost, gpu="A100-40GB"))
    assert labels_for(shouted).gpu == "a100-40gb"  # one GPU type, one label value, as the price table names it
    a = audit(tmp_path)
    path = write_textfile(
        tmp_path / "tuner.prom",
        study_families(settings, labels, max_batch_size=32, baseline=BASELINE) + audit_families(a, labels),
    )
    got = samples(path.read_text())
    assert got[("tuner_requests_per_dollar", LABELS)] == pytest.approx(1.5 * 3600 / PRICE)
    assert got[("tuner_baseline_requests_per_dollar", LABELS)] == pytest.approx(10 * 3600 / PRICE)
    assert got[("tuner_batch_fill_ratio", LABELS)] == pytest.approx(8 / 32)
    assert got[("tuner_throughput_ratio", LABELS)] == pytest.approx(0.15)
    assert got[("tuner_recoverable_dollars_per_month", LABELS)] == pytest.approx(0.85 * 2 * PRICE * 730)
    assert got[("tuner_gpu_price_dollars_per_hour", LABELS)] == PRICE
    assert got[("tuner_max_batch_size", LABELS)] == 32
    assert got[("tuner_sla_latency_seconds", lab(percentile="0.99"))] == pytest.approx(0.2)
    assert got[("tuner_audit_exit_code", LABELS)] == 10  # inefficient
    assert got[("tuner_audit_window_end_timestamp_seconds", LABELS)] == a.end.timestamp()
    assert got[("tuner_audit_covered_seconds", LABELS)] == 3600
    assert all(name.startswith("tuner_") for name, _ in got)
    assert not [p for p in os.listdir(tmp_path) if p != "tuner.prom" and p != "production.yaml" and p != "models"]


def test_without_a_baseline_the_ratio_and_budget_are_absent_not_zero(tmp_path):
    settings = study(tmp_path)
    labels = labels_for(settings)
    text = write_textfile(tmp_path / "t.prom", audit_families(audit(tmp_path, baseline=None), labels)).read_text()
    names = {name for name, _ in samples(text)}
    assert "tuner_batch_fill_ratio" in names and "tuner_requests_per_dollar" in names
    assert "tuner_throughput_ratio" not in names and "tuner_recoverable_dollars_per_month" not in names


def test_the_nightly_verdict_is_one_on_its_decision_with_its_time(tmp_path):
    labels = labels_for(study(tmp_path))
    entry = {"night": "2026-11-30T021500Z", "decision": "change", "exit_code": 10,
             "production_requests_per_dollar": 100.0, "best_requests_per_dollar": 130.0}
    got = samples(write_textfile(tmp_path / "n.prom", nightly_families(entry, labels)).read_text())
    assert got[("tuner_nightly_verdict", lab(decision="change"))] == 1
    assert got[("tuner_nightly_verdict", lab(decision="keep"))] == 0
    when = pd.Timestamp("2026-11-30 02:15", tz="UTC").timestamp()
    assert got[("tuner_nightly_last_run_timestamp_seconds", lab(decision="change"))] == when
    assert got[("tuner_nightly_exit_code", LABELS)] == 10
    assert got[("tuner_nightly_requests_per_dollar", lab(config="best"))] == 130
    assert not any(name == "tuner_nightly_output_tokens_per_dollar" for name, _ in got)


def test_a_generative_nights_score_is_output_tokens_per_dollar_wherever_it_is_written(tmp_path):
    # one builder for `tuner nightly --textfile` and `tuner exporter --nightly` (the exporter wrote no score
    # for a generative night: it read only requests per dollar)
    labels = labels_for(study(tmp_path))
    entry = {"night": "2026-11-30T021500Z", "decision": "keep", "exit_code": 0, "unit": "tokens",
             "production_tokens_per_dollar": 1.0e6, "best_tokens_per_dollar": 1.2e6}
    got = samples(write_textfile(tmp_path / "n.prom", nightly_families(entry, labels)).read_text())
    assert got[("tuner_nightly_output_tokens_per_dollar", lab(config="production"))] == 1.0e6
    assert got[("tuner_nightly_output_tokens_per_dollar", lab(config="best"))] == 1.2e6
    assert not any(name == "tuner_nightly_requests_per_dollar" for name, _ in got)


def test_nightly_history_writes_the_last_nights_textfile(tmp_path, capsys):
    settings = study(tmp_path)
    nightly = tmp_path / "nightly.yaml"
    nightly.write_text(json.dumps({"study": str(tmp_path / "production.yaml"), "output": str(tmp_path / "out"),
                                   "traffic": {"path": str(tmp_path)}}))
    (tmp_path / "out").mkdir()
    nights = [{"night": "2026-11-29T021500Z", "decision": "keep", "exit_code": 0},
              {"night": "2026-11-30T021500Z", "decision": "change", "exit_code": 10}]
    (tmp_path / "out" / "history.jsonl").write_text("".join(json.dumps(n) + "\n" for n in nights))
    code = main(["nightly", str(nightly), "--history", "--textfile", str(tmp_path / "n.prom")])
    assert code == 0, capsys.readouterr()
    got = samples((tmp_path / "n.prom").read_text())
    labels = (("decision", "change"), ("gpu", "cpu"), ("model", settings.model), ("version", "3"))
    assert got[("tuner_nightly_verdict", labels)] == 1


@pytest.mark.parametrize("command", ["audit", "nightly"])
def test_a_textfile_in_a_missing_directory_is_one_line_exit_2(tmp_path, capsys, command):
    target = tmp_path / "absent" / "tuner.prom"
    first = str(write_study(tmp_path))
    args = [command, first, "--textfile", str(target)]
    if command == "audit":
        args += ["--prometheus", "http://127.0.0.1:1"]
    code = main(args)
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and f"--textfile {target}" in err, out + err
    assert not (tmp_path / "absent").exists()


def test_a_busy_exporter_port_is_one_line_exit_2(tmp_path, capsys):
    study(tmp_path)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        code = main(["exporter", str(tmp_path / "production.yaml"), "--prometheus", "http://127.0.0.1:1",
                     "--port", str(port)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1, out + err
    assert f"--port {port}: cannot serve /metrics on 127.0.0.1:{port} (in use)" in err


def test_an_unreachable_prometheus_stops_the_exporter_at_once(tmp_path, capsys):
    study(tmp_path)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = main(["exporter", str(tmp_path / "production.yaml"), "--prometheus", f"http://127.0.0.1:{free}",
                 "--port", str(port)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and "unreachable" in err, out + err
    with socket.socket() as s:  # and the port it took for /metrics is free again
        s.bind(("127.0.0.1", port))


def test_the_replay_audits_textfile_holds_its_capacity_fill_and_verdict(tmp_path):
    labels = labels_for(study(tmp_path))
    record = TrialRecord(params={}, at_load=Figures(requests=100, fill_rate=0.4), sla_met=True,
                         capacity=Bracket(rps=40.0, speed=2.0))
    result = AuditResult(model="m", server="http://s", params={}, result=record, price_per_hour=PRICE,
                         baseline=BASELINE, ratio=0.5, recoverable_per_month=730.0)
    got = samples(write_textfile(tmp_path / "r.prom", replay_audit_families(result, labels)).read_text())
    assert got[("tuner_requests_per_dollar", LABELS)] == pytest.approx(40 * 3600 / PRICE)
    assert got[("tuner_batch_fill_ratio", LABELS)] == 0.4
    assert got[("tuner_throughput_ratio", LABELS)] == 0.5
    assert got[("tuner_recoverable_dollars_per_month", LABELS)] == 730
    assert got[("tuner_audit_exit_code", LABELS)] == result.exit_code


# the reviewer's night (one of each unit): each writes one score under two `config`s
NIGHTS = {
    "requests": {"night": "2026-12-06T163656Z", "decision": "change", "exit_code": 10,
                 "production_requests_per_dollar": 1000, "best_requests_per_dollar": 1300},
    "tokens": {"night": "2026-12-06T163656Z", "decision": "keep", "exit_code": 0, "unit": "tokens",
               "production_tokens_per_dollar": 1.0e6, "best_tokens_per_dollar": 1.2e6},
}
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def exporter_metrics(tmp_path, night: dict, *, accept: str = "text/plain") -> str:
    """What `tuner exporter --triton ... --nightly DIR` serves on /metrics (DIR's history: `night`): its
    collector, the window filled by hand (50 req/s over 10 s, nothing scraped), served by `serve`."""
    settings = study(tmp_path)
    (tmp_path / "nightly").mkdir()
    (tmp_path / "nightly" / "history.jsonl").write_text(json.dumps(night) + "\n")
    source = TritonSource(["127.0.0.1:1"], model="m", window_s=60)
    source.window.add("127.0.0.1:1", 1000.0, {"1": (0.0,) * 6})
    source.window.add("127.0.0.1:1", 1010.0, {"1": (500.0, 0.0, 500.0, 50.0, 500.0, 1000.0)})
    collector = AuditCollector(settings, source, window_s=60, nightly=tmp_path / "nightly", refresh_s=0.0)
    port = free_ports(1)[0]
    server = serve(collector, port=port)
    try:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept": accept})
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.read().decode()
    finally:
        server.shutdown()
        server.server_close()


def test_the_exporter_answers_on_metrics_and_says_where_they_are_elsewhere(tmp_path):
    # prometheus_client's start_http_server answered 200 with the metrics on any path: a scrape config's
    # typo (/metric) looked healthy
    text = exporter_metrics(tmp_path, NIGHTS["requests"])
    assert "tuner_production_requests_per_second" in text
    settings = study(tmp_path / "b")
    collector = AuditCollector(settings, TritonSource(["127.0.0.1:1"], model="m", window_s=60), window_s=60)
    port = free_ports(1)[0]
    server = serve(collector, port=port)
    try:
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metric", timeout=10)
        assert missing.value.code == 404 and b"the metrics are at /metrics" in missing.value.read()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            assert r.status == 200 and b"/metrics" in r.read()
    finally:
        server.shutdown()
        server.server_close()


def family_names(families) -> Counter:
    return Counter(f.name for f in families)


@pytest.mark.parametrize("unit", sorted(NIGHTS))
def test_the_exporter_serves_one_family_per_name(tmp_path, unit):
    # the nightly's two configs were two families of one name, HELP and TYPE said twice: Prometheus's
    # text parser refuses the scrape, the OpenMetrics parser says "Received metadata after samples"
    text = exporter_metrics(tmp_path, NIGHTS[unit])
    # (prometheus_client's text parser merges a repeated family silently: the header lines are counted)
    helps = Counter(line.split()[2] for line in text.splitlines() if line.startswith("# HELP "))
    assert max(helps.values()) == 1, [n for n, c in helps.items() if c > 1]
    score = "tuner_nightly_output_tokens_per_dollar" if unit == "tokens" else "tuner_nightly_requests_per_dollar"
    got = samples(text)
    assert {c for (name, labels) in got if name == score for k, c in labels if k == "config"} == {"production", "best"}
    assert got[("tuner_production_requests_per_second", LABELS)] == 50  # the audit is served beside it
    om = list(openmetrics_families(exporter_metrics(tmp_path / "om", NIGHTS[unit], accept=OPENMETRICS)))
    assert max(family_names(om).values()) == 1
    assert len([s for f in om if f.name == score for s in f.samples]) == 2


def test_building_a_textfile_twice_keeps_each_sample_once(tmp_path):
    # the families merged for one exposition stay as built: a second exposition of them says each sample once
    labels = labels_for(study(tmp_path))
    families = nightly_families(NIGHTS["requests"], labels)
    first = write_textfile(tmp_path / "a.prom", families).read_text()
    assert write_textfile(tmp_path / "b.prom", families).read_text() == first
    assert first.count("tuner_nightly_requests_per_dollar{") == 2


def promtool_check(text: str) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)


def test_promtool_accepts_what_the_exporter_serves(prometheus_tools, tmp_path):
    for unit, night in NIGHTS.items():
        done = promtool_check(exporter_metrics(tmp_path / unit, night))
        assert done.returncode == 0, f"{unit}: {done.stdout}{done.stderr}"


def test_promtool_accepts_the_textfiles(prometheus_tools, tmp_path):
    # `tuner audit --prometheus --textfile` (the study's constants, the SLA's among them) and `tuner nightly`
    settings = study(tmp_path)
    labels = labels_for(settings)
    audit_text = write_textfile(tmp_path / "audit.prom", study_families(
        settings, labels, max_batch_size=32, baseline=BASELINE) + audit_families(audit(tmp_path), labels)).read_text()
    # the SLA's percentile as Triton's summaries write their quantile (0.99), in a label of another name:
    # Prometheus reserves `quantile` for summaries
    assert samples(audit_text)[("tuner_sla_latency_seconds", lab(percentile="0.99"))] == pytest.approx(0.2)
    for name, text in [("audit", audit_text), *((unit, write_textfile(
            tmp_path / f"{unit}.prom", nightly_families(night, labels)).read_text()) for unit, night in NIGHTS.items())]:
        done = promtool_check(text)
        assert done.returncode == 0, f"{name}: {done.stdout}{done.stderr}"
