"""The docker launcher against a real Docker engine and the CPU test image (docker/build-test-image.sh).

Needs an engine at DOCKER_HOST (`eval "$(docker/start-engine.sh)"`). Without one these tests skip,
unless TUNER_REQUIRE_DOCKER=1 or TUNER_REQUIRE_ALL=1 (CI), where they fail saying what is missing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import docker.errors
import pytest

from tuner.errors import ServerError, ServerSetupError
from tuner.localhost import free_ports
from tuner.server.docker import (
    LABEL_HOST,
    LABEL_MANAGED,
    LABEL_PID,
    LABEL_PIDNS,
    LABEL_SESSION,
    DockerLauncher,
    device_requests,
    log_tail,
    managed_containers,
    pid_namespace,
    remove_orphans,
)
from tuner.settings import ServerSettings
from tuner.trial import CRASHED

from .contract import LauncherContract, template, with_batching

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "model_repository_templates"
MODEL = "matmul_cpu"
IMAGE = os.environ.get("TUNER_TEST_IMAGE", "tuner/tritonserver-cpu:2.51.0")
SETTINGS = ServerSettings(launcher="docker", image=IMAGE, startup_timeout_s=60.0)


# --- engine, image and the leftover check ---------------------------------------------------------

def _unavailable(reason: str):
    for required in ("TUNER_REQUIRE_DOCKER", "TUNER_REQUIRE_ALL"):  # CI: a missing engine is a failure
        if os.environ.get(required) == "1":
            pytest.fail(f"{required}=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def engine():
    """A docker client for the engine at DOCKER_HOST, with the test image built (cached: < 1 s)."""
    import docker

    where = os.environ.get("DOCKER_HOST")
    if not where:
        _unavailable('DOCKER_HOST is not set; start the engine with: eval "$(docker/start-engine.sh)"')
    try:
        client = docker.from_env(timeout=60)
        client.ping()
    except docker.errors.DockerException as exc:
        _unavailable(f"no Docker engine answers at DOCKER_HOST={where}: {exc}")
    build = subprocess.run([str(ROOT / "docker" / "build-test-image.sh")], capture_output=True, text=True,
                           env={**os.environ, "TUNER_TEST_IMAGE": IMAGE})
    if build.returncode != 0:
        pytest.fail(f"docker/build-test-image.sh failed:\n{build.stderr[-3000:]}", pytrace=False)
    yield client
    # Nothing of ours may outlive the tests: no container, network or volume with the project's label.
    label = {"label": f"{LABEL_MANAGED}=1"}
    left = ([f"container {c.name}" for c in client.containers.list(all=True, filters=label)]
            + [f"network {n.name}" for n in client.networks.list(filters=label)]
            + [f"volume {v.name}" for v in client.volumes.list(filters=label)])
    client.close()
    assert not left, f"left behind with label {LABEL_MANAGED}=1: {', '.join(left)}"


@pytest.fixture(scope="module")
def server(engine, tmp_path_factory):
    """One container shared by the tests that only read or reconfigure it."""
    log_dir = tmp_path_factory.mktemp("docker-logs")
    with DockerLauncher(SETTINGS, TEMPLATES, ["encoder_sim", MODEL], log_dir=log_dir) as launcher:
        yield launcher
    assert (log_dir / "tritonserver.log").is_file()


# --- the launcher's contract against the real engine ---------------------------------------------

@pytest.fixture(scope="module")
def launcher(server):
    return server


@pytest.mark.docker
@pytest.mark.slow
class TestDockerContract(LauncherContract):
    def test_refusal_quotes_the_server_log(self, launcher):
        bad = with_batching(template(MODEL), 8, 0)
        bad.dynamic_batching.preferred_batch_size.append(64)
        with pytest.raises(ServerSetupError, match="preferred size must be <= max batch size"):
            launcher.apply_config(MODEL, bad)
        assert launcher.is_alive()
        launcher.apply_config(MODEL, template(MODEL))

    def test_logs_tail(self, launcher):
        text = launcher.logs(5)
        assert 0 < len(text.splitlines()) <= 5
        assert "successfully loaded" in launcher.logs(500)


@pytest.mark.docker
def test_container_is_labelled_host_networked_and_mounts_a_readonly_copy(server, engine):
    (container,) = managed_containers(engine, server.session)
    assert container.labels[LABEL_MANAGED] == "1"
    assert container.attrs["HostConfig"]["NetworkMode"] == "host"
    (mount,) = container.attrs["Mounts"]
    assert mount["Destination"] == "/models" and mount["RW"] is False
    assert Path(mount["Source"]) != TEMPLATES  # a private copy, never the user's folder
    args = container.attrs["Args"]
    assert "--http-address=127.0.0.1" in args and "--model-control-mode=explicit" in args
    assert container.attrs["HostConfig"]["ShmSize"] == 256 * 1024 * 1024


# --- failures ------------------------------------------------------------------------------------

@pytest.mark.docker
@pytest.mark.slow
def test_killed_container_is_reported_with_its_log_and_a_new_one_starts(engine, tmp_path):
    launcher = DockerLauncher(SETTINGS, TEMPLATES, [MODEL], log_dir=tmp_path)
    with launcher:
        container = engine.containers.get(launcher.container_name)
        repo_copy = Path(container.attrs["Mounts"][0]["Source"])
        assert (repo_copy / MODEL / "config.pbtxt").is_file()
        assert not launcher.exited()
        container.kill()
        deadline = time.monotonic() + 10
        while launcher.is_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not launcher.is_alive() and launcher.exited()
        with pytest.raises(ServerError) as caught:
            launcher.statistics(MODEL)
        message = str(caught.value)
        # one line: the container's state and where its log is kept (the log's lines are in that file)
        assert "exited" in message and "\n" not in message and message.endswith(f"; its log: {tmp_path / 'tritonserver.log'}")
    assert not launcher.exited()  # stopped: no container of its own to have exited
    assert not managed_containers(engine, launcher.session)
    assert not repo_copy.parent.exists()  # the private copy is gone with the container
    assert "Started HTTPService" in (tmp_path / "tritonserver.log").read_text()
    with DockerLauncher(SETTINGS, TEMPLATES, [MODEL]) as again:
        assert again.is_alive()


@pytest.mark.docker
@pytest.mark.slow
def test_a_killed_containers_log_tail_is_only_what_it_wrote_for_the_current_config(engine, tmp_path):
    with DockerLauncher(SETTINGS, TEMPLATES, [MODEL], log_dir=tmp_path) as launcher:
        launcher.apply_config(MODEL, with_batching(template(MODEL), 4, 500))  # the previous trial
        container = engine.containers.get(launcher.container_name)
        before = container.logs().decode(errors="replace").rstrip("\n")
        launcher.apply_config(MODEL, with_batching(template(MODEL), 8, 100))  # the current one
        container.kill()
        deadline = time.monotonic() + 10
        while launcher.is_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        since = [line for line in container.logs().decode(errors="replace")[len(before):].splitlines() if line.strip()]
        quoted = launcher.logs(500)
    # only the current configuration's lines (or a line saying there are none): not the earlier trial's
    assert quoted == ("\n".join(since) if since else
                      "(the server wrote nothing to its log since this configuration was applied)")
    assert "successfully loaded" in before
    assert not any(line in quoted for line in before.splitlines()[:3] if line.strip())


def test_no_engine_is_a_clear_setup_error(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    with pytest.raises(ServerSetupError, match="no Docker engine at unix://.*no-engine.sock"):
        DockerLauncher(SETTINGS, TEMPLATES, [MODEL]).start()


@pytest.mark.docker
def test_image_neither_local_nor_pullable(engine):
    settings = dataclasses.replace(SETTINGS, image="127.0.0.1:1/tuner/absent:0")  # a registry that refuses
    with pytest.raises(ServerSetupError, match="server.image .*cannot be pulled"):
        DockerLauncher(settings, TEMPLATES, [MODEL]).start()


@pytest.mark.docker
def test_gpu_without_nvidia_runtime(engine):
    if "nvidia" in (engine.info().get("Runtimes") or {}):
        pytest.skip("this engine has the NVIDIA runtime")
    launcher = DockerLauncher(dataclasses.replace(SETTINGS, gpus="all"), TEMPLATES, [MODEL])
    with pytest.raises(ServerSetupError, match="server.gpus='all'.*NVIDIA"):
        launcher.start()
    assert not managed_containers(engine, launcher.session)


@pytest.mark.docker
def test_port_in_use(engine):
    ports = free_ports(3)
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", ports[0]))
        blocker.listen()
        with pytest.raises(ServerSetupError, match=f"port {ports[0]} .*in use"):
            DockerLauncher(SETTINGS, TEMPLATES, [MODEL], ports=ports).start()


@pytest.mark.docker
def test_unknown_model_and_missing_repository(engine, tmp_path):
    with pytest.raises(ServerSetupError, match="no model named 'nope'"):
        DockerLauncher(SETTINGS, TEMPLATES, ["nope"]).start()
    with pytest.raises(ServerSetupError, match="model repository not found"):
        DockerLauncher(SETTINGS, tmp_path / "absent", [MODEL]).start()


@pytest.mark.docker
@pytest.mark.slow
def test_a_startup_failure_is_one_line_with_tritons_reason_and_its_log(engine, tmp_path):
    repo = tmp_path / "repo"
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "config.pbtxt").write_text('name: "broken"\nbackend: "no_such_backend"\n')
    with pytest.raises(ServerSetupError, match=r"stopped.*no_such_backend.*; its log: .*tritonserver.log$") as caught:
        with DockerLauncher(SETTINGS, repo, ["broken"], log_dir=tmp_path / "logs"):
            pass
    assert "\n" not in str(caught.value)  # one line: Triton's reason and where its log is, not a dump
    assert "no_such_backend" in (tmp_path / "logs" / "tritonserver.log").read_text()


# --- cleanup on Ctrl-C and after a killed run ----------------------------------------------------

_CHILD = textwrap.dedent("""
    import sys, time
    from tuner.server.docker import DockerLauncher
    from tuner.settings import ServerSettings
    launcher = DockerLauncher(ServerSettings(launcher="docker", image=sys.argv[1]), sys.argv[2], [sys.argv[3]])
    with launcher:
        print(launcher.session, flush=True)
        time.sleep(600)
