"""The fork server (`tuner.replay._forkserver`, `_serve`): load generators forked from one process that
has imported Locust, their exit codes and output as a process of their own gave them, nothing left
running when it ends or dies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tuner.localhost import free_ports
from tuner.replay import _forkserver

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def env():
    yield dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    _forkserver.shutdown()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_load_generator_is_forked_by_the_server_and_says_its_exit_code_and_error(env, tmp_path):
    log = open(tmp_path / "err.log", "w+")
    child = _forkserver.start([str(tmp_path / "missing.json"), "--role", "local"], stderr=log, env=env)
    assert isinstance(child, _forkserver.Forked)
    server = _forkserver._server
    assert child.stdout.read() == ""  # its stdout closes when it ends
    assert child.wait(timeout=30) == 1 and child.poll() == 1
    log.seek(0)
    assert "missing.json" in log.read()  # its stderr is the caller's file
    # the next one comes from the same server
    again = _forkserver.start([str(tmp_path / "missing.json"), "--role", "local"], stderr=log, env=env)
    assert _forkserver._server is server and again.wait(timeout=30) == 1


def test_shutdown_ends_the_server_and_the_children_it_has_left(env, tmp_path):
    # a master that waits for a worker that never comes
    spec = {"workers": 1, "master_port": free_ports(1)[0], "connect_timeout_s": 600,
            "summary": str(tmp_path / "summary-{name}.json")}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    log = open(tmp_path / "err.log", "w+")
    child = _forkserver.start([str(tmp_path / "spec.json"), "--role", "master"], stderr=log, env=env)
    server = _forkserver._server.proc.pid
    time.sleep(1.0)
    assert child.poll() is None, open(tmp_path / "err.log").read()
    assert psutil.Process(child.pid).ppid() == server  # forked by the server
    _forkserver.shutdown()
    deadline = time.monotonic() + 10
    while (_alive(child.pid) or _alive(server)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child.pid) and not _alive(server)
    assert child.wait(timeout=5) != 0


@pytest.mark.parametrize("ignored", [True, False])
def test_a_forked_load_generator_takes_sigint_as_its_caller_does(env, tmp_path, ignored):
    # a caller that ignores Ctrl-C (a background job, nohup): its load generators go on through one, as
    # processes it started itself would (they were ended by it: the replay failed, "exited with 1")
    spec = {"workers": 1, "master_port": free_ports(1)[0], "connect_timeout_s": 600,
            "summary": str(tmp_path / "summary-{name}.json")}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    log = open(tmp_path / "err.log", "w+")
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN if ignored else signal.default_int_handler)
    try:
        child = _forkserver.start([str(tmp_path / "spec.json"), "--role", "master"], stderr=log, env=env)
    finally:
        signal.signal(signal.SIGINT, previous)
    time.sleep(1.0)
    assert child.poll() is None, open(tmp_path / "err.log").read()
    os.kill(child.pid, signal.SIGINT)
    if ignored:
        time.sleep(2.0)
        assert child.poll() is None, open(tmp_path / "err.log").read()
        child.kill()
    else:
        assert child.wait(timeout=30) != 0


def test_a_dead_server_is_replaced_and_a_caller_that_dies_takes_its_server_along(env, tmp_path):
    log = open(tmp_path / "err.log", "w+")
    _forkserver.start([str(tmp_path / "missing.json")], stderr=log, env=env).wait(timeout=30)
    first = _forkserver._server.proc.pid
    os.kill(first, signal.SIGKILL)
    _forkserver._server.proc.wait()
    child = _forkserver.start([str(tmp_path / "missing.json")], stderr=log, env=env)
    assert child.wait(timeout=30) == 1 and _forkserver._server.proc.pid != first

    # a caller killed outright: its end of the socket closes, and its fork server ends by itself
    caller = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from tuner.replay import _forkserver\n"
        f"_forkserver.start([{str(tmp_path / 'missing.json')!r}], stderr=sys.stderr, env={env!r})\n"
        "print(_forkserver._server.proc.pid, flush=True)\n"
        "time.sleep(60)\n")], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        server = int(caller.stdout.readline())
        assert _alive(server)
    finally:
        caller.kill()
        caller.wait()
    deadline = time.monotonic() + 10
    while _alive(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(server)


def test_where_the_server_does_not_start_in_time_the_process_is_run_directly(env, tmp_path, monkeypatch):
    monkeypatch.setattr(_forkserver, "READY_TIMEOUT_S", 0.0)  # it never says READY in no time
    log = open(tmp_path / "err.log", "w+")
    child = _forkserver.start([str(tmp_path / "missing.json"), "--role", "local"], stderr=log, env=env)
    assert isinstance(child, subprocess.Popen) and _forkserver._server is None
    assert child.wait(timeout=60) == 1
    log.seek(0)
    assert "missing.json" in log.read()
    # the server that was too slow is ended, not left behind
    assert not [p for p in psutil.Process().children(recursive=True)
                if "--serve" in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize("forked", [True, False])
def test_a_folder_named_tuner_in_the_working_directory_is_not_what_the_load_generator_runs(
        env, tmp_path, monkeypatch, forked):
    # `python -m` put the working directory first on sys.path: run from inside another checkout, the load
    # generator imported its tuner, not the one that started it
    shadow = tmp_path / "elsewhere"
    (shadow / "tuner").mkdir(parents=True)
    (shadow / "tuner" / "__init__.py").write_text("raise SystemExit(7)\n")
    monkeypatch.chdir(shadow)
    if not forked:
        monkeypatch.setattr(_forkserver, "READY_TIMEOUT_S", 0.0)
    log = open(tmp_path / "err.log", "w+")
    child = _forkserver.start([str(tmp_path / "missing.json"), "--role", "local"], stderr=log, env=env)
    assert isinstance(child, _forkserver.Forked) == forked
    assert child.wait(timeout=60) == 1  # this tuner's load generator, refusing the missing file; not 7
    log.seek(0)
    assert "missing.json" in log.read()


def test_a_ctrl_c_while_the_server_ends_at_exit_ends_it_without_a_traceback(env, tmp_path, monkeypatch):
    # a second Ctrl-C during the atexit shutdown's wait printed "Exception ignored in atexit callback" and
    # a KeyboardInterrupt traceback
    log = open(tmp_path / "err.log", "w+")
    child = _forkserver.start([str(tmp_path / "missing.json"), "--role", "local"], stderr=log, env=env)
    assert child.wait(timeout=30) == 1
    server = _forkserver._server
    waited = server.proc.wait
    calls = []

    def interrupted(timeout=None):
        calls.append(timeout)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return waited(timeout=timeout)

    monkeypatch.setattr(server.proc, "wait", interrupted)
    _forkserver._at_exit()  # raises nothing
    assert server.proc.poll() is not None and _forkserver._server is None
