"""Attach to a Triton server someone else runs; change only what a trial needs and put it back.

The server must run in explicit model-control mode (`--model-control-mode=explicit`): configurations
are applied with the repository load API and a config override. `start()` records each model's
configuration; `stop()` reloads the models it changed with that original configuration, reads it back
and leaves the server running. A `read_only` one (for `tuner audit`) changes nothing and works in any
control mode.

A run killed before its `stop()` leaves the server with a trial's configuration, which the next run
would take for the original: so before a model's first trial configuration is loaded, its original is
kept in `originals_dir` (the study's output directory's `server/`), removed once restored; a start that
finds one left restores the server to it first, and says so in one line.

`check_triton(url)` refuses, in one line, a URL where nothing answers, or where something other than
Triton's HTTP endpoint does (its metrics or gRPC port, another web server). `check_remote(url, models)`
adds what a study needs of the server (explicit model control, its models loaded and ready): `start()`
and `tuner tune --check` call it alike, so a server the run would refuse is refused before anything is
written. Its refusals are bad input (ServerSetupError) only until the server was found ready: a later
start that fails (after a crash, for the re-measurement) is a ServerError.
"""

from __future__ import annotations

import json
import re
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from tqdm import tqdm

from tuner import modelconfig
from tuner.errors import ConfigError, InputError, OutputError, ServerError, ServerSetupError
from tuner.files import read_json_object, write_atomic
from tuner.llm import engineargs
from tuner.modelconfig import ModelConfig
from tuner.server.base import Endpoints, Launcher
from tuner.server.client import HttpError, NotTritonError, TritonHttp, apply_and_verify
from tuner.settings import parse_host_port

CONTROL_TIMEOUT_S = 5.0
LOAD_TIMEOUT_S = 300.0
# Triton's answer to a load/unload when model control is not explicit
_NOT_EXPLICIT = "explicit model load / unload is not allowed"
# (address, models) a launcher of this process found ready: one that fails a later start (a crash's restart,
# the re-measurement's session) died or changed during the work, a ServerError (exit 1), not bad input
_REACHED: set[tuple[str, tuple[str, ...]]] = set()


def check_triton(url: str, *, where: str = "server.url") -> None:
    """Refuse `url` unless Triton's HTTP endpoint answers there: ServerSetupError in one line naming
    the URL and what answered (or that nothing did). `where` names the key or flag of a malformed URL."""
    host, port = parse_host_port(url, where=where, error=ServerSetupError)
    _check_endpoint(TritonHttp(f"{host}:{port}", timeout_s=CONTROL_TIMEOUT_S), url)


def check_remote(url: str, models: Sequence[str] = (), *, read_only: bool = False, where: str = "server.url") -> None:
    """Everything the remote launcher's start needs of the server at `url`, checked before anything
    changes: Triton's HTTP endpoint answers (`check_triton`), in explicit model-control mode unless
    `read_only`, each of `models` loaded and ready. ServerSetupError in one line otherwise."""
    host, port = parse_host_port(url, where=where, error=ServerSetupError)
    http = TritonHttp(f"{host}:{port}", timeout_s=CONTROL_TIMEOUT_S)
    _check_endpoint(http, url)
    if not read_only:
        _check_explicit_mode(http, url)
    for model in models:
        if not http.ok(f"v2/models/{model}/ready", timeout_s=CONTROL_TIMEOUT_S):
            raise ServerSetupError(f"model '{model}' is not loaded and ready on the server at {url}")


def _check_grpc_port(address: str, url: str) -> None:
    """The gRPC endpoint a gRPC replay sends to accepts a connection: a wrong port fails before any
    replay, in one line, not as a window of refused requests."""
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=CONTROL_TIMEOUT_S).close()
    except OSError as exc:
        raise ServerSetupError(f"no gRPC endpoint answers at {address} ({exc.strerror or exc}), where a replay with "
                               f"replay.protocol grpc sends to the server at {url}: the HTTP port + 1 unless "
                               f"server.grpc_url names it") from None


