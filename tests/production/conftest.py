"""The production audit's tests need Debian's prometheus package (its `prometheus` and `promtool`):
scripts/run-tests.sh installs it as root; elsewhere those tests skip saying why, or fail in CI."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def prometheus_tools() -> None:
    """Skip (or, with TUNER_REQUIRE_ALL=1, fail) unless prometheus and promtool are installed."""
    absent = [tool for tool in ("prometheus", "promtool") if shutil.which(tool) is None]
    if absent:
        reason = (
            f"{' and '.join(absent)} not installed (as root: apt-get install prometheus; "
            "scripts/run-tests.sh does it)"
        )
        if os.environ.get("TUNER_REQUIRE_ALL") == "1":
            pytest.fail(f"TUNER_REQUIRE_ALL=1 but {reason}", pytrace=False)
        pytest.skip(reason)


@pytest.fixture
def exporter_process():
    """`tuner exporter ARGS --port PORT` from this checkout, as a context manager yielding the process and
    its first line (said once it serves); on leaving, SIGTERM, and it must stop cleanly (exit 0, one line)."""

    @contextlib.contextmanager
    def run(*args: str, port: int):
        proc = subprocess.Popen(
            [sys.executable, "-m", "tuner", "exporter", *args, "--port", str(port)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
            start_new_session=True,
        )
        try:
            yield proc, proc.stdout.readline()
            os.kill(proc.pid, signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
            assert proc.stdout.read() == "tuner exporter: stopped\n"
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    return run
