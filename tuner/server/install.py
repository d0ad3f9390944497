"""Find (or install once) the `tritonserver` binary that the `nvidia-pytriton` wheel bundles.

The wheel pins numpy<2, so it is never installed into the project's environment: it goes, without its
dependencies, into a directory of its own (`pip install --no-deps --target DIR`). The directory is,
in order: the `install_dir` argument, `$TUNER_TRITON_HOME`, `$XDG_CACHE_HOME/tuner/triton/nvidia-pytriton-0.7.0`,
or `~/.cache/tuner/triton/nvidia-pytriton-0.7.0` (tuner.files.cache_path, the rule of every cache of tuner's).

The Python backend's stub embeds the system Python and was built against numpy 1 (with numpy 2 its
output tensors come back empty), so a `numpy<2` for the stub's Python version is installed next to
it (`model-python/`); the launcher hands that directory to models as `TUNER_MODEL_PYTHONPATH`, followed
by the user's own `TUNER_MODEL_PYTHONPATH` and tuner's site-packages (`model_pythonpath`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import platform
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import ServerSetupError
from tuner.files import cache_path

WHEEL = "nvidia-pytriton==0.7.0"
MODEL_NUMPY = "numpy>=1.24,<2"
TRITON_VERSION = "2.51.0"
MIN_GLIBC = (2, 35)
# below the user cache, each release in a directory of its own: another WHEEL installs beside it
DEFAULT_NAME = "triton/nvidia-pytriton-0.7.0"
LOCK = ".tuner-install.lock"  # in the install directory: installs into it take turns
STAGING = ".tuner-staging-"  # pip fills one of these in the install directory, then it is moved in
# what earlier versions staged in the install directory: .wheel, .wheel.XXXXXXXX, .model-python3.11.XXXXXXXX
_OLD_STAGING = re.compile(r"\.(wheel|model-python[0-9.]+)(\.[a-z0-9_]{8})?")
# pip's log: each line after its time; the OS's words for an error (up to the path it names); its errors
_PIP_STAMP = re.compile(r"^\d{4}-\d\d-\d\dT[0-9:,.]+ ")
_PIP_ERRNO = re.compile(r"\[Errno -?\d+\] [^:'\"]+")
_PIP_ERROR = re.compile(r"ERROR: (.+)")
# Where the dynamic loader looks for a system libpython (Debian/Ubuntu/RHEL layouts).
_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")


@dataclass(frozen=True, kw_only=True)
class TritonInstall:
    """A Triton install from the nvidia-pytriton wheel: its binary, libraries, backends and models' numpy."""

    root: Path  # the pip --target directory
    binary: Path  # .../pytriton/tritonserver/bin/tritonserver
    lib_dir: Path  # the wheel's bundled shared libraries (LD_LIBRARY_PATH)
    backends_dir: Path  # --backend-directory: python/{libtriton_python.so, utils, stub}
    python_version: str  # the Python whose stub is in backends_dir/python, e.g. "3.11"
    model_pythonpath: Path  # numpy<2 for that Python: what models put on sys.path
    version: str = TRITON_VERSION


def install_dir_for(install_dir: str | Path | None = None) -> Path:
    """Where the Triton install lives: `install_dir`, else $TUNER_TRITON_HOME, else the user cache.
    Nothing is made: a complete install in a read-only place is used as it is."""
    chosen = install_dir or cache_path("TUNER_TRITON_HOME", DEFAULT_NAME)
    return Path(chosen).expanduser().resolve()


def find_tritonserver(install_dir: str | Path | None = None, quiet: bool = False) -> TritonInstall:
    """The Triton install in `install_dir` (see module doc), installing the wheel there if absent."""
    root = install_dir_for(install_dir)
    try:
        if not _binary(root).is_file():
            check_platform()
            _install(root, quiet=quiet)
        install = _prepare(root)
        if not (install.model_pythonpath / "numpy").is_dir():
            _install_model_numpy(install, quiet=quiet)
    except OSError as exc:  # e.g. the directory cannot be created or written
        raise ServerSetupError(f"{root}: cannot install the Triton server there: "
                               f"{exc.strerror or exc}") from None
    return install


