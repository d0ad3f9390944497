"""Server control (a leaf): one launcher per way to get a Triton, behind `base.Launcher`.

    make_launcher(settings, log_dir=None) -> Launcher    local | docker | remote, from the study YAML
    LocalLauncher, RemoteLauncher, find_tritonserver    the pieces, for use without a study
    check_triton(url)                                   Triton's HTTP endpoint answers at url, or ServerSetupError
    exit_watch(launcher, model, then=None)              a replay's watch: ended at once when the server exited
"""

from __future__ import annotations

from pathlib import Path

from tuner.errors import ServerSetupError
from tuner.server.base import Endpoints, Launcher, exit_watch
from tuner.server.install import TritonInstall, find_tritonserver
from tuner.server.local import LocalLauncher
from tuner.server.remote import RemoteLauncher, check_triton

__all__ = ["Endpoints", "Launcher", "LocalLauncher", "RemoteLauncher", "TritonInstall", "check_triton",
           "exit_watch", "find_tritonserver", "make_launcher"]


def make_launcher(settings, log_dir: str | Path | None = None, read_only: bool = False, *,
                  load_models: bool = True) -> Launcher:
    """The launcher a study's `server:` section asks for (`settings` is a tuner.settings.StudySettings).
    `read_only`: a remote server is only measured, never reconfigured. `load_models=False`: a server
    this launcher starts loads no model until asked (the caller's first step loads it with files of its
    own: a vLLM model's engine arguments); a remote server is already running its models."""
    server = settings.server
    models = [settings.model]
    if server.launcher == "local":
        log_path = Path(log_dir) / "tritonserver.log" if log_dir else None
        return LocalLauncher(settings.model_repository, models=models, install_dir=server.install_dir,
                             log_path=log_path, startup_timeout_s=server.startup_timeout_s,
                             extra_args=server.extra_args, load_models=load_models)
    if server.launcher == "remote":
        if not server.url:
            raise ServerSetupError(f"{settings.source or '<study>'}: server.url: required when server.launcher is remote")
        # the originals it changes are kept where the study's next run looks: its output directory
        return RemoteLauncher(server.url, grpc_url=server.grpc_url, metrics_url=server.metrics_url, models=models,
                              read_only=read_only, model_repository=settings.model_repository or None,
                              originals_dir=Path(settings.output) / "server",
                              check_grpc=settings.replay.protocol == "grpc")
    if server.launcher == "docker":
        from tuner.server.docker import DockerLauncher  # the docker SDK loads only for this launcher

        return DockerLauncher(server, settings.model_repository, models, log_dir=log_dir, load_models=load_models)
    raise ServerSetupError(f"{settings.source or '<study>'}: server.launcher: unknown launcher '{server.launcher}'")
