"""Triton in a Docker container, driven through the docker SDK (honours DOCKER_HOST).

The container runs `tritonserver` in explicit model-control mode on a private, read-only copy of the
model repository. Networking is either the host's (the server bound to 127.0.0.1 on free ports) or
ports published on 127.0.0.1 only. Every container carries the labels `tuner.managed=1`,
`tuner.session=<id>`, `tuner.host` and `tuner.pid`: `stop()` (also reached on Ctrl-C and on a crash,
through the context manager and an atexit hook) removes it, and the next start removes any container
whose owning process on this host is gone (a run killed with SIGKILL).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

import docker.errors  # binds `docker` too (from_env, DockerClient)
from docker.types import DeviceRequest
from tqdm import tqdm

from tuner.errors import ServerError, ServerSetupError
from tuner.formats import first_line
from tuner.llm import engineargs
from tuner.localhost import check_port_free, free_ports, pid_alive
from tuner.modelconfig import ModelConfig
from tuner.server.base import LIVE, Endpoints, Launcher, check_repository, copy_models, triton_reason
from tuner.server.client import TritonHttp, apply_and_verify
from tuner.settings import ServerSettings

LABEL_MANAGED = "tuner.managed"
LABEL_SESSION = "tuner.session"
LABEL_HOST = "tuner.host"
LABEL_PID = "tuner.pid"
LABEL_PIDNS = "tuner.pidns"  # the owner's PID namespace: a pid means something only inside it
REPO_IN_CONTAINER = "/models"
LOG_NAME = "tritonserver.log"
REPO_COPY_PREFIX = "tuner-docker-repo-"
LOAD_TIMEOUT_S = 300.0
PORT_RETRIES = 3  # new free ports when one we chose was taken before Triton bound it
GPU_LOCK_ENV = "TUNER_EMULATED_GPU_LOCK"  # encoder_sim's emulated GPU: one lock per container
_PORT_IN_USE = re.compile(r"[^\n]*(address already in use|port is already allocated|already in use)[^\n]*", re.I)
_NO_GPU_RUNTIME = re.compile(r"could not select device driver|nvidia-container-cli|unknown or invalid runtime", re.I)


class DockerLauncher(Launcher):
    """A Triton server in a Docker container of our own, serving a private copy of the models."""

    name = "docker"

    def __init__(self, settings: ServerSettings, model_repository: str | Path,
                 models: Sequence[str] = (), *, log_dir: str | Path | None = None,
                 ports: tuple[int, int, int] | None = None, load_models: bool = True):
        """`ports` (http, grpc, metrics) pins the host ports; by default free ones are chosen.
        `load_models=False`: none is loaded at start (as LocalLauncher's)."""
        self.settings = settings
        self.load_models = load_models
        self.model_repository = Path(model_repository)
        self.models = list(models)
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.session = uuid.uuid4().hex[:12]
        self.container_name = f"tuner-triton-{self.session}"
        self._ports = ports
        self._client: docker.DockerClient | None = None
        self._container = None
        self._repo_copy: Path | None = None
        self._endpoints: Endpoints | None = None
        self._http: TritonHttp | None = None
        self._final_logs = ""
        self._log_mark = 0  # where the current configuration's lines begin in the container's log
        self._mark_what = "the server started"
        self._port_retries = 0

    # --- lifecycle ---------------------------------------------------------------------------------

    @property
    def endpoints(self) -> Endpoints:
        if self._endpoints is None:
            raise ServerError("the docker launcher has not been started")
        return self._endpoints

    def start(self) -> None:
        if self._container is not None:
            return
        models = check_repository(self.model_repository, self.models)
        client = self._connect()
        remove_orphans(client)
        image = self._ensure_image(client)
        if self._ports is not None:
            for port in self._ports:
                check_port_free(port)
        http_port, grpc_port, metrics_port = self._ports or free_ports(3)
        LIVE.add(self)
        self._log_mark, self._mark_what = 0, "the server started"  # a new container, a new log
        try:
            self._run(client, image, models, ports=(http_port, grpc_port, metrics_port))
        except BaseException:  # also Ctrl-C in the middle of creating the container
            self.stop()
            raise
        self._endpoints = Endpoints(http=f"127.0.0.1:{http_port}", grpc=f"127.0.0.1:{grpc_port}",
                                    metrics=f"http://127.0.0.1:{metrics_port}/metrics")
        self._http = TritonHttp(self._endpoints.http)

    def _run(self, client: docker.DockerClient, image: str, models: list[str],
             *,
             ports: tuple[int, int, int]) -> None:
        http_port, grpc_port, metrics_port = ports
        self._repo_copy = private_copy(self.model_repository, models)
        environment = {GPU_LOCK_ENV: "/tmp/tuner-emulated-gpu.lock", **self.settings.environment}
        kwargs = dict(
            image=image,
            command=self._command(http_port, grpc_port, metrics_port),
            name=self.container_name,
            detach=True,
            labels={LABEL_MANAGED: "1", LABEL_SESSION: self.session,
                    LABEL_HOST: socket.gethostname(), LABEL_PID: str(os.getpid()), LABEL_PIDNS: pid_namespace()},
            volumes={str(self._repo_copy): {"bind": REPO_IN_CONTAINER, "mode": "ro"}},
            shm_size=self.settings.shm_size,
            environment=environment,
            device_requests=device_requests(self.settings.gpus),
        )
        if self.settings.network == "host":
            kwargs["network_mode"] = "host"
        else:  # the server binds all addresses inside its own network namespace; only loopback outside
            kwargs["ports"] = {"8000/tcp": ("127.0.0.1", http_port), "8001/tcp": ("127.0.0.1", grpc_port),
                               "8002/tcp": ("127.0.0.1", metrics_port)}
        try:
            self._container = client.containers.create(**kwargs)
            self._container.start()
        except docker.errors.APIError as exc:
            raise ServerSetupError(self._explain_api_error(exc, ports)) from None
        except docker.errors.DockerException as exc:  # the SDK's own checks (a size it cannot read), before any call
            raise ServerSetupError(f"the Triton container: {first_line(exc)} (server.shm_size "
                                   f"{self.settings.shm_size!r}?)") from None
        if self.settings.network == "published":
            self._check_published()

    def wait_ready(self, timeout_s: float | None = None) -> None:
        timeout_s = self.settings.startup_timeout_s if timeout_s is None else timeout_s
        http = self._require_http()
        deadline = time.monotonic() + timeout_s
        while True:
            state = self._state()
            if state not in ("created", "running") and self._port_was_taken():
                # another process took a port between our choosing it and Triton binding it
                self._port_retries += 1
                self.stop()
                self.start()
                http = self._require_http()
                continue
            if state not in ("created", "running"):
                raise ServerSetupError(self._startup_failure(f"the container stopped ({state}) before the "
                                                             "server was ready"))
            if http.ok("v2/health/ready") and all(http.ok(f"v2/models/{m}/ready") for m in self.loaded_at_start):
                return
            if time.monotonic() > deadline:
                raise ServerSetupError(self._startup_failure(f"the server was not ready within {timeout_s:g} s"))
            time.sleep(0.25)

    def stop(self) -> None:
        container, self._container = self._container, None
        if container is None and self._client is not None and self._repo_copy is not None:
            # interrupted between create and our noting it: find the container by its name
            with contextlib.suppress(docker.errors.DockerException):
                container = self._client.containers.get(self.container_name)
        if container is not None:
            with contextlib.suppress(docker.errors.DockerException):
                if self._state(container) in ("running", "created"):
                    container.stop(timeout=5)  # SIGTERM: lets Triton unload and exit cleanly
            self._final_logs = self._fetch_logs(container)
            self._save_logs(self._final_logs)
            with contextlib.suppress(docker.errors.NotFound):
                try:
                    container.remove(force=True)
                except docker.errors.DockerException as exc:
                    print(f"tuner: could not remove container {self.container_name}: {exc}", file=sys.stderr)
        if self._repo_copy is not None:
            shutil.rmtree(self._repo_copy.parent, ignore_errors=True)
            self._repo_copy = None
        self._http = None
        LIVE.discard(self)  # last: a second Ctrl-C during the removal leaves it to the atexit hook

    def is_alive(self) -> bool:
        if self._container is None or self._http is None:
            return False
        return self._state() == "running" and self._http.ok("v2/health/live")

    def exited(self) -> bool:
        """Whether the container this launcher started has stopped or is gone (`Launcher.exited`), by
        its state as the engine tells it: an engine that does not answer tells nothing (False)."""
        if self._container is None:
            return False
        state = self._state()
        return state.startswith("exited") or state in ("dead", "removed")

    # --- model control and observation -------------------------------------------------------------

    def apply_config(self, model: str, config: ModelConfig) -> ModelConfig:
        return self._load(model, config, fresh=False)

    def _load(self, model: str, config: ModelConfig, *, fresh: bool) -> ModelConfig:
        http = self._require_http()
        offset = len(self._fetch_logs(self._container)) if self._container is not None else 0
        self._log_mark, self._mark_what = offset, "this configuration was applied"
        with self._died_to_server_error():
            return apply_and_verify(http, model, config, timeout_s=LOAD_TIMEOUT_S, fresh=fresh,
                                    explain_refusal=lambda message: self._explain_refusal(message, offset))

    def apply_engine_args(self, model: str, config: ModelConfig, args: Mapping[str, object]) -> ModelConfig:
        self._require_http()
        if self._repo_copy is None or not (self._repo_copy / model).is_dir():
            raise ServerSetupError(f"model '{model}' is not in the served repository (copied from {self.model_repository})")
        # the container mounts the host's private copy read-only: written here, it reads the new file
        # as the model loads (unloaded first: read anew)
        engineargs.write(self._repo_copy / model, args, user_dir=self.model_repository / model)
        return self._load(model, config, fresh=True)

    def model_config(self, model: str) -> ModelConfig:
        with self._died_to_server_error():
            return self._require_http().model_config(model)

    def statistics(self, model: str) -> dict:
        with self._died_to_server_error():
            return self._require_http().statistics(model)

    def metrics(self) -> dict[str, float]:
        with self._died_to_server_error():
            return self._require_http().metrics(self.endpoints.metrics)

    def logs(self, tail: int = 40) -> str:
        # as the local launcher's: only what the container wrote since the current configuration was applied
        text = self._final_logs if self._container is None else self._fetch_logs(self._container)
        lines = [line for line in text[self._log_mark:].splitlines() if line.strip()]
        if not lines:
            return f"(the server wrote nothing to its log since {self._mark_what})" if text else ""
        return "\n".join(lines[-tail:])

    # --- helpers ------------------------------------------------------------------------------------

    def _connect(self) -> docker.DockerClient:
        where = os.environ.get("DOCKER_HOST") or "the default socket (unix:///var/run/docker.sock)"
        try:
            client = docker.from_env(timeout=60)
            client.ping()
        except docker.errors.DockerException as exc:
            raise ServerSetupError(
                f"no Docker engine at {where}: {_short(exc)} (start one, or set DOCKER_HOST; "
                "for tests: eval \"$(docker/start-engine.sh)\")") from None
        self._client = client
        return client

    def _ensure_image(self, client: docker.DockerClient) -> str:
        image = self.settings.image
        try:
            client.images.get(image)
            return image
        except docker.errors.ImageNotFound:
            pass
        except docker.errors.APIError as exc:
            raise ServerSetupError(f"server.image {image!r}: {_short(exc)}") from None
        print(f"tuner: pulling {image} (not in the local image store)", file=sys.stderr)
        try:
            pull_with_progress(client, image)
        except docker.errors.DockerException as exc:
            raise ServerSetupError(f"server.image {image!r}: not in the local image store and cannot be "
                                   f"pulled: {_short(exc)}") from None
        return image

    def _command(self, http_port: int, grpc_port: int, metrics_port: int) -> list[str]:
        if self.settings.network == "host":
            address, ports = "127.0.0.1", (http_port, grpc_port, metrics_port)
        else:
            address, ports = "0.0.0.0", (8000, 8001, 8002)
        cmd = ["tritonserver", f"--model-repository={REPO_IN_CONTAINER}",
               f"--http-address={address}", f"--grpc-address={address}", f"--metrics-address={address}",
               f"--http-port={ports[0]}", f"--grpc-port={ports[1]}", f"--metrics-port={ports[2]}",
               "--model-control-mode=explicit", "--exit-timeout-secs=5"]
        if self.load_models:
            cmd += [f"--load-model={m}" for m in self.models] or ["--load-model=*"]
        return cmd + list(self.settings.extra_args)

    @property
    def loaded_at_start(self) -> list[str]:
        """The models the server is ready only once they are."""
        return self.models if self.load_models else []

    def _require_http(self) -> TritonHttp:
        if self._http is None:
            raise ServerError("the docker launcher has not been started")
        return self._http

    def _state(self, container=None) -> str:
        container = container or self._container
        if container is None:
            return "removed"
        try:
            container.reload()
        except docker.errors.NotFound:
            return "removed"
        except docker.errors.DockerException:
            return "unreachable"
        if container.status == "exited":
            return f"exited (code {container.attrs.get('State', {}).get('ExitCode')})"
        return container.status

    def _fetch_logs(self, container, tail: int | None = None) -> str:
        try:
            raw = container.logs(stdout=True, stderr=True, tail=tail if tail is not None else "all")
        except docker.errors.DockerException:
            return ""
        return raw.decode(errors="replace").rstrip("\n")

    def _save_logs(self, text: str) -> None:
        if self.log_dir is None or not text:
            return
        # appended: a launcher restarted after a crash keeps the crashed container's log before the next
        header = f"==== {self.container_name} ({self.settings.image}), removed {time.strftime('%Y-%m-%d %H:%M:%S')}"
        with contextlib.suppress(OSError):
            self.log_dir.mkdir(parents=True, exist_ok=True)
            with open(self.log_dir / LOG_NAME, "a") as fh:
                fh.write(f"{header} ====\n{text}\n")

    def _port_was_taken(self) -> bool:
        if self._ports is not None or self._port_retries >= PORT_RETRIES or self._container is None:
            return False
        return bool(_PORT_IN_USE.search(self._fetch_logs(self._container, 40)))

    def _startup_failure(self, what: str) -> str:
        full = self._fetch_logs(self._container) if self._container is not None else ""
        busy = _PORT_IN_USE.search(full)
        if busy:
            what = f"a port the server needs is in use ({busy.group(0).strip()}); {what}"
        self.stop()  # writes the log into log_dir
        return f"the Triton container {self.container_name}: {what}{self._why(full)}"

    def _why(self, log: str) -> str:
        """': <Triton's reason>; its log: <file>', one line (`triton_reason`); without a log_dir, where
        nothing is kept, the log's last lines follow it."""
        reason = triton_reason(log.splitlines())
        text = f": {reason}" if reason else ""
        if self.log_dir is not None:
            return f"{text}; its log: {self.log_dir / LOG_NAME}"
        return f"{text}; last log lines:\n{log_tail(log)}"

    @contextlib.contextmanager
    def _died_to_server_error(self):
        try:
            yield
        except (ServerError, ServerSetupError) as exc:
            state = self._state()
            if state != "running":
                full = self._fetch_logs(self._container) if self._container is not None else ""
                raise ServerError(f"the Triton container {self.container_name} is {state} "
                                  f"({first_line(exc)}){self._why(full)}") from None
            raise

    def _explain_refusal(self, message: str, offset: int) -> str:
        """Triton's HTTP answer to a refused load is vague; the reason is in the log since `offset`."""
        time.sleep(0.1)  # the log line may trail the HTTP answer
        new = self._fetch_logs(self._container)[offset:] if self._container is not None else ""
        errors = [line for line in new.splitlines() if line[:1] == "E" or "error" in line.lower()]
        return (errors[-1].split("] ", 1)[-1] if errors else message).strip()

    def _check_published(self) -> None:
        """An engine without a bridge network (dockerd --bridge=none) starts the container but
        publishes nothing: say so now rather than time out waiting for a server nobody can reach."""
        self._state()
        published = (self._container.attrs.get("NetworkSettings") or {}).get("Ports") or {}
        if not all(published.get(f"{port}/tcp") for port in (8000, 8001, 8002)):
            raise ServerSetupError("server.network: published: the Docker engine published no ports for the "
                                   "container (it has no bridge network, e.g. dockerd --bridge=none); use "
                                   "server.network: host")

    def _explain_api_error(self, exc: docker.errors.APIError, ports: tuple[int, int, int]) -> str:
        text = _short(exc)
        if _NO_GPU_RUNTIME.search(text):
            return (f"server.gpus={self.settings.gpus!r}: this Docker engine cannot give GPUs to containers "
                    f"(no NVIDIA container runtime): {text}")
        if _PORT_IN_USE.search(text):
            return f"a port the server needs ({', '.join(map(str, ports))}) is in use: {text}"
        return f"docker could not start {self.settings.image}: {text}"


# --- module-level helpers ------------------------------------------------------------------------

def pull_with_progress(client: docker.DockerClient, image: str) -> None:
    """`docker pull` with one progress bar over all layers (an NGC image is many gigabytes)."""
    repository, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "")
    layers: dict[str, tuple[int, int]] = {}
    # disable=None: no bar where stderr is not a terminal (a log, a script's capture), whose line an
    # error would otherwise follow on the bar's unerased one
    with tqdm(total=0, unit="B", unit_scale=True, desc=f"pull {image}", file=sys.stderr, leave=False,
              disable=None) as bar:
        for event in client.api.pull(repository, tag=tag or "latest", stream=True, decode=True):
            if "error" in event:
                raise docker.errors.APIError(event["error"])
            detail = event.get("progressDetail") or {}
            if event.get("status") == "Downloading" and detail.get("total"):
                layers[event["id"]] = (detail.get("current", 0), detail["total"])
                bar.total = sum(total for _, total in layers.values())
                bar.n = sum(current for current, _ in layers.values())
                bar.refresh()
    client.images.get(image)  # raises ImageNotFound if the pull ended without the image