def model_pythonpath(install: TritonInstall, user_path: str = "") -> str:
    """`TUNER_MODEL_PYTHONPATH` for the models, in sys.path order: numpy<2 for the stub, the user's own
    entries (`user_path`, os.pathsep-separated), then this interpreter's site-packages when the stub runs
    the same Python version, so that a package installed with tuner (PyTorch for encoder_torch) imports."""
    entries = [str(install.model_pythonpath), *(p for p in user_path.split(os.pathsep) if p)]
    if install.python_version == f"{sys.version_info.major}.{sys.version_info.minor}":
        paths = sysconfig.get_paths()
        entries += [paths["purelib"], paths["platlib"]]
    return os.pathsep.join(dict.fromkeys(entries))  # in order, each once


def pin_stub_python(install: TritonInstall, env: dict[str, str], bin_dir: Path) -> None:
    """Pins, in `env` (a server's environment), the stub's standard library to the system Python's.

    The stub embeds the system's libpython3.X without naming its program, so Python looks for its
    standard library from the first `python3` on PATH: a virtual environment's or pyenv's there gives it
    another build's C modules (CI: pyenv 3.11.7's `_ssl`, which needs a symbol the system's 3.11.2 lacks).
    `bin_dir` gets a `python3` that is the system's python3.X, first on PATH (so the stub's
    `sys.executable` is the Python it runs); without that interpreter, PYTHONHOME names its prefix."""
    library = system_libpython(install.python_version)
    if library is None:  # the stub will not start either; its own error says why
        return
    prefix = next((d for d in library.resolve().parents
                   if (d / "lib" / f"python{install.python_version}" / "os.py").is_file()), None)
    if prefix is None:
        return
    interpreter = prefix / "bin" / f"python{install.python_version}"
    if interpreter.is_file():
        bin_dir.mkdir(parents=True, exist_ok=True)
        link = bin_dir / "python3"
        link.unlink(missing_ok=True)
        link.symlink_to(interpreter)
        env["PATH"] = os.pathsep.join(p for p in (str(bin_dir), env.get("PATH", "")) if p)
    else:
        env["PYTHONHOME"] = str(prefix)


def check_platform() -> None:
    """Raise ServerSetupError unless this machine can run the wheel's tritonserver (x86_64, glibc >= 2.35)."""
    machine = platform.machine()
    if machine not in ("x86_64", "AMD64"):
        raise ServerSetupError(f"the nvidia-pytriton wheel's tritonserver needs x86_64, but this machine is {machine}")
    libc, version = platform.libc_ver()
    if libc != "glibc":
        raise ServerSetupError(f"the nvidia-pytriton wheel's tritonserver needs glibc >= 2.35, but libc is {libc or 'unknown'}")
    found = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if found < MIN_GLIBC:
        raise ServerSetupError(f"the nvidia-pytriton wheel's tritonserver needs glibc >= 2.35, but this machine has {version}")


def _binary(root: Path) -> Path:
    return root / "pytriton" / "tritonserver" / "bin" / "tritonserver"


def _install(root: Path, quiet: bool) -> None:
    _check_ours(root)  # before the lock file in it, too
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root):
        if _binary(root).is_file():  # another process installed it while we waited
            return
        _check_ours(root)
        if not quiet:
            print(f"tuner: installing the Triton server ({WHEEL}, ~55 MB) into {root}", file=sys.stderr)
        started = time.monotonic()
        # staged inside root and moved in, never renamed over it: the lock file is in root
        with _staging(root) as staging:
            _pip_target(staging, WHEEL, [], into=root, quiet=quiet)
            for child in sorted(staging.iterdir(), key=_move_order):
                _replace(root / child.name, child)
        if not _binary(root).is_file():
            raise ServerSetupError(f"{root}: {WHEEL} installed but holds no tritonserver binary")
        if not quiet:
            print(f"tuner: installed in {time.monotonic() - started:.0f} s", file=sys.stderr)


