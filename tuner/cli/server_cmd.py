"""`tuner server install`: fetch the tritonserver binary the local launcher runs."""

from __future__ import annotations

import argparse

from tuner.cli._args import add_command, add_group, add_output_dir


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `tuner server install` to `subparsers`."""
    commands = add_group(
        subparsers, "server", help="manage the local Triton server binary",
        description="The tritonserver binary the local launcher runs (from the nvidia-pytriton wheel, "
        "installed outside the project's environment).")
    install = add_command(
        commands, "install", run=_install,
        help="install tritonserver (nvidia-pytriton wheel) for the local launcher, if absent",
        description="Install the tritonserver binary bundled in the nvidia-pytriton wheel into DIR "
        "(default: $TUNER_TRITON_HOME, else $XDG_CACHE_HOME/tuner/triton/..., else ~/.cache/tuner/triton/...), outside the project's environment, "
        "and print where it is.")
    add_output_dir(install, flag="--dir", label="install directory {path}",
                   help="install directory (default: $TUNER_TRITON_HOME, else the user cache)")


def _install(args: argparse.Namespace) -> int:
    from tuner.server.install import find_tritonserver  # imported when it runs: `tuner --help` starts fast

    found = find_tritonserver(args.dir)
    print(f"tritonserver {found.version}: {found.binary}")
    print(f"backends:    {found.backends_dir} (Python {found.python_version} stub)")
    print(f"libraries:   {found.lib_dir}")
    print(f"model numpy: {found.model_pythonpath}")
    return 0
