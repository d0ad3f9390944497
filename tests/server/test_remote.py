"""RemoteLauncher: the launcher contract against a server someone else runs (here: a local one)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
from support import write_tune_study

from tuner.cli import main
from tuner.errors import InputError, OutputError, ServerError, ServerSetupError
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


def test_a_grpc_replays_endpoint_that_does_not_answer_is_a_setup_error(owner):
    from tuner.localhost import free_ports

    (port,) = free_ports(1)  # nothing listens there: a wrong server.grpc_url (or the HTTP port + 1 guessed wrong)
    wrong = RemoteLauncher(owner.endpoints.http, grpc_url=f"grpc://127.0.0.1:{port}", models=["encoder_sim"],
                           check_grpc=True)
    with pytest.raises(ServerSetupError, match=rf"no gRPC endpoint answers at 127.0.0.1:{port} .*replay.protocol grpc"):
        wrong.start()
    # the same with the replay by HTTP: gRPC is not needed, not checked
    with RemoteLauncher(owner.endpoints.http, grpc_url=f"grpc://127.0.0.1:{port}", models=["encoder_sim"]):
        pass
    with RemoteLauncher(owner.endpoints.http, grpc_url=owner.endpoints.grpc, models=["encoder_sim"], check_grpc=True):
        pass


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


@contextmanager
def someone_elses_server(triton_install, templates_dir, folder: Path, *, models: Sequence[str], mode: str,
                         load: Sequence[str] = (), extra: Sequence[str] = ()) -> Iterator[tuple[str, subprocess.Popen]]:
    """A tritonserver started by hand, as its owner would (LocalLauncher always runs explicit model control
    and loads its models): serving a copy of the templates' `models` in `--model-control-mode` `mode`,
    `load` the models an explicit one loads at its start (one in mode none loads them all). Yields its HTTP host:port and its process,
    killed at the end."""
    from tuner.localhost import free_ports
    from tuner.server.client import TritonHttp

    for model in models:
        shutil.copytree(templates_dir / model, folder / "repo" / model)
    http, grpc, metrics = free_ports(3)
    prefix = f"tunerremote{os.getpid()}_{os.urandom(4).hex()}_"  # this server's own shared-memory regions
    env = dict(os.environ, LD_LIBRARY_PATH=str(triton_install.lib_dir),
               TUNER_MODEL_PYTHONPATH=str(triton_install.model_pythonpath))
    cmd = [str(triton_install.binary), "--model-repository", str(folder / "repo"),
           "--backend-directory", str(triton_install.backends_dir), f"--model-control-mode={mode}",
           *(f"--load-model={m}" for m in load), *extra, "--http-address=127.0.0.1", f"--http-port={http}",
           "--grpc-address=127.0.0.1", f"--grpc-port={grpc}", "--metrics-address=127.0.0.1",
           f"--metrics-port={metrics}", f"--backend-config=python,shm-region-prefix-name={prefix}"]
    with open(folder / "log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        client = TritonHttp(f"127.0.0.1:{http}")
        deadline = time.monotonic() + 60
        while not client.ok("v2/health/ready") and time.monotonic() < deadline:
            assert proc.poll() is None, (folder / "log").read_text()[-2000:]
            time.sleep(0.2)  # polls a readiness the server reports: no timing is assumed
        yield f"127.0.0.1:{http}", proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for name in os.listdir("/dev/shm"):  # a killed server leaves its regions: remove ours, by prefix
            if name.startswith(prefix):
                os.unlink(os.path.join("/dev/shm", name))


def test_server_not_in_explicit_mode_is_refused(triton_install, templates_dir, tmp_path):
    # a server of someone else's that polls its repository
    with someone_elses_server(triton_install, templates_dir, tmp_path, models=["matmul_cpu"], mode="poll",
                              extra=["--repository-poll-secs=3600"]) as (address, _):
        with pytest.raises(ServerSetupError, match="explicit model-control mode"):
            RemoteLauncher(address, models=["matmul_cpu"]).start()


@pytest.mark.parametrize("mode,load,why", [
    ("none", [], "does not run in explicit model-control mode"),
    ("explicit", [], "model 'encoder_sim' is not loaded and ready on the server"),
])
def test_tune_refuses_a_server_its_launcher_would_refuse_before_writing_anything(
        triton_install, templates_dir, tmp_path, capsys, mode, load, why):
    # `--check` says what the run will: both refuse before the output directory (its study.db) is made
    with someone_elses_server(triton_install, templates_dir, tmp_path / "server", models=["encoder_sim"],
                              mode=mode, load=load) as (address, _):
        study = write_tune_study(tmp_path, "remote", **{"server": {"launcher": "remote", "url": address}})
        for check in (["--check"], []):
            assert main(["tune", str(study), *check]) == 2, check
            err = capsys.readouterr().err
            lines = [line for line in err.splitlines() if line.startswith("tuner: error: ")]
            assert len(lines) == 1 and why in lines[0] and "Traceback" not in err, (check, err)
            assert not (tmp_path / "remote").exists(), check  # no output directory, no study.db


def test_a_server_that_dies_after_it_was_reached_is_a_server_error(triton_install, templates_dir, tmp_path):
    # never reached: bad input (exit 2); reached, then gone: a failure of the work (exit 1), whether the
    # same launcher starts again (a crash's restart) or a new one does (the re-measurement's session)
    with someone_elses_server(triton_install, templates_dir, tmp_path, models=["encoder_sim"], mode="explicit",
                              load=["encoder_sim"]) as (address, proc):
        with RemoteLauncher(address, models=["encoder_sim"]) as remote:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            assert not remote.exited()  # not ours: its death cannot be told for sure, a replay runs to its end
            remote.stop()
            with pytest.raises(ServerError, match=rf"^the Triton server at {address} was ready earlier in this "
                                                  rf"run and failed since: cannot reach a Triton server at {address}"):
                remote.start()
        with pytest.raises(ServerError, match="was ready earlier in this run and failed since: cannot reach"):
            RemoteLauncher(address, models=["encoder_sim"]).start()


def test_a_killed_runs_trial_configuration_is_undone_by_the_next_run(owner, tmp_path, capsys):
    # a run that is killed never reaches stop(): the original it kept before its first trial's load is
    # what the next run restores the server to, and takes for the original, not the trial's it finds
    original = owner.model_config("encoder_sim")
    killed = RemoteLauncher(owner.endpoints.http, models=["encoder_sim"], originals_dir=tmp_path)
    killed.start()
    killed.apply_config("encoder_sim", with_batching(template("encoder_sim"), 7, 6000))
    [kept] = tmp_path.iterdir()  # kept on disk while the trial's configuration runs
    assert owner.model_config("encoder_sim").max_batch_size == 7
    del killed  # no stop(): as kill -9 leaves it

    following = RemoteLauncher(owner.endpoints.http, models=["encoder_sim"], originals_dir=tmp_path)
    try:
        with following:
            assert owner.model_config("encoder_sim") == original  # restored first, read back equal
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and "ran a configuration an interrupted run left" in err, err
            assert "max_batch_size: 64 -> 7" in err and str(kept) in err, err
            assert not kept.exists()  # restored: nothing left to restore
            following.apply_config("encoder_sim", with_batching(template("encoder_sim"), 8, 3000))
            assert kept.exists()
        assert owner.model_config("encoder_sim") == original  # its stop() put back the real original
        assert list(tmp_path.iterdir()) == []
    finally:  # the module's other tests share this server
        owner.apply_config("encoder_sim", original)


def test_the_original_is_kept_before_a_trial_changes_the_server(owner, tmp_path):
    # where the original cannot be kept, no trial's configuration is loaded: one line, the server untouched
    original = owner.model_config("encoder_sim")
    (tmp_path / "taken").write_text("someone's file")
    remote = RemoteLauncher(owner.endpoints.http, models=["encoder_sim"], originals_dir=tmp_path / "taken")
    with remote:
        with pytest.raises(OutputError, match=r"^.*taken/remote-original-encoder_sim-127\.0\.0\.1_\d+\.json "
                                              r"\(the original configuration of 'encoder_sim' on .*\): cannot write"):
            remote.apply_config("encoder_sim", with_batching(template("encoder_sim"), 8, 3000))
        assert owner.model_config("encoder_sim") == original
    assert (tmp_path / "taken").read_text() == "someone's file"


def test_a_kept_original_that_cannot_be_read_is_refused_and_left(owner, tmp_path):
    remote = RemoteLauncher(owner.endpoints.http, models=["encoder_sim"], originals_dir=tmp_path)
    kept = remote._kept("encoder_sim")
    kept.write_text('{"url": "x", "model": "encoder_sim"}')
    with pytest.raises(InputError, match=rf"^{kept} \(the original configuration of 'encoder_sim' on .*, kept by an "
                                         rf"interrupted run\): holds no 'config' object; check the server's"):
        remote.start()
    assert kept.read_text() == '{"url": "x", "model": "encoder_sim"}'


def test_make_launcher_keeps_a_remote_original_in_the_studys_output(tmp_path):
    from tuner.server import make_launcher
    from tuner.settings import study_from_dict

    settings = study_from_dict({"name": "s", "model_repository": str(tmp_path), "model": "m", "traffic": {"path": "t.csv"},
                                "server": {"launcher": "remote", "url": "127.0.0.1:8000"},
                                "output": str(tmp_path / "out")}, base_dir=tmp_path)
    assert make_launcher(settings).originals_dir == tmp_path / "out" / "server"
    assert make_launcher(settings, read_only=True).originals_dir is None  # it changes nothing


def test_an_interrupted_read_only_launcher_says_it_leaves_the_server_as_it_is():
    # an interrupted audit said "reloading the models tuner changed", of a deployment it never changed
    from tuner.server.remote import RemoteLauncher

    assert "nothing was changed" in RemoteLauncher("127.0.0.1:9", read_only=True).stopping
    assert "reloading the models tuner changed" in RemoteLauncher("127.0.0.1:9").stopping
