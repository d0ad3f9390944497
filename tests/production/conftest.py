"""The production audit's tests need Debian's prometheus package (its `prometheus` and `promtool`):
scripts/run-tests.sh installs it as root; elsewhere those tests skip saying why, or fail in CI."""

from __future__ import annotations

import os
import shutil

import pytest


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
