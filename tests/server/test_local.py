"""LocalLauncher: the launcher contract, plus what only a process of our own can show."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from tuner.errors import ConfigError, ServerError, ServerSetupError
from tuner.localhost import sweep_owned
from tuner.server.install import system_libpython
from tuner.server.local import WORKDIR_PREFIX, LocalLauncher

from .contract import LauncherContract, infer, template, with_batching

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def launcher(triton_install, templates_dir):
    with LocalLauncher(templates_dir, models=["encoder_sim", "matmul_cpu"], install=triton_install) as server:
        yield server


class TestLocalContract(LauncherContract):
    def test_refusal_quotes_the_server_log(self, launcher):
        bad = with_batching(template("matmul_cpu"), 8, 0)
        bad.dynamic_batching.preferred_batch_size.append(64)
        with pytest.raises(ServerSetupError, match="preferred size must be <= max batch size"):
            launcher.apply_config("matmul_cpu", bad)
        launcher.apply_config("matmul_cpu", template("matmul_cpu"))

    def test_logs_tail(self, launcher):
        text = launcher.logs(5)
        assert 0 < len(text.splitlines()) <= 5


def _tree_hash(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def test_killed_server_fails_fast_and_user_files_stay_unchanged(triton_install, templates_dir):
    before = _tree_hash(templates_dir)
    server = LocalLauncher(templates_dir, models=["matmul_cpu"], install=triton_install)
    with server:
        workdir = server.repository.parent
        server.apply_config("matmul_cpu", with_batching(template("matmul_cpu"), 4, 500))
        assert not server.exited()
        os.kill(server.pid, signal.SIGKILL)
        time.sleep(0.2)
        assert not server.is_alive() and server.exited()
        for call in (lambda: server.statistics("matmul_cpu"), server.metrics,
                     lambda: server.apply_config("matmul_cpu", template("matmul_cpu"))):
            started = time.monotonic()
            with pytest.raises(ServerError, match="exited with code -9") as caught:
                call()
            assert time.monotonic() - started < 1.0
            assert "\n" not in str(caught.value) and "; its log: " in str(caught.value)  # one line, not a dump
            # killed without a word: no reason quoted (this CPU host's start-up CUDA line was, as if it were one)
            assert "exited with code -9; its log: " in str(caught.value), caught.value
    assert not workdir.exists()
    assert not server.exited()  # stopped: no server of its own to have exited
    server.stop()  # idempotent
    assert _tree_hash(templates_dir) == before


def test_a_launcher_never_started_has_not_exited(templates_dir):
    assert LocalLauncher(templates_dir, models=["encoder_sim"]).exited() is False


def test_stop_ends_the_process_group(triton_install, templates_dir):
    server = LocalLauncher(templates_dir, models=["encoder_sim"], install=triton_install)
    server.start()
    server.wait_ready()
    pgid = server.pid
    server.stop()
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
    assert not server.is_alive()


def test_ctrl_c_in_its_block_says_the_server_is_being_stopped_then_stops_it(triton_install, templates_dir, capsys):
    # Triton's own shutdown takes seconds after Ctrl-C: said at once, not a silent wait
    with pytest.raises(KeyboardInterrupt):
        with LocalLauncher(templates_dir, models=["encoder_sim"], install=triton_install) as server:
            pgid = server.pid
            capsys.readouterr()
            raise KeyboardInterrupt
    assert capsys.readouterr().err == "tuner: interrupted: stopping the server ...\n"
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
    with LocalLauncher(templates_dir, models=["encoder_sim"], install=triton_install):
        pass  # an ordinary end says nothing
    assert "interrupted" not in capsys.readouterr().err


def _group_members(pgid: int) -> list[str]:
    """The live (not zombie) processes of a process group, by name."""
    members = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if _pgid(p) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                members.append(p.name())
    return members


def test_a_server_that_dies_leaves_no_stub_holding_its_port(triton_install, templates_dir):
    """A Python model loaded once the server is up forks its stub with the server's listening socket open:
    after a kill -9 the stub would take new connections and answer none (a replayed request waited out its
    timeout) until it noticed. The launcher ends the dead server's process group at once, whatever it was
    doing (session 44 did so only during a load)."""
    with LocalLauncher(templates_dir, models=["encoder_sim"], install=triton_install) as server:
        server.apply_config("encoder_sim", with_batching(template("encoder_sim"), 4, 0))  # a stub forked now
        pgid, port = server.pid, int(server.endpoints.http.rsplit(":", 1)[1])
        assert len(_group_members(pgid)) > 1  # the server and its stubs
        os.kill(pgid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _group_members(pgid)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()


def _pgid(p: psutil.Process) -> int | None:
    try:
        return os.getpgid(p.pid)
    except (ProcessLookupError, PermissionError):
        return None


def test_port_in_use_is_a_setup_error(triton_install, templates_dir):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        server = LocalLauncher(templates_dir, models=["matmul_cpu"], install=triton_install,
                               ports=(port, port + 1, port + 2))
        with pytest.raises(ServerSetupError, match=f"port {port} on 127.0.0.1 is already in use"):
            server.start()
        assert server.pid is None


def test_missing_model_is_a_setup_error(triton_install, templates_dir):
    with pytest.raises(ServerSetupError, match="no model named 'nope'.*encoder_sim"):
        LocalLauncher(templates_dir, models=["nope"], install=triton_install).start()


def test_missing_repository_is_a_setup_error(triton_install, tmp_path):
    with pytest.raises(ServerSetupError, match="model repository not found"):
        LocalLauncher(tmp_path / "absent", install=triton_install).start()


def test_broken_model_at_startup_quotes_exit_code_and_log(triton_install, tmp_path):
    model = tmp_path / "repo" / "broken"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text('name: "broken"\nbackend: "no_such_backend"\nmax_batch_size: 4\n')
    server = LocalLauncher(tmp_path / "repo", install=triton_install, startup_timeout_s=60)
    with pytest.raises(ServerSetupError, match=r"exited with code \d+ during startup(.|\n)*no_such_backend") as caught:
        with server:
            pass
    assert server.pid is None
    # Triton's own reason on the first line, not its closing "failed to load all models"
    assert "no_such_backend" in str(caught.value).splitlines()[0], str(caught.value)
    # ... and the only line: the whole log (Triton's option table, its shutdown) stays in the file it names,
    # a copy in the temp dir where the log was in the private copy the stop removed
    message = str(caught.value)
    assert "\n" not in message and re.search(r"; its log: (\S+)$", message), message
    kept = Path(re.search(r"; its log: (\S+)$", message).group(1))
    try:
        assert kept.parent == Path(tempfile.gettempdir()) and "no_such_backend" in kept.read_text()
        assert "model_repository_path" in kept.read_text()  # the option table, not in the message
    finally:
        kept.unlink()
    log = tmp_path / "server" / "tritonserver.log"  # a log asked for: named as it is
    with pytest.raises(ServerSetupError, match=rf"no_such_backend.*; its log: {re.escape(str(log))}$"):
        with LocalLauncher(tmp_path / "repo", install=triton_install, startup_timeout_s=60, log_path=log):
            pass
    assert "model_repository_path" in log.read_text()


@pytest.mark.parametrize("case, message", [
    ("name", "name 'other' is not its directory's ('mine'): Triton loads a model only from a directory of its name"),
    ("version", "no version directory (a numbered subdirectory such as 1/ holding the model's files)"),
])
def test_what_triton_would_refuse_at_its_start_is_one_line_before_it_starts(triton_install, tmp_path, case,
                                                                             message):
    model = tmp_path / "repo" / "mine"
    (model / ("1" if case == "name" else "v1")).mkdir(parents=True)
    (model / "config.pbtxt").write_text(f'name: "{"other" if case == "name" else "mine"}"\nbackend: "python"\n')
    server = LocalLauncher(tmp_path / "repo", install=triton_install)
    with pytest.raises(ConfigError) as caught:
        server.start()
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert server.pid is None


def test_inference_through_the_private_copy(local_server, templates_dir):
    out = infer(local_server.endpoints.http, "matmul_cpu", "INPUT", np.ones((2, 256), np.float32))
    assert out["outputs"][0]["shape"] == [2, 256]
    assert local_server.repository != templates_dir
    assert (local_server.repository / "encoder_sim" / "config.pbtxt").is_file()


_OWNER_SCRIPT = """
import sys, time
from tuner.server.local import LocalLauncher
from tuner.server.install import find_tritonserver
server = LocalLauncher(sys.argv[1], models=["matmul_cpu"], install=find_tritonserver(sys.argv[2]))
server.start()
server.wait_ready()
print(server.pid, flush=True)
time.sleep(120)
"""


def _gone(pgid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_no_orphan_when_the_owner_is_interrupted_or_killed(sig, triton_install, templates_dir):
    """Ctrl-C (KeyboardInterrupt, atexit) and a kill -9 of the owner (parent-death signal) both end the server."""
    import subprocess
    import sys

    owner = subprocess.Popen([sys.executable, "-c", _OWNER_SCRIPT, str(templates_dir), str(triton_install.root)],
                             stdout=subprocess.PIPE, text=True)
    try:
        pid = int(owner.stdout.readline())
        os.killpg(pid, 0)  # running
        workdirs = [p for p in Path(tempfile.gettempdir()).glob("tuner-triton-*")
                    if (p / "owner.pid").is_file() and (p / "owner.pid").read_text().split()[0] == str(owner.pid)]
        assert len(workdirs) == 1, workdirs
        # the server is an owner too: a sweep while it shuts down after its owner's death leaves its files
        assert (workdirs[0] / "owner.pid").read_text().split() == [str(owner.pid), str(pid)]
        owner.send_signal(sig)
        owner.wait(timeout=30)
        assert _gone(pid, within_s=20), f"tritonserver group {pid} outlived its owner ({sig.name})"
        if sig == signal.SIGKILL:  # no atexit: the next start removes the dead owner's private copy
            sweep_owned(WORKDIR_PREFIX)  # (another launcher starting on this machine may have done it)
        assert not workdirs[0].exists(), sorted(p.name for p in workdirs[0].rglob("*"))
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


def test_a_port_taken_after_it_was_chosen_is_retried(triton_install, templates_dir, monkeypatch):
    import tuner.server.local as local

    real = local.free_ports
    calls = []
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()

        def racy(count):
            ports = list(real(count))
            if not calls:  # the first choice loses the race for its HTTP port
                ports[0] = busy.getsockname()[1]
            calls.append(ports)
            return ports

        monkeypatch.setattr(local, "free_ports", racy)
        with LocalLauncher(templates_dir, models=["matmul_cpu"], install=triton_install) as server:
            assert len(calls) == 2
            assert server.endpoints.http == f"127.0.0.1:{calls[1][0]}"
            assert server.is_alive()


def test_a_killed_servers_log_tail_is_only_what_it_wrote_for_the_current_config(triton_install, templates_dir,
                                                                                tmp_path):
    log = tmp_path / "tritonserver.log"
    server = LocalLauncher(templates_dir, models=["matmul_cpu"], install=triton_install, log_path=log)
    with server:
        server.apply_config("matmul_cpu", with_batching(template("matmul_cpu"), 4, 500))  # the previous trial
        before = log.read_bytes()
        server.apply_config("matmul_cpu", with_batching(template("matmul_cpu"), 8, 100))  # the current one
        os.kill(server.pid, signal.SIGKILL)
        time.sleep(0.2)
        since = log.read_bytes()[len(before):].decode(errors="replace").splitlines()
        quoted = server.logs(500)
    # only the current configuration's lines (or a line saying there are none): not the earlier trial's
    assert quoted == ("\n".join(since) if since else
                      "(the server wrote nothing to its log since this configuration was applied)")
    assert "successfully loaded" in before.decode()
    assert not any(line in quoted for line in before.decode().splitlines()[:3] if line.strip())


def test_a_killed_servers_shared_memory_is_removed_and_no_one_elses(triton_install, templates_dir):
    shm = Path("/dev/shm")
    other = shm / f"tunerother{os.getpid()}_{os.urandom(4).hex()}"  # a region this launcher did not start
    other.write_bytes(b"x")
    try:
        server = LocalLauncher(templates_dir, models=["matmul_cpu"], install=triton_install)
        with server:
            stub = [p for p in psutil.Process(server.pid).children(recursive=True)
                    if "triton_python_backend_stub" in " ".join(p.cmdline())]
            ours = {arg for p in stub for arg in p.cmdline() if "/" not in arg and (shm / arg).is_file()}
            assert ours  # the stub is handed its region's name
            os.kill(server.pid, signal.SIGKILL)
            time.sleep(0.5)
            assert all((shm / name).exists() for name in ours)  # the killed server could not remove them
        assert not any((shm / name).exists() for name in ours)
        assert other.exists()
    finally:
        other.unlink(missing_ok=True)


_PROBE_MODEL = '''
import json, os, sys
sys.path[:0] = [p for p in os.environ.get("TUNER_MODEL_PYTHONPATH", "").split(os.pathsep) if p]  # numpy, for the stub
import _ssl  # a C module of the standard library: another build's fails to load in the stub


class TritonPythonModel:
    def initialize(self, args):
        with open(os.environ["PROBE_OUT"], "w") as out:
            json.dump({"prefix": sys.prefix, "os": os.__file__, "ssl": _ssl.__file__}, out)

    def execute(self, requests):
        return []
'''


def test_the_stub_runs_the_system_pythons_standard_library_whatever_python3_is_first_on_path(
        triton_install, tmp_path, monkeypatch):
    # CI: with a virtual environment's python3 first on PATH, the stub took pyenv 3.11.7's C modules, and
    # `_ssl` failed on the system's 3.11.2 libpython
    model = tmp_path / "repo" / "probe"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text('backend: "python"\nmax_batch_size: 0\n'
                                        'input [{ name: "X" data_type: TYPE_FP32 dims: [1] }]\n'
                                        'output [{ name: "Y" data_type: TYPE_FP32 dims: [1] }]\n')
    (model / "1" / "model.py").write_text(_PROBE_MODEL)
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    monkeypatch.setenv("PROBE_OUT", str(tmp_path / "probe.json"))
    with LocalLauncher(tmp_path / "repo", models=["probe"], install=triton_install, startup_timeout_s=60):
        pass
    stub = json.loads((tmp_path / "probe.json").read_text())
    library = system_libpython(triton_install.python_version).resolve()
    assert library.is_relative_to(stub["prefix"]), (library, stub)  # the libpython's own installation
    assert Path(stub["os"]).is_relative_to(stub["prefix"]) and Path(stub["ssl"]).is_relative_to(stub["prefix"])


def test_a_port_taken_by_another_server_after_it_was_drawn_is_not_mistaken_for_ours(
        triton_install, templates_dir, monkeypatch):
    # another process takes the HTTP port between free_ports and the bind, and answers there as a Triton
    # (as a second tritonserver started in the same second did in CI): ours fails its bind, and must not
    # be taken for ready because the port answers (nor because its log says "Started HTTPService": Triton
    # writes that line before the bind fails)
    import http.server
    import threading

    import tuner.server.local as local

    class Ready(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # ready, and GET /v2 names a Triton: another one's
            body = json.dumps({"name": "triton", "version": "2.51.0", "extensions": []}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ready)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    drawn = []
    real = local.free_ports

    def first_one_taken(n):
        ports = real(n)
        if not drawn:
            ports = (other.server_address[1], *ports[1:])
        drawn.append(ports)
        return ports

    monkeypatch.setattr(local, "free_ports", first_one_taken)
    try:
        with LocalLauncher(templates_dir, models=["encoder_sim"], install=triton_install) as server:
            assert len(drawn) == 2 and server.endpoints.http != f"127.0.0.1:{other.server_address[1]}"
            assert server.is_alive() and "encoder_sim" in server.model_config("encoder_sim").name
    finally:
        other.shutdown()


def test_a_slow_start_and_a_slow_load_say_how_long_they_have_waited(triton_install, tmp_path, monkeypatch, capsys):
    """slow_load's initialize sleeps load_s (3 s here): the start and each load print a line on stderr every
    PROGRESS_S (1 s here, 10 s in use) while they wait, as other progress lines; a block that ends sooner
    prints none."""
    import shutil

    import tuner.server.local as local
    from tuner import modelconfig

    repo = tmp_path / "repo"
    shutil.copytree(Path(__file__).resolve().parents[1] / "data" / "replay_models" / "slow_load", repo / "slow_load")
    path = repo / "slow_load" / "config.pbtxt"
    config = modelconfig.load(path)
    config.parameters["load_s"].string_value = "3"
    path.write_text(modelconfig.to_text(config))
    monkeypatch.setattr(local, "PROGRESS_S", 1.0)
    with LocalLauncher(repo, models=["slow_load"], install=triton_install) as server:
        started = capsys.readouterr().err
        config.max_batch_size = 4
        server.apply_config("slow_load", config)
        loaded = capsys.readouterr().err
        with local.saying("nothing slow"):
            pass
    assert re.search(r"^tuner: starting tritonserver and loading model slow_load: [1-9]\d* s$", started, re.M), started
    assert re.search(r"^tuner: loading model slow_load: 2 s$", loaded, re.M), loaded
    assert "nothing slow" not in capsys.readouterr().err