""")


def _start_child() -> tuple[subprocess.Popen, str]:
    child = subprocess.Popen([sys.executable, "-c", _CHILD, IMAGE, str(TEMPLATES), MODEL],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    session = child.stdout.readline().strip()
    if not session:
        child.kill()
        pytest.fail(f"the child launcher did not start: {child.stderr.read()[-2000:]}")
    return child, session


@pytest.mark.docker
@pytest.mark.slow
def test_ctrl_c_removes_the_container(engine):
    child, session = _start_child()
    try:
        assert len(managed_containers(engine, session)) == 1
        child.send_signal(signal.SIGINT)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert not managed_containers(engine, session)


@pytest.mark.docker
@pytest.mark.slow
def test_container_of_a_killed_run_is_removed_by_the_next_start(engine):
    child, session = _start_child()
    child.send_signal(signal.SIGKILL)  # no cleanup can run: the container stays behind
    child.wait(timeout=10)
    (orphan,) = managed_containers(engine, session)
    assert orphan.labels[LABEL_SESSION] == session
    repo_copy = Path(orphan.attrs["Mounts"][0]["Source"])
    assert repo_copy.is_dir()
    with DockerLauncher(SETTINGS, TEMPLATES, [MODEL]) as launcher:
        assert not managed_containers(engine, session)
        assert not repo_copy.exists()
        assert len(managed_containers(engine, launcher.session)) == 1


# --- pure helpers (no engine) --------------------------------------------------------------------


def test_only_containers_whose_owner_is_gone_in_this_pid_namespace_are_removed(capsys):
    """Two pods of one node share its hostname (hostNetwork), not their process ids: a container of
    another PID namespace is named, never removed (its pid, alive or not here, says nothing of its run)."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()

    class Container:
        def __init__(self, name: str, pid: int, pidns: str | None) -> None:
            self.name, self.attrs, self.removed = name, {"Mounts": []}, False
            self.labels = {LABEL_MANAGED: "1", LABEL_HOST: socket.gethostname(), LABEL_PID: str(pid),
                           **({LABEL_PIDNS: pidns} if pidns is not None else {})}

        def remove(self, force: bool) -> None:
            self.removed = True

    here = pid_namespace()
    containers = [Container("ours-dead", dead.pid, here), Container("ours-live", os.getpid(), here),
                  Container("other-pod", dead.pid, "4026531999"), Container("old-label", dead.pid, None)]

    class Client:
        class containers:  # noqa: N801 (docker's client.containers)
            @staticmethod
            def list(all: bool, filters: dict) -> list:  # noqa: A002 (docker's own name)
                return containers

    assert here and remove_orphans(Client()) == ["ours-dead"]
    assert [c.name for c in containers if c.removed] == ["ours-dead"]
    err = capsys.readouterr().err
    assert "left 2 container(s) of a tuner run in another PID namespace" in err and "other-pod, old-label" in err