def _check_explicit_mode(http: TritonHttp, url: str) -> None:
    """Unloading a model that does not exist is harmless, and refused unless control is explicit."""
    try:
        http.post_json("v2/repository/models/__tuner_probe_no_such_model__/unload", {})
    except HttpError as exc:
        if _NOT_EXPLICIT in exc.message:
            raise ServerSetupError(
                f"the Triton server at {url} does not run in explicit model-control mode; "
                "start it with --model-control-mode=explicit so configurations can be loaded") from None


def _check_endpoint(http: TritonHttp, url: str) -> None:
    """GET /v2, Triton's server metadata, must be a JSON object naming the server and its version:
    Triton's metrics port answers any path with an empty 200, its gRPC port in HTTP/2."""
    try:
        meta = http.get_json("v2")
    except NotTritonError as exc:
        raise ServerSetupError(f"{url} answers but is not Triton's HTTP endpoint ({exc.call}: {exc.what})") from None
    except HttpError as exc:
        raise ServerSetupError(f"{url} answers but is not Triton's HTTP endpoint (GET /v2: HTTP {exc.status}: "
                               f"{_short(exc.message)})") from None
    except ServerError as exc:
        raise ServerSetupError(f"cannot reach a Triton server at {url}: {exc}") from None
    missing = [key for key in ("name", "version") if not isinstance(meta.get(key), str)]
    if missing:
        raise ServerSetupError(f"{url} answers but is not Triton's HTTP endpoint (GET /v2: a JSON object "
                               f"without {' or '.join(repr(k) for k in missing)})")


def _short(text: str, limit: int = 60) -> str:
    text = " ".join(str(text).split())  # one line, whatever the answer held
    return text if len(text) <= limit else text[:limit] + "..."


