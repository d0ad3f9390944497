"""The `tuner` command line: argument parsing and printing only.

Each command group lives in its own module here and exposes `register(subparsers)`; every command
sets `func(args) -> int`. The library does the work; errors become one line and an exit code.
A command module imports the library where its command runs, not at its top: every command's parser
is built for `tuner --help`, which must start without pandas, scipy, optuna or plotly
(tests/test_cli_imports.py). The
paths a command line names are checked (tuner/cli/_args.py: check_paths) before the command runs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from tuner import __version__
from tuner.cli._args import Parser, check_paths, refuse_bad_usage
from tuner.errors import Terminated, TunerError, sigterm_as_interrupt

# Command-group modules, in the order `tuner --help` lists them (one that fails to import is an error).
COMMAND_MODULES = (
    "tuner.cli.tune_cmd",
    "tuner.cli.finish_cmd",
    "tuner.cli.replay_cmd",
    "tuner.cli.export_cmd",
    "tuner.cli.report_cmd",
    "tuner.cli.traffic_cmd",
    "tuner.cli.config_cmd",
    "tuner.cli.server_cmd",
    "tuner.cli.nightly_cmd",
    "tuner.cli.audit_cmd",
    "tuner.cli.exporter_cmd",
    "tuner.cli.profile_cmd",
    "tuner.cli.simulate_cmd",
    "tuner.cli.soak_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    """The `tuner` argument parser, every command group registered on it."""
    parser = Parser(
        prog="tuner",
        description="Find the Triton configuration (dynamic batching, or a vLLM model's engine knobs) that "
        "serves recorded traffic at the highest throughput per dollar under a latency SLA.",
    )
    parser.add_argument("--version", action="version", version=f"tuner {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the `tuner` command in `argv` (default: sys.argv); its exit code (an error: one line on stderr)."""
    parser = build_parser()
    # not parse_args: it refuses what a subcommand did not take as `tuner`'s (`see tuner --help`)
    args, extras = parser.parse_known_args(argv)
    if args.command is None and not extras:
        # bad usage, as argparse's errors are: on stderr, exit 2 (`tuner --help` is stdout and exit 0)
        parser.print_help(sys.stderr)
        return 2
    refuse_bad_usage(parser, args, extras)
    try:
        with sigterm_as_interrupt():
            check_paths(parser, args)
            return int(args.func(args) or 0)
    except TunerError as exc:
        print(f"tuner: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Terminated:
        print(f"tuner: terminated (SIGTERM){_resume(args)}", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print(f"tuner: interrupted{_resume(args)}", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader of the output went away (`| head`): stop without a word, as a Unix tool does; stdout
        # goes to /dev/null so that the interpreter's last flush does not raise it again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool the signal ended


def _resume(args: argparse.Namespace) -> str:
    """What the Ctrl-C and SIGTERM messages add: how to resume, for a command that does (`resumable`)."""
    return "; run the same command again to resume" if getattr(args, "resumable", False) else ""


if __name__ == "__main__":
    sys.exit(main())
