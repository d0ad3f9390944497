"""Reading what a person gives, in one line when it cannot be read (`open_input`, and `read_text`
over it: a config.pbtxt parsed, a study, a profile, a traffic file and a trace are read through them;
`read_json_object`), and writing what a person keeps: whole files or nothing, and a check before
minutes of work that the place can be written at all. A write that fails (a full disk, a read-only
file system or /proc, a name too long, a directory in the way) says which file and why in one line,
and leaves no partial file behind: the data goes to a temporary file beside the target
(`.tuner-<hex>.tmp`, never taken for a traffic file or a config), which is renamed over it once
complete. The checks of a path a person gave (can it be read, can a file or a directory be made
there) are in tuner.paths."""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO

from tuner.errors import InputError, OutputError
from tuner.paths import make_temp, name_max, os_reason, writable_dir

__all__ = ["cache_path", "check_output_dir", "check_replaceable", "check_writable", "json_safe", "json_with_keys", "open_input",
           "os_reason", "read_json_object", "read_text", "replacing", "write_atomic"]


def cache_path(variable: str, name: str) -> Path:
    """Where a cache of tuner's lives, nothing made: $`variable` when set, else
    `$XDG_CACHE_HOME/tuner/<name>`, else `~/.cache/tuner/<name>` (`name` may hold a `/`). The one rule
    for every cache: the traffic and LLM caches (user_cache) and the Triton install."""
    given = os.environ.get(variable)
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tuner" / name


def user_cache(variable: str, name: str) -> Path:
    """The cache directory cache_path names, made if missing. One that cannot be made or written (a
    file, a read-only place) is an OutputError naming the variable, not a traceback where it is used."""
    path = cache_path(variable, name)
    given = os.environ.get(variable)
    label = f"{variable}={given}" if given else f"the cache directory {path} (set {variable} for another)"
    return writable_dir(path, label=label, create=True)


def json_safe(value):
    """A value JSON can hold: NaN and infinity (an unmeasured figure) become null, numpy scalars
    plain numbers, mapping keys text."""
    if hasattr(value, "item") and not isinstance(value, (dict, list, tuple)):  # numpy scalars
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def open_input(path: str | os.PathLike, *, what: str = "a file", label: str | None = None,
               error: type[InputError] = InputError) -> IO[bytes]:
    """The file a person named, open for reading in binary; otherwise one `error` line starting with
    `label` (default: the path): `no such file`, `is a directory, not <what>`, `not a regular file` (a
    FIFO would block the read) or `cannot read (<the OS's reason>)` (a name too long, a symbolic-link
    loop, no permission)."""
    label = label or str(path)
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISDIR(mode):
            raise error(f"{label}: is a directory, not {what}")
        if not stat.S_ISREG(mode):
            raise error(f"{label}: not a regular file")
        return open(path, "rb")
    except FileNotFoundError:
        raise error(f"{label}: no such file") from None
    except OSError as exc:
        raise error(f"{label}: cannot read ({os_reason(exc)})") from None


def read_text(path: str | os.PathLike, *, error: type[InputError], what: str = "a file",
              label: str | None = None, max_bytes: int | None = None, encoding: str = "utf-8") -> str:
    """The text of the file a person named (opened by `open_input`, lines ending in a newline
    whatever ended them); `error` starting with `label` (default: the path) otherwise:
    `not a text file (byte <n> is not UTF-8)`, or past `max_bytes` `too large (<size>; ...)`,
    said before it is read."""
    label = label or str(path)
    with open_input(path, what=what, label=label, error=error) as fh:
        try:
            data = fh.read() if max_bytes is None else _read_at_most(fh, max_bytes, label, error=error)
        except OSError as exc:
            raise error(f"{label}: cannot read ({os_reason(exc)})") from None
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise error(f"{label}: not a text file (byte {exc.start} is not UTF-8)") from None
    # what a file opened as text reads: \r\n and \r end a line as \n does
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _read_at_most(fh: IO[bytes], max_bytes: int, label: str, *, error: type[InputError]) -> bytes:
    size = os.fstat(fh.fileno()).st_size
    data = fh.read(max_bytes + 1) if size <= max_bytes else None
    if data is None or len(data) > max_bytes:  # a pipe or /proc file has no size to stat
        shown = _in_words(size) if size > max_bytes else f"over {_in_words(max_bytes)}"
        raise error(f"{label}: too large ({shown}; at most {_in_words(max_bytes)} is read)")
    return data


def _in_words(size: int) -> str:
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size:,} bytes"