def device_requests(gpus: str | int | list[int] | None) -> list[DeviceRequest]:
    """`all`, a count (2 or "2"), device ids ([0, 1], "0,1" or "device=0,1"), or None/0 for no GPU."""
    if gpus is None or gpus == 0 or gpus == "" or gpus == []:
        return []
    if gpus == "all":
        return [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    if isinstance(gpus, int):
        if gpus < 0:
            raise ServerSetupError(f"server.gpus: must be 'all', a count >= 0 or device ids, got {gpus}")
        return [DeviceRequest(count=gpus, capabilities=[["gpu"]])]
    if isinstance(gpus, list):
        return [DeviceRequest(device_ids=[str(g) for g in gpus], capabilities=[["gpu"]])]
    text = str(gpus).strip().removeprefix("device=")
    if str(gpus).strip().isdigit():
        return device_requests(int(gpus))
    ids = [part.strip() for part in text.split(",") if part.strip()]
    if not ids:
        raise ServerSetupError(f"server.gpus: must be 'all', a count or device ids, got {gpus!r}")
    return [DeviceRequest(device_ids=ids, capabilities=[["gpu"]])]


def log_tail(text: str, lines: int = 12) -> str:
    """The last `lines` lines of a Triton log without its ASCII tables, plus earlier error lines
    (the cause of a failed start is often above the shutdown chatter)."""
    kept = [line for line in text.splitlines()
            if line.strip() and line[:1] not in "+|" and not line.rstrip().endswith("]")]
    tail = kept[-lines:]
    errors = [line for line in kept[:-lines] if line[:1] == "E"][-3:]
    return "\n".join(errors + tail)


def private_copy(repository: Path, models: Sequence[str]) -> Path:
    """A copy of `models` from the repository, which the container mounts read-only."""
    target = Path(tempfile.mkdtemp(prefix=REPO_COPY_PREFIX))
    try:
        copy_models(repository, models, target / "repo")
    except ServerSetupError:
        shutil.rmtree(target, ignore_errors=True)
        raise
    os.chmod(target, 0o755)  # mkdtemp makes it 0700; the server in the container may not run as root
    return target / "repo"


def managed_containers(client: docker.DockerClient, session: str | None = None) -> list:
    """Every container (running or not) carrying tuner's label, optionally of one session."""
    labels = [f"{LABEL_MANAGED}=1"] + ([f"{LABEL_SESSION}={session}"] if session else [])
    return client.containers.list(all=True, filters={"label": labels})


def pid_namespace() -> str:
    """This process's PID namespace (its nsfs inode), '' where it cannot be read: two pods of one node
    share its hostname (hostNetwork) but not their process ids."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


def remove_orphans(client: docker.DockerClient) -> list[str]:
    """Remove tuner's containers whose owning process on this host is gone; returns their names.
    Containers of live processes (another tuner run sharing the engine) are left alone, and so are those
    of a process in another PID namespace (another pod on the node): whether it lives cannot be told from
    here, so they are named, for a person to remove once its run is gone."""
    removed, elsewhere = [], []
    host, ours = socket.gethostname(), pid_namespace()
    for container in managed_containers(client):
        labels = container.labels or {}
        if labels.get(LABEL_HOST) != host:
            continue
        if labels.get(LABEL_PIDNS, "") != ours:  # a label-less container: of a tuner before the label
            elsewhere.append(container.name)
            continue
        if pid_alive(labels.get(LABEL_PID, "")):
            continue
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)
            removed.append(container.name)
        for mount in container.attrs.get("Mounts") or []:  # its private repository copy, too
            source = Path(mount.get("Source", ""))
            if source.name == "repo" and source.parent.name.startswith(REPO_COPY_PREFIX):
                shutil.rmtree(source.parent, ignore_errors=True)
    if removed:
        print(f"tuner: removed {len(removed)} container(s) left by an earlier run: {', '.join(removed)}",
              file=sys.stderr)
    if elsewhere:
        print(f"tuner: left {len(elsewhere)} container(s) of a tuner run in another PID namespace (another pod "
              f"or container on this host), whose process cannot be checked from here: {', '.join(elsewhere)}; "
              f"`docker rm -f` them once that run is gone", file=sys.stderr)
    return removed


def _short(exc: Exception) -> str:
    explanation = getattr(exc, "explanation", None)
    text = explanation.decode(errors="replace") if isinstance(explanation, bytes) else explanation
    return first_line(text) if str(text or "").strip() else first_line(exc)