class RemoteLauncher(Launcher):
    """A Triton server someone else runs, attached by URL; what a trial changed is put back."""

    name = "remote"

    def __init__(self, url: str, grpc_url: str | None = None, models: Sequence[str] = (),
                 *,
                 metrics_url: str | None = None, load_timeout_s: float = LOAD_TIMEOUT_S,
                 read_only: bool = False, model_repository: str | Path | None = None,
                 originals_dir: str | Path | None = None, check_grpc: bool = False):
        host, port = parse_host_port(url, where="server.url", error=ServerSetupError)
        if grpc_url:
            grpc = "{}:{}".format(*parse_host_port(grpc_url, where="server.grpc_url", schemes=("grpc",),
                                                   error=ServerSetupError))
        else:
            grpc = f"{host}:{port + 1}"
        self.url = url
        self.check_grpc = check_grpc  # the replay sends by gRPC: its endpoint must answer too
        self._endpoints = Endpoints(
            http=f"{host}:{port}",
            grpc=grpc,
            metrics=metrics_url or f"http://{host}:{port + 2}/metrics",
        )
        self.models = list(models)
        self.load_timeout_s = load_timeout_s
        self._http = TritonHttp(self._endpoints.http, timeout_s=CONTROL_TIMEOUT_S)
        self._originals: dict[str, ModelConfig] = {}
        self._changed: set[str] = set()
        self._started = False
        self.read_only = read_only
        # the user's local copy of the served models: a trial's engine arguments go with its version
        # directory's other files (a Python-backend model's code), which the server's own are replaced by
        self.model_repository = Path(model_repository) if model_repository else None
        # where each changed model's original is kept until restored: the next run finds a killed one's
        self.originals_dir = Path(originals_dir) if originals_dir is not None and not read_only else None

    @property
    def endpoints(self) -> Endpoints:
        return self._endpoints

    def start(self) -> None:
        if self._started:
            return
        try:
            check_remote(self.url, self.models, read_only=self.read_only)
            for model in self.models:
                original = self._recover(model)
                self._originals[model] = original if original is not None else self._http.model_config(model)
        except ServerSetupError as exc:
            raise self._failure(exc) from None
        if self.check_grpc:  # the study's endpoint, not a server that failed since it was reached: as it is
            _check_grpc_port(self._endpoints.grpc, self.url)
        self._started = True

    def wait_ready(self, timeout_s: float | None = None) -> None:
        if not self._http.ok("v2/health/ready", timeout_s=min(timeout_s or CONTROL_TIMEOUT_S, CONTROL_TIMEOUT_S)):
            raise self._failure(ServerSetupError(f"the Triton server at {self.url} is not ready"))
        _REACHED.add(self._attachment)

    @property
    def _attachment(self) -> tuple[str, tuple[str, ...]]:
        return self._endpoints.http, tuple(sorted(self.models))

    def _failure(self, exc: ServerSetupError) -> ServerSetupError | ServerError:
        """`exc` as said at the first start; a server this process found ready before has failed since."""
        if self._attachment not in _REACHED:
            return exc
        return ServerError(f"the Triton server at {self.url} was ready earlier in this run and failed since: {exc}")

    def apply_config(self, model: str, config: ModelConfig) -> ModelConfig:
        if self.read_only:
            raise ServerSetupError(f"the server at {self.url} is attached read-only: its configuration is not changed")
        self._keep(model)
        return apply_and_verify(self._http, model, config, timeout_s=self.load_timeout_s,
                                explain_refusal=lambda msg: f"{msg} (the reason is in the server's log)")

    def apply_engine_args(self, model: str, config: ModelConfig, args: Mapping[str, object]) -> ModelConfig:
        """Triton's load API with file overrides: the model is loaded from `config` and the files sent
        (the version directory of the local copy, `model_repository`, with `args` as its model.json;
        only the model.json without one: NVIDIA's vllm backend needs no other file). `stop()` loads
        the original configuration without overrides, from the server's own repository."""
        if self.read_only:
            raise ServerSetupError(f"the server at {self.url} is attached read-only: its configuration is not changed")
        local = self.model_repository / model if self.model_repository else None
        files = engineargs.version_files(local if local and local.is_dir() else None, args)
        self._keep(model)
        return apply_and_verify(self._http, model, config, timeout_s=self.load_timeout_s, files=files, fresh=True,
                                explain_refusal=lambda msg: f"{msg} (the reason is in the server's log)")

    def model_config(self, model: str) -> ModelConfig:
        return self._http.model_config(model)

    def statistics(self, model: str) -> dict:
        return self._http.statistics(model)

    def metrics(self) -> dict[str, float]:
        try:
            return self._http.metrics(self._endpoints.metrics)
        except HttpError as exc:
            raise ServerError(f"metrics at {self._endpoints.metrics}: {exc}") from None

    def logs(self, tail: int = 40) -> str:
        return ""  # not our process: its log is wherever its owner put it

    def is_alive(self) -> bool:
        return self._http.ok("v2/health/live", timeout_s=2.0)

    def exited(self) -> bool:
        """Always False (`Launcher.exited`): a server we do not own cannot be known dead for sure (a
        refused connection may be a restart, a slow answer a busy server), so its replay runs to its end."""
        return False

    @property
    def stopping(self) -> str:
        """What an interrupt says this launcher does as it ends: a read-only one (the audit) changed nothing."""
        if self.read_only:
            return "leaving the server as it is (nothing was changed)"
        return "reloading the models tuner changed with their own configuration (the server keeps running)"

    def stop(self) -> None:
        """Reload every model we changed with its original configuration as the override (a load without
        one may keep serving the last override), read back equal; its kept copy is removed then, and
        left for the next run otherwise (the server keeps running)."""
        failures = []
        for model in sorted(self._changed):
            try:
                self._http.load(model, self._originals[model], timeout_s=self.load_timeout_s)
                running = self._http.model_config(model)
            except (HttpError, ServerError, ServerSetupError) as exc:
                failures.append(f"{model}: {exc}{self._left(model)}")
                continue
            if running != self._originals[model]:
                failures.append(f"{model}: reloaded, but the server runs "
                                f"{_fields(self._originals[model], running)}{self._left(model)}")
                continue
            self._forget(model)
        self._changed.clear()
        self._started = False
        if failures:
            raise ServerError(f"could not restore the original configuration on {self.url}: {'; '.join(failures)}")

    # --- the originals kept on disk while a trial's configuration may run ------------------------

    def _kept(self, model: str) -> Path | None:
        if self.originals_dir is None:
            return None
        address = re.sub(r"[^\w.-]", "_", self._endpoints.http)  # host:port, [::1]:port: one file name
        return self.originals_dir / f"remote-original-{model}-{address}.json"

    def _keep(self, model: str) -> None:
        """Record `model`'s original before a trial's configuration replaces it (for `stop()`), and keep
        it on disk before the first one (for the next run, if this one is killed before `stop()`)."""
        if model not in self._originals:
            self._originals[model] = self._http.model_config(model)
        path = self._kept(model)
        if model not in self._changed and path is not None:
            record = {"url": self.url, "model": model,
                      "config": json.loads(modelconfig.to_json(self._originals[model]))}
            write_atomic(path, json.dumps(record, indent=1) + "\n", error=OutputError,
                         label=f"{path} (the original configuration of '{model}' on {self.url})")
        self._changed.add(model)

    def _forget(self, model: str) -> None:
        path = self._kept(model)
        if path is not None:
            path.unlink(missing_ok=True)

    def _left(self, model: str) -> str:
        path = self._kept(model)
        return f" (its original is kept in {path}: the next run restores it)" if path and path.exists() else ""

    def _recover(self, model: str) -> ModelConfig | None:
        """The original an interrupted run kept for `model`, loaded again (as the override: a load without
        one may keep serving a trial's) and read back equal, with one line saying so; None without one."""
        path = self._kept(model)
        if path is None or not path.exists():
            return None
        label = f"{path} (the original configuration of '{model}' on {self.url}, kept by an interrupted run)"
        fix = f"check the server's configuration of '{model}', then remove the file"
        try:
            kept = read_json_object(path, label=label, error=InputError).get("config")
        except InputError as exc:
            raise InputError(f"{exc}; {fix}") from None
        try:
            original = modelconfig.from_json(kept) if isinstance(kept, dict) else None
        except ConfigError as exc:
            raise InputError(f"{label}: {exc}; {fix}") from None
        if original is None:
            raise InputError(f"{label}: holds no 'config' object; {fix}")
        running = self._http.model_config(model)
        if running != original:
            try:
                self._http.load(model, original, timeout_s=self.load_timeout_s)
            except HttpError as exc:
                raise ServerSetupError(f"{label}: Triton refused to load it again: {exc.message}") from None
            restored = self._http.model_config(model)
            if restored != original:
                raise ServerSetupError(f"{label}: loaded again, but the server runs {_fields(original, restored)}")
            said = (f"ran a configuration an interrupted run left ({_fields(original, running)}): restored its "
                    f"original, kept in {path}")
        else:
            said = f"runs its original configuration, which an interrupted run kept in {path}"
        tqdm.write(f"tuner: '{model}' on {self.url} {said}", file=sys.stderr)  # clear of a progress bar
        path.unlink(missing_ok=True)
        return original


def _fields(original: ModelConfig, running: ModelConfig, shown: int = 3) -> str:
    """What `running` holds other than `original`, in a few `field: old -> new`."""
    changes = modelconfig.changed_fields(original, running)
    more = f" and {len(changes) - shown} more" if len(changes) > shown else ""
    return "; ".join(changes[:shown]) + more
