"""Start load-generator processes by forking them from a process that has already imported Locust (the
fork server, `python -m tuner.replay --serve`, see `_serve`). Parent side, unpatched.

Importing Locust and the load generator takes about a second of CPU, several on a busy machine, and
every replay paid it again: each capacity step, warm-up and confirmation. A forked child starts in
milliseconds. One fork server per tuner process (and per environment it was started with): started at
the first replay, ended by `shutdown` (at exit) or when this process's end of its socket closes (this
process ended or died), when it kills the children it has left. Where the fork server cannot start or
has died, `start` runs the process itself, as every replay did before.

What `_processes` needs of a process is `subprocess.Popen`'s: pid, stdout, poll, wait, kill,
returncode. `Forked` offers the same for a child of the fork server, whose exit status the server
reports (it is the child's parent, the only one that can wait for it).
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from typing import IO

__all__ = ["Forked", "shutdown", "start"]

# -P: the working directory is not put first on sys.path, where a folder named tuner (another checkout,
# say) would be imported instead of the tuner that started the process (the PYTHONPATH it is given)
LOAD_GENERATOR = (sys.executable, "-P", "-m", "tuner.replay")
READY_TIMEOUT_S = 60.0  # Locust's import on a starved machine
REPLY_TIMEOUT_S = 30.0


class _Server:
    """One fork server and the thread that reads what it says."""

    def __init__(self, env: dict[str, str]):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [*LOAD_GENERATOR, "--serve", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        finally:
            theirs.close()
        self.sock, self.env, self.owner = ours, env, os.getpid()
        self.replies: queue.Queue = queue.Queue()
        self.ended: dict[int, int] = {}  # pid -> exit code, as Popen.returncode says it
        self.changed = threading.Condition()
        self.alive = True
        self.lock = threading.Lock()  # one request and its reply at a time
        threading.Thread(target=self._read, name="tuner-forkserver", daemon=True).start()
        try:
            ready = self.replies.get(timeout=READY_TIMEOUT_S)
        except queue.Empty:
            ready = None
        if ready != "READY":
            self.close()
            raise OSError("the load generator's fork server did not start")

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(256)
            except OSError:
                data = b""
            if not data:
                with self.changed:
                    self.alive = False
                    self.changed.notify_all()
                self.replies.put(None)
                return
            kind, *rest = data.decode().split()
            if kind == "EXIT":
                with self.changed:
                    self.ended[int(rest[0])] = os.waitstatus_to_exitcode(int(rest[1]))
                    self.changed.notify_all()
            else:
                self.replies.put(kind if kind == "READY" else int(rest[0]))

    def fork(self, argv: list[str], *, stdout: int, stderr: int) -> int:
        with self.lock:
            # the child takes Ctrl-C as a process this one started would: ignored where this one ignores it
            # (a background job, nohup), else raising (a terminal's Ctrl-C reaches the whole group)
            ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
            request = {"argv": argv, "sigint": "ignore" if ignored else "default"}
            socket.send_fds(self.sock, [json.dumps(request).encode()], [stdout, stderr])
            try:
                pid = self.replies.get(timeout=REPLY_TIMEOUT_S)
            except queue.Empty:
                pid = None
        if pid is None:
            self.close()  # a reply late or lost: this server's replies can no longer be matched
            raise OSError("the load generator's fork server ended")
        return pid

    def close(self) -> None:
        try:
            self.sock.close()  # the server sees its parent gone, kills its children and ends
        finally:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Forked:
    """A load-generator process forked by the fork server, with the part of Popen's interface that
    `_processes` uses."""

    def __init__(self, server: _Server, pid: int, stdout: IO[str]):
        self._server, self.pid, self.stdout = server, pid, stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            with self._server.changed:
                self._settle()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self._server.changed:
            if not self._server.changed.wait_for(lambda: self._settle() is not None, timeout):
                raise subprocess.TimeoutExpired(f"load generator {self.pid}", timeout)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _settle(self) -> int | None:
        """The exit code once known (called holding the server's condition)."""
        if self.returncode is None:
            if self.pid in self._server.ended:
                self.returncode = self._server.ended.pop(self.pid)
            elif not self._server.alive:
                self.returncode = -signal.SIGKILL  # the server ended: its children were killed with it
        return self.returncode


_servers_lock = threading.Lock()
_server: _Server | None = None


def start(argv: list[str], *, stderr: IO, env: dict[str, str]) -> Forked | subprocess.Popen:
    """`python -m tuner.replay ARGV` with its stdout a text pipe to this process and its stderr `stderr`:
    forked by the fork server for `env`, or run directly where there is none."""
    server = _for(env)
    if server is not None:
        read, write = os.pipe()
        try:
            pid = server.fork(argv, stdout=write, stderr=stderr.fileno())
        except OSError:
            os.close(read)
        else:
            return Forked(server, pid, os.fdopen(read, "r"))
        finally:
            os.close(write)
    return subprocess.Popen([*LOAD_GENERATOR, *argv], stdout=subprocess.PIPE,
                            stderr=stderr, text=True, env=env)


def _for(env: dict[str, str]) -> _Server | None:
    """The running fork server for `env`, started if needed; None where it cannot start."""
    global _server
    with _servers_lock:
        # its process is asked too: the reader thread may not have seen the socket close yet (a busy host)
        if _server is not None and (not _server.alive or _server.proc.poll() is not None or _server.env != env
                                    or _server.owner != os.getpid()):
            old, _server = _server, None
            if old.owner == os.getpid():
                old.close()
            else:  # inherited through a fork of this process: the parent's to end
                old.sock.close()
        if _server is None:
            try:
                _server = _Server(env)
            except OSError:
                return None
        return _server


def shutdown() -> None:
    """End this process's fork server (and the children it has left), if it runs one."""
    global _server
    with _servers_lock:
        old, _server = _server, None
    if old is not None and old.owner == os.getpid():
        old.close()


def _at_exit() -> None:
    """`shutdown` as the process exits: a Ctrl-C pressed again while the server ends (a user pressing it
    twice) ends it at once, where it was a traceback from the atexit callback."""
    server = _server
    try:
        shutdown()
    except KeyboardInterrupt:
        if server is not None and server.owner == os.getpid():
            server.proc.kill()
            server.proc.wait()


atexit.register(_at_exit)
