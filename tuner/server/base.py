"""The one interface every way of getting a Triton implements (local process, docker, remote URL).

A launcher is a context manager: `with launcher: ...` starts it and waits until it is ready, and
always stops it. Implementations: `local.LocalLauncher`, `remote.RemoteLauncher`,
`docker.DockerLauncher`. The same contract tests run against each (tests/server/contract.py).
`exit_watch(launcher, model)`: the watch every replay against a launcher runs with, which ends it at
once when the server has exited.
"""

from __future__ import annotations

import abc
import atexit
import contextlib
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tuner import modelconfig
from tuner.errors import ServerError, ServerSetupError
from tuner.modelconfig import ModelConfig


@dataclass(frozen=True)
class Endpoints:
    """Where the server listens; all on loopback. `http` and `grpc` are `host:port` (no scheme)."""

    http: str
    grpc: str
    metrics: str  # full URL of the Prometheus endpoint, e.g. http://127.0.0.1:8002/metrics


class Launcher(abc.ABC):
    """Start or attach to a Triton server and drive one model's configuration on it."""

    name: str = "launcher"

    @property
    @abc.abstractmethod
    def endpoints(self) -> Endpoints:
        """Valid once started."""

    @abc.abstractmethod
    def start(self) -> None:
        """Start (or attach to) the server. Raises ServerSetupError with the log tail on failure."""

    @abc.abstractmethod
    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Block until the server answers ready (within `timeout_s`, default the launcher's startup
        timeout); ServerSetupError (quoting the log tail) otherwise."""

    @abc.abstractmethod
    def apply_config(self, model: str, config: ModelConfig) -> ModelConfig:
        """Load `model` with `config` as an override, read the config back from the server and
        raise ServerSetupError if any field asked for differs. Returns the config the server runs."""

    @abc.abstractmethod
    def apply_engine_args(self, model: str, config: ModelConfig, args: Mapping[str, object]) -> ModelConfig:
        """Load a vLLM-backend `model` with `config` and the engine arguments `args` as its
        `model.json` (a trial's, `tuner.space.apply_engine`), never touching the user's own files:
        a launcher that serves a copy writes it there (`tuner.llm.engineargs.write`) and reloads the
        model with `config` as the override; a remote server gets the version directory as the load
        request's file overrides. Returns the config the server runs (as `apply_config`)."""

    @abc.abstractmethod
    def model_config(self, model: str) -> ModelConfig:
        """The configuration the server is running for `model` now."""

    @abc.abstractmethod
    def statistics(self, model: str) -> dict:
        """The model's entry of `v2/models/<model>/stats` (counts, inference_stats, batch_stats)."""

    @abc.abstractmethod
    def metrics(self) -> dict[str, float]:
        """Prometheus metrics summed by name (e.g. nv_inference_count) for the whole server."""

    @abc.abstractmethod
    def logs(self, tail: int = 40) -> str:
        """The last `tail` lines of the server log (empty for a server we do not own); the local
        launcher's only those written since the last `apply_config` (or the start), so that a server
        killed without a word is not quoted with an earlier configuration's lines."""

    @abc.abstractmethod
    def is_alive(self) -> bool:
        """False once the server process/container is gone or no longer answers."""

    @abc.abstractmethod
    def exited(self) -> bool:
        """True only when the server this launcher started is certainly gone: its process exited, its
        container no longer runs. Told without asking the server anything (a loaded server may answer
        slowly, and a slow answer is no death), so a replay may ask it every second and end at once
        (`exit_watch`). False before the start and after `stop`, and always for a server we do not own,
        whose death cannot be told for sure. Not `is_alive`'s question (does it run and answer?)."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop what we started (and restore what we changed); safe to call twice."""

    def __enter__(self) -> Launcher:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    # what `stop` does, said when Ctrl-C ends the block: a server's shutdown takes seconds (Triton's exit
    # timeout, a container's stop), and a silent wait after Ctrl-C reads as a hang
    stopping = "stopping the server"

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            print(f"tuner: interrupted: {self.stopping} ...", file=sys.stderr, flush=True)
        self.stop()


Watch = Callable[[float], bool]  # a replay's `watch`: seconds since its start -> stop now?


def exit_watch(launcher: Launcher, model: str, *, then: Watch | None = None) -> Watch:
    """A replay's `watch` (`tuner.replay.replay(watch=...)`) that ends it as soon as the server has
    `exited`, raising the launcher's own error (how it exited, where its log is), rather than sending
    the rest of the schedule to a dead port; otherwise `then`'s answer (a caller's own watch, the
    warm-up's), or go on. Raised, not a stop: a caller reading a stop as its own (the warm-up: settled)
    must not read a dead server so."""

    def watch(elapsed: float) -> bool:
        if launcher.exited():
            # the launcher's account of a server that is gone: what its next call raises at once
            launcher.statistics(model)
            raise ServerError(f"the Triton server ({launcher.name}) exited during the replay")
        return then(elapsed) if then is not None else False

    return watch


# Launchers started by this process and not yet stopped: stopped at interpreter exit even when the
# caller forgot the context manager (a crash that escapes every `with`).
LIVE: set[Launcher] = set()


@atexit.register
def _stop_all() -> None:
    for launcher in list(LIVE):
        with contextlib.suppress(Exception):
            launcher.stop()


def triton_reason(lines: Iterable[str]) -> str:
    """Why Triton stopped, from its log's `lines`: its last own error line (`E1205 ...] Poll failed for
    model directory ...`), which its closing `error: creating server: ... failed to load all models`
    only sums up, without the prefix; an option it does not know, said before its usage text; else the
    last line that says error (it prints its usage text before the reason); "" when none does. One rule for every launcher's one-line failure."""
    lines = list(lines)
    # an option it does not know: said first (`tritonserver: unrecognized option '--x'`), then the usage
    # text, whose lines mention errors of other options
    unknown = [line.strip() for line in lines if "unrecognized option" in line or "option requires an argument" in line]
    if unknown:
        return unknown[0]
    # a CPU-only host logs "CudaDriverHelper has not been initialized" as an error at every start: never
    # the reason (a server killed without a word was quoted saying it)
    lines = [line for line in lines if "CudaDriverHelper" not in line]
    own = [line.strip() for line in lines if re.match(r"E\d{4} ", line)]
    errors = own[-1:] or [line.strip() for line in lines if line.startswith("E") or "error" in line.lower()][-1:]
    return errors[0].split("] ", 1)[-1] if errors else ""


def check_repository(repository: Path, models: Sequence[str] | None) -> list[str]:
    """The models to serve (all of the repository's when none are named); ServerSetupError if absent."""
    if not repository.is_dir():
        raise ServerSetupError(f"{repository}: model repository not found")
    present = sorted(p.name for p in repository.iterdir() if p.is_dir() and not p.name.startswith("."))
    wanted = list(models) if models is not None else present
    missing = [m for m in wanted if m not in present]
    if missing:
        raise ServerSetupError(f"{repository}: no model named {', '.join(repr(m) for m in missing)} "
                               f"(the repository has: {', '.join(present) or 'nothing'})")
    if not wanted:
        raise ServerSetupError(f"{repository}: the model repository holds no models")
    for model in wanted:  # what Triton would refuse at its start, said in one line now
        modelconfig.check_model_dir(repository / model)
    return wanted


def copy_models(repository: Path, models: Sequence[str], target: Path) -> Path:
    """A private copy of `models` under `target` (the server never sees the user's files); files
    over 1 MiB are hard-linked where the file system allows (the copy is only read)."""

    def link_or_copy(src: str, dst: str) -> None:
        if os.path.getsize(src) > 1 << 20:
            try:
                os.link(src, dst)
                return
            except OSError:
                pass
        shutil.copy2(src, dst)

    try:
        for model in models:
            shutil.copytree(repository / model, target / model, copy_function=link_or_copy, symlinks=False)
    except (OSError, shutil.Error) as exc:
        raise ServerSetupError(f"{repository}: cannot copy the model repository: {exc}") from None
    return target
