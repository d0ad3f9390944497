"""This machine's small shared facts: free loopback ports, whether a process lives, temporary
directories that record their owner, so that a later run can remove those of an owner killed without
cleaning up (kill -9 skips every `finally`), and the GPU type a measurement ran on. Used by the
launchers, the replay and the search."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tuner.errors import ServerSetupError

__all__ = ["GPU_TYPE_ENV", "OWNER_FILE", "add_owner", "check_port_free", "free_ports", "gpu_type", "owned_temporary_dir",
           "owned_tempdir", "pid_alive", "sweep_owned"]

OWNER_FILE = "owner.pid"
GPU_TYPE_ENV = "TUNER_GPU_TYPE"  # says the GPU type where nvidia-smi cannot (a remote server, a MIG slice)


def free_ports(n: int) -> tuple[int, ...]:
    """`n` distinct free TCP ports on 127.0.0.1 (held open together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return tuple(s.getsockname()[1] for s in socks)
    finally:
        for s in socks:
            s.close()


def check_port_free(port: int) -> None:
    """ServerSetupError when `port` on 127.0.0.1 is taken: something listens on it. A connection to a
    stopped server that lingers in TIME_WAIT (for a minute after a scraper's or client's last request)
    does not count: tritonserver binds such a port (SO_REUSEADDR), and so does this check."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise ServerSetupError(f"port {port} on 127.0.0.1 is already in use ({exc.strerror})") from None


def pid_alive(pid: object) -> bool:
    """Whether a process with this id runs on this machine (False for anything not a pid)."""
    try:
        pid = int(str(pid))
    except ValueError:
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's: alive
        return True
    return True


def owned_tempdir(prefix: str) -> Path:
    """A new directory in the system temp dir that records this process as its owner; directories
    of the same prefix whose owner is gone are removed first."""
    sweep_owned(prefix)
    path = Path(tempfile.mkdtemp(prefix=prefix))
    (path / OWNER_FILE).write_text(str(os.getpid()))
    return path


@contextlib.contextmanager
def owned_temporary_dir(prefix: str) -> Iterator[Path]:
    """`owned_tempdir` for the length of a block, removed after it."""
    path = owned_tempdir(prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def add_owner(path: Path, pid: int) -> None:
    """Record another process that uses `path` (a server started in it): the directory stays while any
    of its owners runs. A server whose owner was killed shuts down by itself, reading its files until it
    ends; swept from under it, Triton hung in its shutdown for good."""
    with open(path / OWNER_FILE, "a") as fh:
        fh.write(f"\n{pid}")


def sweep_owned(prefix: str, directory: str | Path | None = None) -> list[Path]:
    """Remove the `prefix*` directories (in the system temp dir, or `directory`) whose recorded owner
    processes are all gone; returns them. A directory without an owner file (being made, or not ours)
    is left alone."""
    removed = []
    for path in Path(directory or tempfile.gettempdir()).glob(f"{prefix}*"):
        try:
            owners = (path / OWNER_FILE).read_text().split()
        except OSError:
            continue
        if not any(pid_alive(owner) for owner in owners):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


@functools.cache
def gpu_type() -> str:
    """This host's GPU type: `nvidia-smi --query-gpu=name` (distinct names joined by ", "), "cpu" where
    there is no NVIDIA GPU; $TUNER_GPU_TYPE, when set, says it instead."""
    told = os.environ.get(GPU_TYPE_ENV, "").strip()
    if told:
        return told
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):  # no driver, no GPU, a hung driver: measured on the CPU
        return "cpu"
    names = list(dict.fromkeys(line.strip() for line in out.splitlines() if line.strip()))
    return ", ".join(names) or "cpu"