def _move_order(entry: Path) -> int:
    """The dist-info first: a stop midway leaves a directory _check_ours knows as tuner's; pytriton last:
    its binary says the install is complete."""
    return 0 if entry.name.endswith(".dist-info") else 2 if entry.name == "pytriton" else 1


def _replace(target: Path, source: Path) -> None:
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    elif target.exists() or target.is_symlink():
        target.unlink()
    source.rename(target)


def _check_ours(root: Path) -> None:
    """Refuse a directory that holds anything but an earlier install of the wheel: filling it in place
    replaces its top-level entries of the wheel's names (`bin/`, `pytriton/`), and a person's own
    files there would go with them."""
    if not root.is_dir():
        return
    # the lock and the staging directories of a run stopped before the wheel's first entry was in
    entries = [p for p in root.iterdir() if p.name != LOCK and not _is_staging(p.name)]
    if entries and not any(p.name.startswith("nvidia_pytriton-") and p.name.endswith(".dist-info") for p in entries):
        shown = ", ".join(sorted(p.name for p in entries)[:3]) + (", ..." if len(entries) > 3 else "")
        raise ServerSetupError(f"{root}: not empty ({shown}) and not a Triton install of tuner's: name a new or "
                               "empty directory (nothing was changed)")


def _is_staging(name: str) -> bool:
    return name.startswith(STAGING) or bool(_OLD_STAGING.fullmatch(name))


@contextlib.contextmanager
def _staging(root: Path) -> Iterator[Path]:
    """A new directory in `root` for pip to fill, removed on any exit (an error, Ctrl-C, SIGTERM); one
    that a SIGKILL leaves is swept by the next install (_locked)."""
    staging = Path(tempfile.mkdtemp(prefix=STAGING, dir=root))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _pip_target(staging: Path, requirement: str, extra: list[str], *, into: Path, quiet: bool) -> None:
    """`pip install --no-deps --target STAGING REQUIREMENT`, the staging directory of `into`. A failure
    is one line with pip's reason, read from its log (`--log`: pip's output still goes to the terminal
    as it is, its progress bar live, where it is shown at all)."""
    fd, log = tempfile.mkstemp(prefix="tuner-pip-", suffix=".log")
    os.close(fd)
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check",
           "--progress-bar", "on", "--log", log, *extra, "--target", str(staging), requirement]
    try:
        try:
            code = subprocess.run(cmd, stdout=subprocess.DEVNULL if quiet else sys.stderr,
                                  stderr=subprocess.DEVNULL if quiet else None).returncode
        except OSError as exc:
            raise ServerSetupError(f"cannot run pip to install {requirement}: {exc}") from None
        if code != 0:
            reason = ""
            with contextlib.suppress(OSError):
                reason = _pip_reason(Path(log).read_text(errors="replace"))
            reason = reason or ("see pip's output above" if not quiet else "pip gave no reason")
            raise ServerSetupError(f"installing {requirement} into {into} failed (pip exit {code}): {reason}")
    finally:
        with contextlib.suppress(OSError):
            os.unlink(log)


def _pip_reason(log: str) -> str:
    """Why pip failed, from its log: the last line naming an OS error (`[Errno 28] No space left on
    device`) or saying `ERROR: ...`, else its last line (a traceback's: `ERROR: Exception:` says
    nothing itself); '' for an empty log."""
    lines = [_PIP_STAMP.sub("", line).strip() for line in log.splitlines()]
    for line in reversed(lines):
        found = _PIP_ERRNO.search(line)
        if found:
            return found.group(0).strip()
        found = _PIP_ERROR.match(line)
        if found and found.group(1) != "Exception:":
            return found.group(1)
    return next((line for line in reversed(lines) if line), "")


def _install_model_numpy(install: TritonInstall, quiet: bool) -> None:
    target = install.model_pythonpath
    with _locked(install.root):
        if (target / "numpy").is_dir():
            return
        version = install.python_version.replace(".", "")
        extra = ["--only-binary=:all:", "--implementation", "cp", "--python-version", version,
                 "--platform", "manylinux2014_x86_64"]
        if not quiet:
            print(f"tuner: installing {MODEL_NUMPY} for the Python backend (Python {install.python_version}) "
                  f"into {target}", file=sys.stderr)
        with _staging(install.root) as staging:
            _pip_target(staging, MODEL_NUMPY, extra, into=target, quiet=quiet)
            _replace(target, staging)