def read_json_object(path: str | os.PathLike, *, label: str | None = None, missing: str = "not found",
                     error: type[InputError] = InputError) -> dict:
    """A JSON file whose top level is an object. A file that is missing, unreadable, not JSON or not an
    object is one `error` line starting with `label` (default: the path); `missing` says what a
    missing file means to the reader."""
    label = label or str(path)
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise error(f"{label}: {missing}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        reason = os_reason(exc) if isinstance(exc, OSError) else exc
        raise error(f"{label}: not valid JSON ({reason})") from None
    if not isinstance(data, dict):
        raise error(f"{label}: expected a JSON object at the top level")
    return data


def json_with_keys(path: str | os.PathLike, keys: frozenset[str] | set[str]) -> bool:
    """Whether `path` holds a JSON object with every one of `keys`: how a command tells a --json file it
    wrote (check_replaceable's `ours`) from someone's own. A file that is not JSON is not read whole."""
    with open(path, "rb") as fh:
        if not fh.read(64).lstrip().startswith(b"{"):
            return False
        fh.seek(0)
        try:
            data = json.load(fh)
        except (ValueError, UnicodeDecodeError):
            return False
    return isinstance(data, dict) and set(keys) <= data.keys()


def check_writable(path: str | os.PathLike, *, label: str | None = None,
                   error: type[InputError] = OutputError) -> Path:
    """The path, once a new file can be made there (its directory exists and takes a new file, the
    name fits, no directory is in the way): checked before the work that would fill it. Raises
    `error` starting with `label` (default: the path). The one rule for a file a person names
    (`--json`, `profile -o`, a traffic file): a missing directory is refused, never made (a typo
    would leave a new tree behind); only a study's own output directory is made (check_output_dir)."""
    path = Path(path)
    _check_target(path, label or str(path), error)
    fd, probe = make_temp(path.parent, ".probe", label or str(path), error=error)
    os.close(fd)
    os.unlink(probe)
    return path


def check_replaceable(path: str | os.PathLike, *, force: bool, label: str | None = None,
                      error: type[InputError] = OutputError, ours: Callable[[Path], bool] | None = None) -> Path:
    """The path, once writing it replaces nothing the person did not agree to lose: nothing is there
    (not even a dangling symbolic link, which a write would follow), a regular file tuner wrote
    (`ours(path)`, which reads what it needs to tell), or `force` (`--force` was given). Otherwise one
    `error` line naming the file (or `label`). The one place every command that writes a file a person
    names decides this: export, config set, simulate, profile, replay, audit and the traffic writers."""
    path = Path(path)
    if force or not os.path.lexists(path):
        return path
    label = label or str(path)
    if ours is None:
        raise error(f"{label}: already exists; give --force to replace it, or write to another file")
    try:
        mine = path.is_file() and ours(path)  # a FIFO, a device: not a file tuner wrote, and not to be read
    except OSError as exc:
        raise error(f"{label}: cannot read the file there ({os_reason(exc)})") from None
    if not mine:
        raise error(f"{label}: exists and tuner did not write it: give --force to replace it, "
                    "or write to another file")
    return path


def check_output_dir(path: str | os.PathLike, what: str, *, create: bool = True,
                     ours: Mapping[str, Callable[[Path], bool]] | None = None) -> Path:
    """Make the directory (and its parents) and prove a file can be written in it; OutputError
    naming `what` (e.g. `output directory`) otherwise. Without `create` nothing is made: the nearest
    directory that exists must take a new file (tuner.paths.writable_dir). `ours`: the names the
    command writes in the directory, each with how to tell the one it wrote (`ours[name](path)`, which
    reads what it needs); one there that tuner did not write is someone's own, not tuner's to replace
    or add to: refused before anything is made, in one line naming them."""
    label = f"{what} {path}"
    if ours:
        _check_ours(Path(path), ours, label)
    return writable_dir(path, label=label, create=create)


def _check_ours(folder: Path, ours: Mapping[str, Callable[[Path], bool]], label: str) -> None:
    taken = []
    for name, mine in ours.items():
        entry = folder / name
        try:
            # lexists: a link (even a dangling one) of the name is there as much as a file
            if os.path.lexists(entry) and not mine(entry):
                taken.append(name)
        except OSError as exc:
            raise OutputError(f"{label}: cannot read {name} there ({os_reason(exc)})") from None
    if taken:
        raise OutputError(f"{label}: holds {', '.join(taken)}, which tuner did not write there: "
                          "name a new or empty directory (nothing was changed)")


@contextlib.contextmanager
def replacing(path: str | os.PathLike, *, label: str | None = None,
              error: type[InputError] = OutputError) -> Iterator[Path]:
    """A temporary path beside `path` to write into; renamed over `path` when the block succeeds
    (keeping the mode of a file it replaces; through a symbolic link, the file it points to),
    removed when it fails. An OSError becomes `error` naming the file and the OS's reason."""
    path = Path(path)
    label = label or str(path)
    _check_target(path, label, error)
    real = Path(os.path.realpath(path))
    fd, tmp = make_temp(real.parent, ".tmp", label, error=error)
    os.close(fd)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.chmod(tmp, stat.S_IMODE(real.stat().st_mode))
        yield Path(tmp)
        os.replace(tmp, real)
        tmp = None
    except OSError as exc:
        raise error(f"{label}: cannot write ({os_reason(exc)})") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def write_atomic(path: str | os.PathLike, data: str | bytes, *, label: str | None = None,
                 error: type[InputError] = OutputError) -> Path:
    """Write the whole of `data` to `path` (its directory made if needed), or leave `path` as it was."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise error(f"{label or path}: cannot write ({os_reason(exc)})") from None
    with replacing(path, label=label, error=error) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
    return path



def _check_target(path: Path, label: str, error: type[InputError]) -> None:
    """Refuse a file that cannot be made at `path` whatever the permissions."""
    folder = path.parent
    try:
        if not stat.S_ISDIR(folder.stat().st_mode):
            raise error(f"{label}: cannot write: {folder} is not a directory")
    except FileNotFoundError:
        raise error(f"{label}: cannot write: no directory {folder}") from None
    except OSError as exc:
        raise error(f"{label}: cannot write ({os_reason(exc)})") from None
    limit = name_max(folder)
    size = len(os.fsencode(path.name))
    if size > limit:
        raise error(f"{label}: cannot write (File name too long: {size} bytes, the most here is {limit})")
    try:
        if stat.S_ISDIR(path.stat().st_mode):
            raise error(f"{label}: cannot write: it is a directory")
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise error(f"{label}: cannot write ({os_reason(exc)})") from None
