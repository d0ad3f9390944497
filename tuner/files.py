"""Writing what a person keeps: whole files or nothing, and a check before minutes of work that
the place can be written at all. A write that fails (a full disk, a read-only file system, a name
too long, a directory in the way) says which file, in one line, and leaves no partial file behind."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from tuner.errors import OutputError

__all__ = ["check_output_dir", "check_output_file", "write_atomic"]


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def check_output_dir(path: str | Path, what: str) -> Path:
    """Make the directory (and its parents) and prove a file can be written in it; OutputError
    naming `what` (e.g. `--output`) otherwise."""
    path = Path(path)
    try:
        if path.exists() and not path.is_dir():
            raise OutputError(f"{what} {path}: exists and is not a directory")
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".tuner-write-check-"):
            pass
    except OSError as exc:
        raise OutputError(f"{what} {path}: cannot write there: {_reason(exc)}") from None
    return path


def check_output_file(path: str | Path, what: str) -> Path:
    """Prove `path` can be written (its directory made if needed) without leaving anything there."""
    path = Path(path)
    try:
        if path.is_dir():
            raise OutputError(f"{what} {path}: is a directory (give a file name)")
        if len(path.name.encode()) > 255:
            raise OSError(36, os.strerror(36))  # ENAMETOOLONG: said before a directory is made for it
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".tuner-write-check-"):
            pass
    except OSError as exc:
        raise OutputError(f"{what} {path}: cannot write there: {_reason(exc)}") from None
    return path


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write the whole of `data` to `path`, or leave `path` as it was: a temporary file beside it,
    renamed into place (keeping the mode of a file it replaces). OutputError names the file when it
    cannot be written."""
    path = Path(path)
    tmp = None
    try:
        if path.is_dir():
            raise OutputError(f"{path}: is a directory, cannot write a file there")
        mode = path.stat().st_mode & 0o777 if path.exists() else _default_mode()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:100]}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise OutputError(f"{path}: cannot write it: {_reason(exc)}") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return path


def _default_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask
