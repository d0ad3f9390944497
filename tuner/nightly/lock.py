"""One nightly run at a time per output directory.

An exclusive `flock` on `<output>/nightly.lock`, taken without waiting: a second run fails at once
naming the holder's pid. The kernel drops the lock when its process dies, so a killed run leaves no
stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
import re
from contextlib import contextmanager
from pathlib import Path

from tuner.errors import OutputError, TunerError
from tuner.files import os_reason

LOCK_NAME = "nightly.lock"


class LockedError(TunerError):
    """Another nightly run holds the lock (exit 1: the scheduler retries later)."""


def is_lock(path: Path) -> bool:
    """Whether `path` is a lock file a run made: a regular file holding a pid, or nothing yet."""
    if not path.is_file():
        return False
    with open(path, "rb") as fh:
        return re.fullmatch(rb"\d*\n?", fh.read(65)) is not None


@contextmanager
def run_lock(output: str | Path):
    """Hold `<output>/nightly.lock` for the block (yields its path); LockedError if another run holds it,
    OutputError (one line) if the lock cannot be made there (a directory in the way, no permission)."""
    root = Path(output)
    path = root / LOCK_NAME
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise OutputError(f"{path}: cannot make the nightly lock ({os_reason(exc)})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise LockedError(f"{path}: another nightly run holds the lock (pid {holder})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        os.close(fd)  # closing the descriptor releases the flock
