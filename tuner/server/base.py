"""The one interface every way of getting a Triton implements (local process, docker, remote URL).

A launcher is a context manager: `with launcher: ...` starts it and waits until it is ready, and
always stops it. Implementations: `local.LocalLauncher`, `remote.RemoteLauncher`,
`docker.DockerLauncher`. The same contract tests run against each (tests/server/contract.py).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

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
    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Block until the server answers ready; ServerSetupError (quoting the log tail) otherwise."""

    @abc.abstractmethod
    def apply_config(self, model: str, config: ModelConfig) -> ModelConfig:
        """Load `model` with `config` as an override, read the config back from the server and
        raise ServerSetupError if any field asked for differs. Returns the config the server runs."""

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
        """The last `tail` lines of the server log (empty for a server we do not own)."""

    @abc.abstractmethod
    def is_alive(self) -> bool:
        """False once the server process/container is gone or no longer answers."""

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

    def __exit__(self, *exc) -> None:
        self.stop()
