"""RemoteLauncher: the launcher contract against a server someone else runs (here: a local one)."""

from __future__ import annotations

import pytest

from tuner.errors import ServerSetupError
from tuner.server.local import LocalLauncher
from tuner.server.remote import RemoteLauncher

from .contract import LauncherContract, template, with_batching

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def owner(triton_install, templates_dir):
    """The 'someone else's' server the remote launcher attaches to."""
    with LocalLauncher(templates_dir, models=["encoder_sim", "matmul_cpu"], install=triton_install) as server:
        yield server


def _remote(owner, models=("encoder_sim", "matmul_cpu")) -> RemoteLauncher:
    ep = owner.endpoints
    return RemoteLauncher(ep.http, grpc_url=ep.grpc, models=list(models), metrics_url=ep.metrics)


@pytest.fixture(scope="module")
def launcher(owner):
    with _remote(owner) as remote:
        yield remote


class TestRemoteContract(LauncherContract):
    def test_logs_are_empty(self, launcher):
        assert launcher.logs() == ""


def test_stop_restores_the_original_config_and_leaves_the_server_running(owner):
    original = owner.model_config("encoder_sim")
    remote = _remote(owner, ["encoder_sim"])
    with remote:
        remote.apply_config("encoder_sim", with_batching(template("encoder_sim"), 8, 3000))
        assert owner.model_config("encoder_sim").max_batch_size == 8
    restored = owner.model_config("encoder_sim")
    assert restored.max_batch_size == original.max_batch_size == 64
    assert restored.dynamic_batching == original.dynamic_batching
    assert owner.is_alive()


def test_unreachable_server_is_a_setup_error():
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ServerSetupError, match=f"cannot reach a Triton server at 127.0.0.1:{port}"):
        RemoteLauncher(f"127.0.0.1:{port}").start()


def test_model_not_loaded_is_a_setup_error(owner):
    with pytest.raises(ServerSetupError, match="model 'nope' is not loaded"):
        _remote(owner, ["nope"]).start()


@pytest.mark.parametrize("url,grpc_url,key,why", [
    ("localhost", None, "server.url", "no port"),
    ("127.0.0.1:abc", None, "server.url", "port 'abc' is not a number"),
    ("127.0.0.1:99999", None, "server.url", "port 99999 is out of range"),
    ("127.0.0.1:8000", "127.0.0.1:0", "server.grpc_url", "port 0 is out of range"),
])
def test_bad_url_is_a_setup_error(url, grpc_url, key, why):
    with pytest.raises(ServerSetupError, match=rf"^{key}: expected host:port .*\({why}\)$"):
        RemoteLauncher(url, grpc_url=grpc_url)


def test_the_endpoints_follow_the_http_port():
    ep = RemoteLauncher("http://127.0.0.1:8000/").endpoints
    assert (ep.http, ep.grpc, ep.metrics) == ("127.0.0.1:8000", "127.0.0.1:8001", "http://127.0.0.1:8002/metrics")
    assert RemoteLauncher("[::1]:8000", grpc_url="grpc://[::1]:9001").endpoints.grpc == "[::1]:9001"


def test_server_not_in_explicit_mode_is_refused(triton_install, templates_dir, tmp_path):
    # A server of someone else's that polls its repository (started by hand: LocalLauncher is always explicit).
    import os
    import shutil
    import signal
    import subprocess
    import time

    from tuner.localhost import free_ports
    from tuner.server.client import TritonHttp

    shutil.copytree(templates_dir / "matmul_cpu", tmp_path / "repo" / "matmul_cpu")
    http, grpc, metrics = free_ports(3)
    prefix = f"tunerpoll{os.getpid()}_{os.urandom(4).hex()}_"  # this server's own shared-memory regions
    env = dict(os.environ, LD_LIBRARY_PATH=str(triton_install.lib_dir),
               TUNER_MODEL_PYTHONPATH=str(triton_install.model_pythonpath))
    cmd = [str(triton_install.binary), "--model-repository", str(tmp_path / "repo"),
           "--backend-directory", str(triton_install.backends_dir), "--model-control-mode=poll",
           "--repository-poll-secs=3600", "--http-address=127.0.0.1", f"--http-port={http}",
           "--grpc-address=127.0.0.1", f"--grpc-port={grpc}", "--metrics-address=127.0.0.1",
           f"--metrics-port={metrics}", f"--backend-config=python,shm-region-prefix-name={prefix}"]
    with open(tmp_path / "log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        client = TritonHttp(f"127.0.0.1:{http}")
        deadline = time.monotonic() + 60
        while not client.ok("v2/health/ready") and time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "log").read_text()[-2000:]
            time.sleep(0.2)
        with pytest.raises(ServerSetupError, match="explicit model-control mode"):
            RemoteLauncher(f"127.0.0.1:{http}", models=["matmul_cpu"]).start()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for name in os.listdir("/dev/shm"):  # a killed server leaves its regions: remove ours, by prefix
            if name.startswith(prefix):
                os.unlink(os.path.join("/dev/shm", name))