class _Container:
    """A container as the SDK gives it, in one state: `reload` reads it again (or fails as the engine does)."""

    def __init__(self, status: str, fails: Exception | None = None):
        self.status, self.fails = status, fails
        self.attrs = {"State": {"ExitCode": 137}}

    def reload(self) -> None:
        if self.fails is not None:
            raise self.fails


@pytest.mark.parametrize(("status", "fails", "exited"), [
    ("running", None, False), ("created", None, False), ("paused", None, False), ("restarting", None, False),
    ("exited", None, True), ("dead", None, True),
    ("running", docker.errors.NotFound("gone"), True),  # removed (docker rm -f): certainly gone
    # an engine that does not answer tells nothing of the container: a replay is never cut short for it
    ("running", docker.errors.DockerException("engine unreachable"), False),
])
def test_exited_is_the_containers_state_not_a_health_check(status, fails, exited):
    launcher = DockerLauncher(SETTINGS, TEMPLATES, [MODEL])
    assert launcher.exited() is False  # not started
    launcher._container = _Container(status, fails)
    assert launcher.exited() is exited


@pytest.mark.parametrize(("gpus", "count", "ids"), [
    ("all", -1, None), (2, 2, None), ("2", 2, None), ([0, 3], None, ["0", "3"]),
    ("device=1,2", None, ["1", "2"]), ("0,1", None, ["0", "1"]),
])
def test_device_requests(gpus, count, ids):
    (request,) = device_requests(gpus)
    assert request["Capabilities"] == [["gpu"]]
    assert request.get("Count") == count if count is not None else request.get("DeviceIDs") == ids


