"""The fork server's own side (`python -m tuner.replay --serve FD`): a process that has imported Locust
and the load generator once, and forks a load-generator process for each replay (see `_forkserver`).

It speaks over the Unix socket FD (SOCK_SEQPACKET: one message per request) with the tuner process
that started it:
  <- a JSON list of `main`'s arguments, with two descriptors (the child's stdout and stderr)
  -> `PID <pid>` once forked; `EXIT <pid> <wait status>` when that child has ended; `READY` at the start.
The parent closing its end (it ended, or died) ends the server, which kills the children it has left.

The server itself runs no greenlet: it uses the functions gevent's monkey-patching replaced (select,
fork, waitpid, close) as they were, so a child starts with an idle hub that `gevent.reinit` readies
(gevent's own `os.close` waits for the hub to run before it closes a descriptor: here it never would).
"""

from __future__ import annotations

# locust first, as in `_worker`: the children run Locust in the state this process imported it in.
from tuner.replay._worker import main  # isort: skip

import _socket
import json
import os
import signal
import socket
import sys
import traceback

import gevent
from gevent.monkey import get_original

_close = get_original("os", "close")

__all__ = ["serve"]

IDLE_EXIT_S = 600.0  # a server asked for nothing this long ends (its parent starts another when needed)
POLL_S = 1.0         # the idle clock's tick (an ended child wakes the server at once: SIGCHLD)


def serve(fd: int) -> int:
    fork, waitpid = get_original("os", ["fork", "waitpid"])
    select = get_original("select", "select")
    set_handler = get_original("signal", "signal")
    sock = _socket.socket(fileno=fd)
    set_handler(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the parent's to handle
    # a child's end wakes the select at once (its exit status is what the replay waits for)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    set_handler(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    children: set[int] = set()
    sock.send(b"READY")
    idle_s = 0.0
    while idle_s < IDLE_EXIT_S or children:
        readable = select([sock, wake_r], [], [], POLL_S)[0]
        if wake_r in readable:
            while _drain(wake_r):
                pass
        _reap(children, sock, waitpid)
        if sock not in readable:
            idle_s += 0.0 if readable else POLL_S
            continue
        idle_s = 0.0
        message, fds, _flags, _address = socket.recv_fds(sock, 1 << 16, 2)
        if not message:
            break  # the parent is gone
        pid = fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            set_handler(signal.SIGCHLD, signal.SIG_DFL)
            _close(wake_r)
            _close(wake_w)
            _child(sock, json.loads(message), fds)
        for descriptor in fds:
            _close(descriptor)
        children.add(pid)
        sock.send(f"PID {pid}".encode())
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return 0


def _drain(fd: int) -> bool:
    try:
        return bool(os.read(fd, 512))
    except BlockingIOError:
        return False


def _reap(children: set[int], sock, waitpid) -> None:
    while children:
        try:
            pid, status = waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        try:
            sock.send(f"EXIT {pid} {status}".encode())
        except OSError:
            return  # the parent is gone: the loop sees it next


def _child(sock, request: dict, fds: list[int]) -> None:
    """In the forked child: stdout and stderr are the replay's, then the load generator runs with the
    request's argv; never returns. SIGINT as the requester has it (`sigint`: ignore or default), as a
    process it started itself would inherit it."""
    rc = 1
    try:
        sock.close()
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for descriptor in fds:
            _close(descriptor)
        ignore = request.get("sigint") == "ignore"
        signal.signal(signal.SIGINT, signal.SIG_IGN if ignore else signal.default_int_handler)
        gevent.reinit()
        rc = main(request["argv"])
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(rc)
