"""The dated run directory, written whole or not at all.

A night writes into `<output>/.staging-<stamp>-<pid>/`, and only when everything is there renames it
to `<output>/runs/<stamp>/` and points `<output>/latest` at it (both atomic on one file system). A run
killed halfway leaves a staging directory that the next run (holding the lock) removes; one refused on
bad input removes its own (`staging`); the previous runs, `latest` and the history are never touched
before that point.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from tuner.errors import InputError

RUNS = "runs"
LATEST = "latest"
DECISION = "decision.json"  # in every run directory: a night's is published whole, so it holds one
STAGING_PREFIX = ".staging-"
SERVER_LOGS = "server"  # in the staging directory: the night's server writes its log here


def is_latest(path: Path) -> bool:
    """Whether `path` is the link a night made: a symbolic link into `runs/`."""
    return path.is_symlink() and Path(os.readlink(path)).parent == Path(RUNS)


def is_runs(path: Path) -> bool:
    """Whether `path` is the directory nights publish into: empty, or holding a night's run directory."""
    if not path.is_dir():
        return False
    entries = list(path.iterdir())
    return not entries or any((entry / DECISION).is_file() for entry in entries)


def night_stamp(now: datetime | None = None) -> str:
    """UTC, sortable, safe in a path: 2026-11-30T021500Z."""
    now = now or datetime.now(UTC)
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H%M%SZ")


def clear_stale_staging(output: str | Path) -> list[Path]:
    """Remove what killed runs left (call with the lock held: no other run is writing)."""
    removed = []
    for d in Path(output).glob(STAGING_PREFIX + "*"):
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


def staging_dir(output: str | Path, stamp: str) -> Path:
    """A new staging directory for the night `stamp`, named with this process's pid."""
    d = Path(output) / f"{STAGING_PREFIX}{stamp}-{os.getpid()}"
    d.mkdir(parents=True)
    return d


@contextmanager
def staging(output: str | Path, stamp: str) -> Iterator[Path]:
    """A new staging directory for the night `stamp` (`staging_dir`), removed when the night is refused
    on bad input (exit 2) inside the block: such a night leaves nothing behind. One whose server wrote
    a log is kept (the error names the log) until the next run clears it, as a killed run's is."""
    d = staging_dir(output, stamp)
    try:
        yield d
    except InputError:
        if not (d / SERVER_LOGS).exists():
            shutil.rmtree(d, ignore_errors=True)
        raise


def publish(staging: Path, output: str | Path, stamp: str) -> Path:
    """Move a finished staging directory into `runs/` and repoint `latest`; returns the run dir."""
    runs = Path(output) / RUNS
    runs.mkdir(parents=True, exist_ok=True)
    final = runs / stamp
    n = 2
    while final.exists():
        final = runs / f"{stamp}-{n}"
        n += 1
    os.rename(staging, final)
    link = Path(output) / LATEST
    tmp = Path(output) / f".{LATEST}-{os.getpid()}"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(Path(RUNS) / final.name, tmp)
    os.replace(tmp, link)
    return final