@pytest.mark.parametrize("gpus", [None, 0, [], ""])
def test_no_gpus(gpus):
    assert device_requests(gpus) == []


def test_log_tail_drops_tables_and_keeps_an_earlier_error():
    log = "\n".join(["E1 first failure"] + [f"I line {i}" for i in range(30)] + ["+---+", "| a |", "I x.cc:1] "])
    tail = log_tail(log, lines=5)
    assert tail.splitlines() == ["E1 first failure", "I line 25", "I line 26", "I line 27", "I line 28",
                                 "I line 29"]


@pytest.mark.docker
def test_published_ports_on_an_engine_without_a_bridge(engine):
    if any(n.name == "bridge" and n.attrs.get("Driver") == "bridge" for n in engine.networks.list()):
        pytest.skip("this engine has a bridge network: published ports would work")
    launcher = DockerLauncher(dataclasses.replace(SETTINGS, network="published"), TEMPLATES, [MODEL])
    with pytest.raises(ServerSetupError, match="published no ports.*server.network: host"):
        launcher.start()
    assert not managed_containers(engine, launcher.session)


def test_gpu_study_example_is_a_valid_docker_study():
    from tuner.settings import read_study

    study = read_study(ROOT / "examples" / "gpu_study.yaml")
    assert study.server.launcher == "docker" and study.server.gpus == "all"
    assert study.server.image.startswith("nvcr.io/nvidia/tritonserver:")
    assert device_requests(study.server.gpus)[0]["Count"] == -1


