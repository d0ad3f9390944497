"""A path a person gave: the checks that it can be read or written, each failure one line naming the
path and the OS's reason (a name too long, a symbolic-link loop, a file where a directory is expected,
a directory where a file is, a place that takes no new file).

The command line checks its path arguments with these before any work (tuner/cli/_args.py), the
settings loaders the paths a study or nightly YAML names, and tuner.files the outputs it writes. A
check creates nothing that outlives it: a writable place is proven by making and removing an empty
file (`.tuner-<hex>.probe`); a directory is made only when asked (`writable_dir(create=True)`).
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

from tuner.errors import InputError, OutputError
from tuner.formats import first_line

__all__ = ["NEVER_NAMEABLE", "make_temp", "name_max", "nameable", "os_reason", "probe", "readable", "readable_dir",
           "readable_file", "writable_dir", "writable_file"]

# The errors that no later step can cure: the name itself is not one the OS can open.
NEVER_NAMEABLE = (errno.ENAMETOOLONG, errno.ELOOP, errno.ENOTDIR)


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """True when two paths name one file (the same resolved path, or one file through links)."""
    try:
        return Path(a).resolve() == Path(b).resolve() or (Path(a).exists() and os.path.samefile(a, b))
    except (OSError, RuntimeError):  # a loop of links, a name too long: not the same file as far as known
        return False


def os_reason(exc: OSError) -> str:
    """The OS's words for an OSError (`File name too long`), without the path it repeats."""
    return exc.strerror or first_line(exc)


# --- reading ---------------------------------------------------------------------------------------

def readable_file(path: str | os.PathLike, *, label: str | None = None, what: str = "a file",
                  error: type[InputError] = InputError) -> Path:
    """The path, once it names a file this process can open (not a directory); otherwise `error`
    `<label>: no such file`, `<label>: is a directory, not <what>` or `<label>: cannot read (<why>)`."""
    path, label = _given(path, label, error)
    st = _stat(path, label, "cannot read", error=error)
    if st is None:
        raise error(f"{label}: no such file")
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{label}: is a directory, not {what}")
    _open(path, label, error)
    return path


def readable_dir(path: str | os.PathLike, *, label: str | None = None, what: str = "a file",
                 error: type[InputError] = InputError) -> Path:
    """The path, once it names a directory this process can list; otherwise `error` naming it
    (`<label>: is <what>, not a directory` where something else is there)."""
    path, label = _given(path, label, error)
    st = _stat(path, label, "cannot read", error=error)
    if st is None:
        raise error(f"{label}: no such directory")
    if not stat.S_ISDIR(st.st_mode):
        raise error(f"{label}: is {what}, not a directory")
    try:
        with os.scandir(path):
            pass
    except OSError as exc:
        raise error(f"{label}: cannot read ({os_reason(exc)})") from None
    return path


def readable(path: str | os.PathLike, *, label: str | None = None,
             error: type[InputError] = InputError) -> Path:
    """The path, once it names a file or a directory this process can read; otherwise `error`
    `<label>: no such file or directory` or the file's or directory's own reason."""
    path, label = _given(path, label, error)
    st = _stat(path, label, "cannot read", error=error)
    if st is None:
        raise error(f"{label}: no such file or directory")
    if stat.S_ISDIR(st.st_mode):
        return readable_dir(path, label=label, error=error)
    return readable_file(path, label=label, error=error)


# --- writing ---------------------------------------------------------------------------------------

def writable_file(path: str | os.PathLike, *, label: str | None = None,
                  error: type[InputError] = OutputError) -> Path:
    """The path, once a file can be written there: not a directory, every name fits, and the nearest
    directory that exists takes a new file (the missing ones between are made when it is written).
    Nothing is left behind."""
    path, label = _given(path, label, error)
    st = _stat(path, label, "cannot write", error=error)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise error(f"{label}: cannot write: it is a directory")
    folder = Path(os.path.realpath(path)).parent if st is not None else _nearest_dir(path, label, error)
    probe(folder, label, error)
    return path