def _prepare(root: Path) -> TritonInstall:
    """Exec bits, and a backend directory holding the Python backend with the stub for this machine."""
    server = root / "pytriton" / "tritonserver"
    binary = _binary(root)
    lib_dir = root / "nvidia_pytriton.libs"
    python_backend = server / "backends" / "python"
    for needed in (binary, lib_dir, python_backend / "libtriton_python.so"):
        if not needed.exists():
            raise ServerSetupError(f"{root}: incomplete Triton install ({needed.relative_to(root)} missing); "
                                   "remove the directory to reinstall")
    _make_executable(binary)
    version = choose_stub_python(server / "python_backend_stubs")
    stub = server / "python_backend_stubs" / version / "triton_python_backend_stub"
    _make_executable(stub)
    # Same depth below root as the stubs, so the binaries' $ORIGIN/../../../../nvidia_pytriton.libs rpath holds.
    backends = server / f"tuner_backends_py{version}"
    target = backends / "python"
    try:
        target.mkdir(parents=True, exist_ok=True)
        for src in (python_backend / "libtriton_python.so", python_backend / "triton_python_backend_utils.py", stub):
            link = target / src.name
            if not link.exists():
                with contextlib.suppress(FileExistsError):
                    link.symlink_to(os.path.relpath(src, target))
    except OSError as exc:
        raise ServerSetupError(f"cannot lay out the Python backend in {backends}: {exc}") from None
    return TritonInstall(root=root, binary=binary, lib_dir=lib_dir, backends_dir=backends, python_version=version,
                         model_pythonpath=root / f"model-python{version}")


def choose_stub_python(stubs_dir: Path) -> str:
    """The Python version whose stub can run here: its libpython3.X.so must be on the system."""
    available = sorted((p.name for p in stubs_dir.iterdir() if (p / "triton_python_backend_stub").is_file()),
                       key=lambda v: tuple(int(x) for x in v.split(".")), reverse=True)
    current = f"{sys.version_info.major}.{sys.version_info.minor}"
    ordered = ([current] if current in available else []) + [v for v in available if v != current]
    for version in ordered:
        if system_libpython(version):
            return version
    raise ServerSetupError(
        f"no system libpython for the Triton Python backend: need libpython3.X.so.1.0 for one of "
        f"{', '.join(available)} (e.g. `apt-get install libpython{current}`)")


def system_libpython(version: str) -> Path | None:
    """The system's libpython of `version` in the loader's usual directories (None when absent)."""
    name = f"libpython{version}.so.1.0"
    for d in _LIB_DIRS:
        if (Path(d) / name).exists():
            return Path(d) / name
    return None


def _make_executable(path: Path) -> None:
    mode = path.stat().st_mode
    if not mode & stat.S_IXUSR:
        path.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """Hold the lock of the install in `root` (a file in it: two installs into one directory take turns,
    and nothing is written beside it), then remove the staging directories a killed run left: an
    install stages only while it holds the lock, so every one there now is stale."""
    with open(root / LOCK, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            _sweep(root)
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _sweep(root: Path) -> None:
    for entry in root.iterdir():
        if _is_staging(entry.name) and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
    _sweep_beside(root)


def _sweep_beside(root: Path) -> None:
    """Earlier versions staged the wheel beside root (`.<root>.XXXXXXXX`, tempfile's suffix) under a lock
    file there (`.<root>.lock`): theirs are removed, under that lock when another holds it not."""
    old_lock = root.parent / f".{root.name}.lock"
    pattern = re.compile(re.escape(f".{root.name}.") + "[a-z0-9_]{8}")
    with contextlib.suppress(OSError), open(old_lock) as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # an earlier version is installing there now
            return
        for entry in root.parent.iterdir():
            if pattern.fullmatch(entry.name) and entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
        old_lock.unlink()