@pytest.mark.docker
@pytest.mark.slow
def test_a_chosen_port_taken_before_triton_binds_it_is_retried(engine, monkeypatch):
    import tuner.server.docker as docker_launcher

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    choices = [(taken.getsockname()[1], *free_ports(2))]  # the race: a "free" port someone else holds
    real_free_ports = docker_launcher.free_ports
    monkeypatch.setattr(docker_launcher, "free_ports", lambda n: choices.pop() if choices else real_free_ports(n))
    try:
        with DockerLauncher(SETTINGS, TEMPLATES, [MODEL]) as launcher:
            assert launcher.is_alive()
            assert launcher._port_retries == 1
            assert launcher.endpoints.http != f"127.0.0.1:{taken.getsockname()[1]}"
    finally:
        taken.close()


# --- the CLI end to end with server.launcher: docker ---------------------------------------------

def _docker_study(tmp_path: Path, name: str, extra: str = "") -> Path:
    """A study file on the docker launcher: encoder_sim, the bursty profile's busiest second."""
    study = tmp_path / f"{name}.yaml"
    study.write_text(textwrap.dedent(f"""\
        name: {name}
        model_repository: {TEMPLATES}
        model: encoder_sim
        traffic: {{path: {ROOT / 'traffic_profiles' / 'bursty_60s.csv'}, busiest_s: 1, speed: 0.25}}
        server: {{launcher: docker, image: {IMAGE}}}
        replay: {{warmup_s: 0.5, lag_budget_ms: 50}}
        sla: {{latency_ms: 250, percentile: 99, max_error_rate: 0.001}}
        output: {tmp_path / 'out'}
        """) + textwrap.dedent(extra))
    return study


