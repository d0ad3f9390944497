"""The package's import direction (pyproject.toml [tool.importlinter]): data flows one way, server
control and config handling are leaves, and only the replay package imports locust/gevent."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_hold():
    lint = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    out = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def test_importing_tuner_does_not_patch_the_process_with_gevent():
    code = (
        "import tuner.cli, tuner.search, tuner.trial.run, tuner.replay, sys; "
        "bad = [m for m in ('gevent', 'locust') if m in sys.modules]; "
        "print(','.join(bad)); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, f"imported at top level: {out.stdout.strip()} {out.stderr[-500:]}"
