"""A `tritonserver` process of our own, on loopback ports, serving a private copy of the repository."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from tuner.errors import ServerError, ServerSetupError
from tuner.llm import engineargs
from tuner.localhost import add_owner, check_port_free, free_ports, owned_tempdir
from tuner.modelconfig import ModelConfig
from tuner.server.base import LIVE, Endpoints, Launcher, check_repository, copy_models, triton_reason
from tuner.server.client import HttpError, TritonHttp, apply_and_verify
from tuner.server.install import TritonInstall, find_tritonserver, model_pythonpath, pin_stub_python

STOP_GRACE_S = 10.0
CONTROL_TIMEOUT_S = 5.0
WATCH_S = 0.25  # how often the watcher checks that the server still runs
WORKDIR_PREFIX = "tuner-triton-"
PORT_RETRIES = 2  # startups retried on new ports when a port chosen free was taken meanwhile
GPU_LOCK_ENV = "TUNER_EMULATED_GPU_LOCK"  # the file the encoder_sim template serializes executions on
MODEL_PYTHONPATH_ENV = "TUNER_MODEL_PYTHONPATH"
MODEL_PYTHON_ENV = "TUNER_MODEL_PYTHON"
SHM_DIR = Path("/dev/shm")  # where the Python backend's shared-memory regions live (POSIX shm on Linux)
PROGRESS_S = 10.0  # a start or a model load that lasts longer says so this often (a silent wait reads as a hang)
KEPT_LOG_PREFIX = "tuner-tritonserver-"  # a failed start's log, kept in the temp dir when its workdir goes


class LocalLauncher(Launcher):
    """`with LocalLauncher("repo", models=["m"]) as server: server.apply_config("m", cfg)`.

    The user's repository is copied to a private temp dir (never modified); the server runs in explicit
    model-control mode in its own process group, its log in a file; `stop()` ends the group.
    `ports=(http, grpc, metrics)` pins the ports (default: free ones chosen at start).
    `load_models=False`: the models are copied but none is loaded at start, for a caller whose first step
    loads one with its own files (a vLLM model's engine arguments: loaded twice, its engine would start
    twice, seconds on a CPU, minutes for a large model on a GPU).
    """

    name = "local"

    def __init__(self, model_repository: str | Path, models: Sequence[str] | None = None,
                 install_dir: str | Path | None = None, *, log_path: str | Path | None = None,
                 startup_timeout_s: float = 120.0, extra_args: Sequence[str] = (),
                 ports: tuple[int, int, int] | None = None, install: TritonInstall | None = None,
                 load_models: bool = True):
        self.model_repository = Path(model_repository)
        self.load_models = load_models
        self.models = list(models) if models is not None else None
        self.install_dir = install_dir
        self.log_path = Path(log_path) if log_path else None
        self.startup_timeout_s = startup_timeout_s
        self.extra_args = list(extra_args)
        self.ports = ports
        self._install = install
        self._proc: subprocess.Popen | None = None
        self._workdir: Path | None = None
        self._log_file: Path | None = None
        self._log_start = 0      # where this server's own lines begin in the (maybe shared) log file
        self._log_mark = 0       # where the current configuration's lines begin: logs() quotes from here
        self._mark_what = "the server started"
        self._shm_prefixes: list[str] = []  # the shm-region prefix of every server this launcher started
        self._spawn_args: tuple | None = None
        self._endpoints: Endpoints | None = None
        self._server_id = ""     # this server's --id, new at each start
        self._watcher: tuple[threading.Event, threading.Thread] | None = None  # from ready until stop
        self._http: TritonHttp | None = None
        self._lock = threading.Lock()

    # --- lifecycle ------------------------------------------------------------------------------

    @property
    def endpoints(self) -> Endpoints:
        if self._endpoints is None:
            raise ServerError("the local Triton server is not started")
        return self._endpoints

    @property
    def pid(self) -> int | None:
        """The server process's id (None when it is not running)."""
        return self._proc.pid if self._proc else None

    @property
    def repository(self) -> Path:
        """The private copy the server serves (valid once started)."""
        if self._workdir is None:
            raise ServerError("the local Triton server is not started")
        return self._workdir / "models"

    def start(self) -> None:
        if self._proc is not None:
            return
        models = check_repository(self.model_repository, self.models)
        install = self._install or find_tritonserver(self.install_dir)
        if self.ports is not None:
            for port in self.ports:
                check_port_free(port)
        # a private copy that records its owner: the next start removes one whose owner was killed
        self._workdir = owned_tempdir(WORKDIR_PREFIX)
        LIVE.add(self)
        try:
            repo = copy_models(self.model_repository, models, self._workdir / "models")
            self._log_file = self.log_path or self._workdir / "tritonserver.log"
            self._log_file.parent.mkdir(parents=True, exist_ok=True)
            self._spawn_args = (install, repo, models)
            self._spawn(*self._spawn_args)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, install: TritonInstall, repo: Path, models: list[str]) -> None:
        http, grpc, metrics = self.ports or free_ports(3)
        # a prefix of this server's own: the regions it leaves behind are found by it (_remove_regions)
        prefix = f"tuner{os.getpid()}_{uuid.uuid4().hex[:8]}_"
        self._server_id = prefix.rstrip("_")  # answered as the name in GET /v2: which server answers
        self._shm_prefixes.append(prefix)
        self._endpoints = Endpoints(http=f"127.0.0.1:{http}", grpc=f"127.0.0.1:{grpc}",
                                    metrics=f"http://127.0.0.1:{metrics}/metrics")
        self._http = TritonHttp(self._endpoints.http, timeout_s=CONTROL_TIMEOUT_S)
        cmd = [str(install.binary), "--model-repository", str(repo),
               "--backend-directory", str(install.backends_dir),
               "--model-control-mode", "explicit",
               "--http-address", "127.0.0.1", "--http-port", str(http),
               "--grpc-address", "127.0.0.1", "--grpc-port", str(grpc),
               "--metrics-address", "127.0.0.1", "--metrics-port", str(metrics),
               "--allow-metrics", "true", "--allow-gpu-metrics", "false", "--allow-cpu-metrics", "false",
               "--exit-timeout-secs", "5", "--id", self._server_id,
               # a unique shared-memory prefix, so servers running side by side do not collide
               f"--backend-config=python,shm-region-prefix-name={prefix}",
               *[f"--load-model={m}" for m in models if self.load_models], *self.extra_args]
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(install.lib_dir), env.get("LD_LIBRARY_PATH", "")) if p)
        env[GPU_LOCK_ENV] = str(self._workdir / "emulated-gpu.lock")
        env[MODEL_PYTHONPATH_ENV] = model_pythonpath(install, env.get(MODEL_PYTHONPATH_ENV, ""))
        env[MODEL_PYTHON_ENV] = sys.executable  # a Python for a model's own child processes (llm_vllm's vLLM)
        pin_stub_python(install, env, self._workdir / "stub-bin")
        with open(self._log_file, "ab") as log:
            self._log_start = self._log_mark = log.tell()
            self._mark_what = "the server started"
            self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          env=env, cwd=self._workdir, start_new_session=True,
                                          preexec_fn=_die_with_parent if _in_main_thread() else None)
        add_owner(self._workdir, self._proc.pid)

    def wait_ready(self, timeout_s: float | None = None) -> None:
        models = [m for m in (self._spawn_args[2] if self._spawn_args else []) if self.load_models]
        what = "starting tritonserver" + (f" and loading model {', '.join(models)}" if models else "")
        with saying(what):
            self._wait_ready(timeout_s)

    def _wait_ready(self, timeout_s: float | None) -> None:
        timeout_s = timeout_s or self.startup_timeout_s
        deadline = time.monotonic() + timeout_s
        retries = 0 if self.ports else PORT_RETRIES
        while True:
            proc, http = self._proc, self._http
            if proc is None or http is None:
                raise ServerSetupError("the local Triton server was not started")
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    break
                # ready, and ours: another server started beside ours can hold the port both were given
                # (free_ports lets go of it) and answer for ours while ours fails its bind (Triton logs
                # "Started HTTPService" before it binds, so only the answer's server id tells)
                if http.ok("v2/health/ready", timeout_s=1.0) and self._answers_as_ours(http):
                    self._watch(proc)
                    return
                time.sleep(0.2)
            else:
                raise ServerSetupError(f"tritonserver was not ready after {timeout_s:.0f} s; "
                                       f"its log: {self._kept_log()}")
            reason = self._first_error()
            if retries and "already in use" in self.logs(40).lower() and self._spawn_args:
                # another process took a port we had found free: try new ones
                retries -= 1
                self._proc = None
                self._spawn(*self._spawn_args)
                continue
            # one line: Triton's reason, and where its whole log stays (its option table and shutdown lines)
            raise ServerSetupError(f"tritonserver exited with code {proc.returncode} during startup{reason}; "
                                   f"its log: {self._kept_log()}")

    def stop(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
            watch, self._watcher = self._watcher, None
            try:
                if watch is not None:
                    watch[0].set()
                    watch[1].join()
                if proc is not None:
                    _end_group(proc)
            finally:
                # after the group is gone: a killed server (kill -9) leaves its regions in /dev/shm
                if proc is None or proc.poll() is not None:
                    self._remove_regions()
                if self._workdir is not None:
                    shutil.rmtree(self._workdir, ignore_errors=True)
                    self._workdir = None
                LIVE.discard(self)

    def is_alive(self) -> bool:
        if self._proc is None or self._proc.poll() is not None or self._http is None:
            return False
        return self._http.ok("v2/health/live", timeout_s=2.0)

    def exited(self) -> bool:
        """Whether the tritonserver process this launcher started has exited (`Launcher.exited`)."""
        return self._proc is not None and self._proc.poll() is not None

    # --- control --------------------------------------------------------------------------------

    def apply_config(self, model: str, config: ModelConfig) -> ModelConfig:
        return self._load(model, config, fresh=False)

    def _load(self, model: str, config: ModelConfig, *, fresh: bool) -> ModelConfig:
        http = self._checked()
        if not (self.repository / model).is_dir():
            raise ServerSetupError(f"model '{model}' is not in the served repository "
                                   f"(copied from {self.model_repository})")
        offset = self._log_size()
        self._log_mark, self._mark_what = offset, "this configuration was applied"
        try:
            with saying(f"loading model {model}"):
                return apply_and_verify(http, model, config, timeout_s=self.startup_timeout_s, fresh=fresh,
                                        explain_refusal=lambda msg: self._refusal(msg, offset))
        except ServerError:
            self._checked()  # a server that died during the load says so
            raise

    def apply_engine_args(self, model: str, config: ModelConfig, args: Mapping[str, object]) -> ModelConfig:
        self._checked()
        if not (self.repository / model).is_dir():
            raise ServerSetupError(f"model '{model}' is not in the served repository "
                                   f"(copied from {self.model_repository})")
        # the served copy's model.json, read by the model as it loads (unloaded first: read anew)
        engineargs.write(self.repository / model, args, user_dir=self.model_repository / model)
        return self._load(model, config, fresh=True)

    def model_config(self, model: str) -> ModelConfig:
        return self._checked().model_config(model)

    def statistics(self, model: str) -> dict:
        return self._checked().statistics(model)

    def metrics(self) -> dict[str, float]:
        http = self._checked()
        try:
            return http.metrics(self.endpoints.metrics)
        except HttpError as exc:
            raise ServerError(f"metrics at {self.endpoints.metrics}: {exc}") from None

    def logs(self, tail: int = 40) -> str:
        """The last `tail` lines the server wrote since it started or, once a configuration was
        applied, since then: a server that died without a word (kill -9) is not quoted saying what it
        said about an earlier configuration."""
        if self._log_file is None or not self._log_file.exists():
            return ""
        lines = _read_from(self._log_file, self._log_mark, max_bytes=64 * 1024)
        if not lines:
            return f"(the server wrote nothing to its log since {self._mark_what})"
        return "\n".join(lines[-tail:])

    # --- helpers --------------------------------------------------------------------------------

    def _checked(self) -> TritonHttp:
        """The HTTP client, or ServerError at once if the process is gone (no hanging on a dead port)."""
        if self._proc is None or self._http is None:
            raise ServerError("the local Triton server is not running (not started, or stopped)")
        code = self._proc.poll()
        if code is not None:
            # one line, as a failed start's: Triton's reason and where its whole log stays
            raise ServerError(f"tritonserver (pid {self._proc.pid}) exited with code {code}{self._first_error()}; "
                              f"its log: {self._kept_log()}")
        return self._http

    def _watch(self, proc: subprocess.Popen) -> None:
        """From ready until `stop`: when the server dies (during a load, a replay, anything), end what is
        left of its process group at once. The Python backend's stubs outlive a killed server for a while
        and hold its sockets (they were forked from it, the listening one too), so a pending request would
        otherwise wait out its whole timeout (a load 120 s, a replayed request 30 s) before the death is
        seen, and new connections would be taken and never answered."""
        if self._watcher is not None:  # the previous server's, if it was never stopped
            self._watcher[0].set()
        done = threading.Event()

        def watch() -> None:
            while not done.wait(WATCH_S):
                if proc.poll() is not None:
                    _end_group(proc)  # the stubs left in its process group, as `stop` ends them
                    return

        watcher = threading.Thread(target=watch, name="tritonserver-watch", daemon=True)
        watcher.start()
        self._watcher = (done, watcher)

    def _remove_regions(self) -> None:
        """Remove the shared-memory regions of the servers this launcher started, whose names begin
        with the prefix it gave each (nobody else's: the prefix holds our pid and a random part)."""
        prefixes, self._shm_prefixes = self._shm_prefixes, []
        if not prefixes:
            return
        try:
            names = os.listdir(SHM_DIR)
        except OSError:
            return
        for name in names:
            if name.startswith(tuple(prefixes)):
                with contextlib.suppress(OSError):
                    (SHM_DIR / name).unlink()

    def _answers_as_ours(self, http: TritonHttp) -> bool:
        """Whether what answers on our HTTP address names itself with our server id (`--id`)."""
        try:
            return http.get_json("v2", timeout_s=1.0).get("name") == self._server_id
        except (ServerError, HttpError):
            return False

    def _first_error(self) -> str:
        """': <the reason>' from the log since this start (`triton_reason`), or ''."""
        reason = triton_reason(_read_from(self._log_file, self._log_start) if self._log_file else [])
        return f": {reason}" if reason else ""

    def _kept_log(self) -> Path | None:
        """The server's log file, where it stays after `stop`: the `log_path` asked for, else a copy in the
        temp dir of the one in the workdir (which `stop` removes)."""
        if self._log_file is None or self.log_path is not None:
            return self._log_file
        kept = Path(tempfile.gettempdir()) / f"{KEPT_LOG_PREFIX}{self._server_id}.log"
        try:
            shutil.copyfile(self._log_file, kept)
        except OSError:
            return self._log_file
        return kept

    def _log_size(self) -> int:
        try:
            return self._log_file.stat().st_size if self._log_file else 0
        except OSError:
            return 0

    def _refusal(self, client_message: str, offset: int) -> str:
        """The server log's error lines since `offset` (the client sees only a generic message)."""
        time.sleep(0.1)  # the log line may trail the HTTP answer
        lines = _read_from(self._log_file, offset) if self._log_file else []
        errors = [line for line in lines if line[:1] == "E" or "error" in line.lower()]
        return (errors[-1].split("] ", 1)[-1] if errors else client_message).strip()


@contextlib.contextmanager
def saying(what: str) -> Iterator[None]:
    """While the block runs, `tuner: <what>: N s` on stderr every `PROGRESS_S` (a model that loads for
    a minute otherwise leaves the terminal silent); nothing for a block that ends sooner."""
    from tqdm import tqdm  # its write keeps a progress bar on the terminal intact

    done, started = threading.Event(), time.monotonic()

    def say() -> None:
        while not done.wait(PROGRESS_S):
            tqdm.write(f"tuner: {what}: {time.monotonic() - started:.0f} s", file=sys.stderr)

    thread = threading.Thread(target=say, name="tritonserver-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


# --- process plumbing ------------------------------------------------------------------------------


def _end_group(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group, SIGKILL it after a grace period (also if interrupted)."""
    pgid = proc.pid  # start_new_session: the group id is the server's pid
    try:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STOP_GRACE_S)
    finally:
        # Also reaps the Python backend stubs, which can outlive a killed server for a while.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _die_with_parent() -> None:
    """In the child: SIGTERM if the process that started us dies (no orphan after a kill -9 of pytest).

    Only used from the main thread: the kernel ties this to the starting *thread*'s exit.
    """
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _read_from(path: Path, offset: int, *, max_bytes: int | None = None) -> list[str]:
    """The log's lines from byte `offset` on (only the last `max_bytes` of them when given)."""
    try:
        with open(path, "rb") as fh:
            if max_bytes is not None:
                offset = max(offset, fh.seek(0, os.SEEK_END) - max_bytes)
            fh.seek(offset)
            return fh.read().decode(errors="replace").splitlines()
    except OSError:
        return []