@pytest.mark.docker
@pytest.mark.slow
def test_tuner_tune_end_to_end_with_the_docker_launcher(engine, tmp_path):
    study = _docker_study(tmp_path, "docker-tune", """\
        cost: {gpu: a100-40gb, cloud: gcp}
        search:
          sampler: grid
          max_batch_size: {low: 16, high: 16}
          max_queue_delay_microseconds: {low: 0, high: 0}
          capacity: {step_duration_s: 1.5, tolerance: 1.0, start_speed: 0.5, max_steps: 2}
          top_k: 1
          remeasure_repeats: 1
        """)
    before = {c.name for c in managed_containers(engine)}
    run = subprocess.run([sys.executable, "-m", "tuner", "tune", str(study), "--quiet", "--trials", "1"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trials"]["complete"] == 1 and summary["best"]["capacity_rps"] > 0
    assert (out / "recommended" / "config.pbtxt").is_file()
    (log,) = out.glob("server/*/tritonserver.log")  # the container's log, saved in the output
    assert "successfully loaded 'encoder_sim'" in log.read_text()
    assert {c.name for c in managed_containers(engine)} == before


@pytest.mark.docker
@pytest.mark.slow
def test_sigterm_to_tuner_tune_removes_its_container(engine, tmp_path):
    # how a scheduler stops the nightly job: SIGTERM to the process, no Ctrl-C to its group
    study = _docker_study(tmp_path, "docker-term")
    earlier = {c.id for c in managed_containers(engine)}
    job = subprocess.Popen([sys.executable, "-m", "tuner", "tune", str(study), "--quiet", "--trials", "3"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not [c for c in managed_containers(engine) if c.id not in earlier]:
            time.sleep(0.5)
        assert [c for c in managed_containers(engine) if c.id not in earlier], "no container started"
        time.sleep(2.0)
        job.send_signal(signal.SIGTERM)
        log = job.communicate(timeout=60)[0]
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 143, log[-3000:]
    assert "terminated (SIGTERM)" in log and "Traceback" not in log
    assert not [c for c in managed_containers(engine) if c.id not in earlier]


@pytest.mark.docker
@pytest.mark.slow
def test_a_container_killed_in_the_middle_of_a_trial_fails_that_trial_and_the_study_goes_on(engine, tmp_path):
    import threading
    import urllib.request

    from tuner.settings import study_from_dict
    from tuner.trial import Hints
    from tuner.trial.run import session

    settings = study_from_dict({
        "name": "docker-kill", "model_repository": str(TEMPLATES), "model": "encoder_sim",
        "traffic": {"path": str(ROOT / "traffic_profiles" / "bursty_60s.csv"), "busiest_s": 3, "speed": 0.25},
        "server": {"launcher": "docker", "image": IMAGE, "startup_timeout_s": 60.0},
        "replay": {"warmup_s": 0.5, "lag_budget_ms": 50},
        "sla": {"latency_ms": 250},
        "search": {"capacity": {"step_duration_s": 2.5, "tolerance": 1.0, "start_speed": 0.5, "max_steps": 1}},
        "output": str(tmp_path / "out"),
    })
    params = {"max_batch_size": 16, "max_queue_delay_microseconds": 0}
    killed: list[str] = []

    def kill_once_the_replay_runs(container_name: str, http: str) -> None:
        # statistics reset when the trial's config is loaded: the first counted inference means the
        # trial's replay is under way
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://{http}/v2/models/encoder_sim/stats", timeout=2) as r:
                    stats = json.load(r)["model_stats"][0]
            except OSError:
                stats = {}
            if int(stats.get("inference_count", 0)) > 0:
                engine.containers.get(container_name).kill()
                killed.append(container_name)
                return
            time.sleep(0.05)

    # other tests' containers (the module's shared server) may be running: count only this study's
    earlier = {c.id for c in managed_containers(engine)}

    def ours() -> list:
        return [c for c in managed_containers(engine) if c.id not in earlier]

    with session(settings, str(tmp_path / "logs")) as evaluate:
        first = ours()
        assert len(first) == 1
        watcher = threading.Thread(target=kill_once_the_replay_runs,
                                   args=(first[0].name, _http_endpoint(first[0])), daemon=True)
        watcher.start()
        crashed = evaluate(params, Hints())
        watcher.join(timeout=5)
        assert killed, "the container was never killed: the replay did not start"
        assert crashed.outcome == CRASHED and not crashed.meets_sla
        assert "the server crashed" in crashed.sla_reason
        # the container's last log lines, those written since the trial's configuration was applied: its load,
        # not the server's start
        assert "successfully loaded" in crashed.note and "Started HTTPService" not in crashed.note
        # a new container took its place and the next trial is measured normally
        now = ours()
        assert len(now) == 1 and now[0].id != first[0].id
        again = evaluate(params, Hints())
        assert again.outcome != CRASHED and again.at_load.valid
    assert not ours()


def _http_endpoint(container) -> str:
    """The container's HTTP address, from the tritonserver arguments it was started with."""
    args = container.attrs["Args"] + container.attrs["Config"].get("Cmd", [])
    port = next(a.split("=", 1)[1] for a in args if a.startswith("--http-port="))
    return f"127.0.0.1:{port}"


@pytest.mark.docker
@pytest.mark.slow
def test_a_trials_engine_arguments_reach_the_container_not_the_users_files(engine):
    """The container mounts the private copy read-only; the trial's model.json is written into that
    copy on the host and read by the model as it loads (tests/data/engine_models/engine_echo answers
    with the model.json it read)."""
    import numpy as np

    from tuner import modelconfig
    from tuner.llm import engineargs

    from .contract import infer

    models, name = ROOT / "tests" / "data" / "engine_models", "engine_echo"
    user = (models / name / "1" / "model.json").read_bytes()
    config = modelconfig.load(models / name / "config.pbtxt")
    # as a vLLM study starts it: no model loaded until the first trial loads it with its engine arguments
    with DockerLauncher(SETTINGS, models, [name], load_models=False) as launcher:
        assert not launcher._require_http().ok(f"v2/models/{name}/ready")
        for seqs in (16, 32):
            trial = {**engineargs.read(models / name), "max_num_seqs": seqs}
            launcher.apply_engine_args(name, config, trial)
            answer = infer(launcher.endpoints.http, name, "DUMMY", np.zeros(1, dtype=np.int32))
            assert json.loads(answer["outputs"][0]["data"][0]) == trial
    assert (models / name / "1" / "model.json").read_bytes() == user