def writable_dir(path: str | os.PathLike, *, label: str | None = None, create: bool = False,
                 error: type[InputError] = OutputError) -> Path:
    """The path, once it is (or can be made) a directory that takes a new file. With `create` it is
    made, with its parents; without, nothing is made (a `--check` leaves no trace)."""
    path, label = _given(path, label, error)
    st = _stat(path, label, "cannot write there", error=error)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise error(f"{label}: exists and is not a directory")
    if st is None:
        folder = _nearest_dir(path, label, error, reason="cannot write there")
        if not create:
            probe(folder, label, error, reason="cannot write there")
            return path
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise error(f"{label}: cannot write there ({os_reason(exc)})") from None
    probe(path, label, error, reason="cannot write there")
    return path


def probe(folder: Path, label: str, error: type[InputError], *, reason: str = "cannot write") -> None:
    """Prove that `folder` takes a new file by making and removing one."""
    fd, name = make_temp(folder, ".probe", label, error=error, reason=reason)
    os.close(fd)
    os.unlink(name)


def make_temp(folder: str | os.PathLike, suffix: str, label: str, *, error: type[InputError],
              reason: str = "cannot write") -> tuple[int, str]:
    """A new empty file in `folder` (mode 0666 less the umask), open for writing: (fd, name)."""
    # a short name, so that a target whose own name is near the limit still has a temporary beside it
    name = os.path.join(folder, f".tuner-{secrets.token_hex(6)}{suffix}")
    try:
        return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), name
    except OSError as exc:
        raise error(f"{label}: {reason}: the directory {folder} takes no new file ({os_reason(exc)})") from None


# --- the settings' check ---------------------------------------------------------------------------

def nameable(path: str | os.PathLike, *, label: str, error: type[InputError] = InputError) -> Path:
    """The path, unless no file could ever be opened by that name: too long, a symbolic-link loop, a
    file where a directory is expected. What is missing or not permitted is left to the step that
    reads or writes it (a study names its output long before anything is written there)."""
    path, label = _given(path, label, error)
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno in NEVER_NAMEABLE:
            raise error(f"{label}: {os_reason(exc)}") from None
    return path


# --- helpers ---------------------------------------------------------------------------------------

def _given(path: str | os.PathLike, label: str | None, error: type[InputError]) -> tuple[Path, str]:
    text = os.fspath(path)
    if text == "":
        raise error(f"{label or repr(text)}: an empty path (name a file or directory)")
    if "\0" in text:
        raise error(f"{label or repr(text)}: a path cannot hold a NUL character")
    return Path(text), label or text


def _stat(path: Path, label: str, doing: str, *, error: type[InputError]) -> os.stat_result | None:
    """What is at `path` (through symbolic links), or None when nothing is; an OSError is `error`."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise error(f"{label}: {doing} ({os_reason(exc)})") from None


def _open(path: Path, label: str, error: type[InputError]) -> None:
    # O_NONBLOCK: a FIFO given by mistake is refused later by its reader instead of hanging here
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
    except OSError as exc:
        raise error(f"{label}: cannot read ({os_reason(exc)})") from None


def _nearest_dir(path: Path, label: str, error: type[InputError], *, reason: str = "cannot write") -> Path:
    """The nearest existing ancestor of `path` (which does not exist), once it is a directory and
    every name below it fits."""
    missing = [path]
    folder = path.parent
    while True:
        st = _stat(folder, label, reason, error=error)
        if st is not None:
            break
        missing.append(folder)
        folder = folder.parent
    if not stat.S_ISDIR(st.st_mode):
        raise error(f"{label}: {reason}: {folder} is not a directory")
    limit = name_max(folder)
    for part in missing:
        size = len(os.fsencode(part.name))
        if size > limit:
            raise error(f"{label}: {reason} (File name too long: {size} bytes, the most here is {limit})")
    return folder


def name_max(folder: Path) -> int:
    """The longest file name (in bytes) the file system under `folder` takes (255 when it will not say)."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255
