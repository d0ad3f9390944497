"""The CLI starts light: `tuner --help` and `tuner config ...` import none of the heavy libraries
(the commands that measure import them when they run). Each case is a fresh interpreter, since this
test process has imported everything already. Start-up time itself is measured by
benchmarks/cli_startup.py, not asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "model_repository_templates" / "encoder_sim" / "config.pbtxt"
HEAVY = ("pandas", "scipy", "optuna", "locust", "gevent", "plotly", "pyarrow", "sqlalchemy")

# Runs the CLI in-process and prints the heavy modules it imported, whatever the exit code.
PROBE = """
import json, sys
from tuner.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
heavy = sorted({m.split('.')[0] for m in sys.modules} & set(json.loads(HEAVY)))
print(json.dumps({"code": code, "heavy": heavy}))
"""


def _imports(*argv: str) -> dict:
    code = PROBE.replace("json.loads(HEAVY)", repr(json.dumps(HEAVY)).join(("json.loads(", ")")))
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [
    ["--help"],
    ["tune", "--help"],
    ["config", "check", str(CONFIG)],
    ["config", "show", str(CONFIG)],
    ["config", "set", str(CONFIG), "--set", "max_batch_size=8", "-o", "{tmp}/config.pbtxt"],
], ids=lambda argv: " ".join(argv[:2]))
def test_the_cli_starts_without_the_heavy_libraries(argv, tmp_path):
    result = _imports(*(a.replace("{tmp}", str(tmp_path)) for a in argv))
    assert result["code"] == 0
    assert result["heavy"] == [], f"tuner {' '.join(argv)} imported {result['heavy']}"


def test_the_probe_sees_a_heavy_import():
    # The check above could pass by never seeing anything: a command that reads traffic does import them
    # (a config.pbtxt passes the path check and is refused by the traffic reader, which needs pandas).
    result = _imports("traffic", "stats", str(CONFIG))
    assert result["code"] == 2
    assert "pandas" in result["heavy"]
