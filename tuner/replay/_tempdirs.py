"""The replay's temporary directories. Each records the pid of the process that made it, so a directory
left behind by a killed owner (SIGKILL skips every cleanup) is removed by the next replay on the host."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PREFIX = "tuner-replay-"
OWNER_FILE = "owner.pid"


@contextmanager
def owned_tempdir(prefix: str = PREFIX) -> Iterator[Path]:
    """A fresh temporary directory holding this process's pid, removed on exit; stale ones go first."""
    sweep_stale(prefix)
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        (Path(tmp) / OWNER_FILE).write_text(str(os.getpid()))
        yield Path(tmp)


def sweep_stale(prefix: str = PREFIX, directory: str | Path | None = None) -> list[Path]:
    """Remove the `prefix*` directories whose recorded owner process is gone; returns what was removed.

    A directory without an owner file (being made right now, or not ours) or whose owner runs is kept.
    """
    removed = []
    for path in Path(directory or tempfile.gettempdir()).glob(f"{prefix}*"):
        try:
            os.kill(int((path / OWNER_FILE).read_text()), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        except (OSError, ValueError):
            continue  # no owner file (yet), an owner we may not signal, or not a pid: not ours to judge
    return removed
