"""The source distribution holds what its tests read (templates, traffic, examples, scripts), and the wheel
the package with the data it reads at run time."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _build(kind: str, out: Path) -> Path:
    """Built from a copy of the source without the checkout's build state: setuptools takes an existing
    tuner.egg-info/SOURCES.txt (an editable install's) as the file list, which would hide what
    MANIFEST.in leaves out."""
    source = out / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "*.egg-info", "build", "dist", "__pycache__", ".pytest_cache", ".ruff_cache", "runs", ".gpu"))
    code = f"from setuptools import build_meta as b; print(b.build_{kind}({str(out)!r}))"
    done = subprocess.run([sys.executable, "-c", code], cwd=source, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    return out / done.stdout.strip().splitlines()[-1]


def test_the_sdist_holds_what_its_tests_read(tmp_path):
    # it shipped 67 test files without the templates and traffic their conftest reads
    with tarfile.open(_build("sdist", tmp_path)) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    for needed in ("tests/conftest.py", "model_repository_templates/encoder_sim/config.pbtxt",
                   "traffic_profiles/bursty_60s.csv", "examples/quickstart.yaml", "scripts/run-tests.sh",
                   "tests/data/replay_models/echo/config.pbtxt", "LICENSE"):
        assert needed in names, needed
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".db"))]


def test_the_wheel_holds_the_package_and_its_price_table(tmp_path):
    with zipfile.ZipFile(_build("wheel", tmp_path)) as wheel:
        names = set(wheel.namelist())
    assert "tuner/data/prices.yaml" in names and "tuner/cli/__init__.py" in names
    assert not [n for n in names if n.startswith(("tests/", "model_repository_templates/"))]
