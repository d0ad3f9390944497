"""deploy/prometheus/tuner-rules.yml: `promtool check rules` accepts it and `promtool test rules` runs
its unit tests (tuner-rules.test.yml: each alert fires when it should and not before, the recording
rules give the figures worked out by hand); a rule changed under the tests makes them fail."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


def promtool(*args: str, cwd: Path = RULES) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_rules_pass_promtool_check(prometheus_tools):
    done = promtool("check", "rules", "tuner-rules.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 9 rules found" in done.stdout


def test_every_alert_has_a_unit_test_and_they_pass(prometheus_tools):
    rules, tests = (RULES / "tuner-rules.yml").read_text(), (RULES / "tuner-rules.test.yml").read_text()
    for alert in ("TritonBatchFillLow", "TritonThroughputRatioLow", "TritonLatencyOverSLA"):
        assert f"alert: {alert}" in rules and f"alertname: {alert}" in tests
    done = promtool("test", "rules", "tuner-rules.test.yml")
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize(
    "rule, changed",
    [
        ("expr: model:tuner_batch_fill_ratio:rate5m < 0.5\n        for: 1h", "expr: model:tuner_batch_fill_ratio:rate5m < 0.5\n        for: 30m"),
        ("model:tuner_throughput_ratio:rate1h < 0.6", "model:tuner_throughput_ratio:rate1h < 0.05"),
        ("* 3600\n", "* 60\n"),
    ],
)
def test_a_changed_rule_fails_its_unit_test(prometheus_tools, tmp_path, rule, changed):
    text = (RULES / "tuner-rules.yml").read_text()
    assert rule in text
    (tmp_path / "tuner-rules.yml").write_text(text.replace(rule, changed))
    shutil.copy(RULES / "tuner-rules.test.yml", tmp_path)
    done = promtool("test", "rules", "tuner-rules.test.yml", cwd=tmp_path)
    assert done.returncode != 0 and "FAILED" in done.stdout + done.stderr
