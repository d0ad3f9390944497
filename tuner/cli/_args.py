"""What several commands declare alike: their parsers, and the arguments they share, each declared once."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from typing import NamedTuple

Run = Callable[[argparse.Namespace], int]

OUTPUT_DIR_HELP = "output directory (default: the study's output)"


def add_command(
    subparsers: argparse._SubParsersAction, name: str, *, run: Run, help: str, description: str | None = None
) -> argparse.ArgumentParser:
    """The parser of command `name`, which calls `run(args)`."""
    parser = subparsers.add_parser(name, help=help, description=description)
    parser.set_defaults(func=run)
    return parser


def add_group(
    subparsers: argparse._SubParsersAction, name: str, *, help: str, description: str,
    metavar: str = "COMMAND",
) -> argparse._SubParsersAction:
    """A command group `name`; its subcommands go under what it returns, and alone it prints its help."""
    parser = subparsers.add_parser(name, help=help, description=description)
    parser.set_defaults(func=lambda args: _usage(parser))
    return parser.add_subparsers(dest=f"{name}_command", metavar=metavar)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2  # a group without its subcommand is bad usage, as argparse's own errors are


def add_study(parser: argparse.ArgumentParser, help: str, *, optional: bool = False) -> None:
    """The STUDY.yaml positional, as `args.study`."""
    parser.add_argument("study", nargs="?" if optional else None, metavar="STUDY.yaml", help=help)


def add_tune_output(parser: argparse.ArgumentParser, help: str, *, optional: bool = False) -> None:
    """The OUTPUT_DIR positional, a directory `tuner tune` wrote, as `args.output_dir`."""
    parser.add_argument("output_dir", nargs="?" if optional else None, metavar="OUTPUT_DIR", help=help)


def add_storage(parser: argparse.ArgumentParser, help: str) -> None:
    """`--storage URL`: an Optuna storage."""
    parser.add_argument("--storage", metavar="URL", help=help)


def add_output_dir(parser: argparse.ArgumentParser, *, note: str | None = None) -> None:
    """`--output DIR`: where a study's outputs go instead of its `output`; `note` adds to the help."""
    help = f"{OUTPUT_DIR_HELP}; {note}" if note else OUTPUT_DIR_HELP
    parser.add_argument("--output", metavar="DIR", help=help)


def add_output_file(
    parser: argparse.ArgumentParser, *, metavar: str | None = None, help: str | None = None,
    required: bool = False,
) -> None:
    """`-o/--output`: the one file a command writes."""
    parser.add_argument("-o", "--output", required=required, metavar=metavar, help=help)


def add_json(parser: argparse.ArgumentParser, what: str) -> None:
    """`--json OUT`: also write `what` as JSON."""
    parser.add_argument("--json", metavar="OUT", help=f"also write {what} as JSON to OUT")


def add_assignments(parser: argparse.ArgumentParser, help: str, *, required: bool = False) -> None:
    """`--set KEY=VALUE`, repeatable: config fields to change, as `args.assignments`."""
    # Where it is optional, none given is an empty list: the command need not check for None.
    parser.add_argument("--set", dest="assignments", action="append", required=required,
                        default=None if required else [], metavar="KEY=VALUE", help=help)


def add_flag(parser: argparse.ArgumentParser, flag: str, help: str) -> None:
    """An option that is off unless given."""
    parser.add_argument(flag, action="store_true", help=help)


def add_quiet(parser: argparse.ArgumentParser, *, help: str = "no progress bars") -> None:
    """`--quiet`: no progress bars on stderr."""
    add_flag(parser, "--quiet", help)


class Number(NamedTuple):
    """A numeric option, `flag METAVAR`, that is `default` when not given."""

    flag: str
    metavar: str
    help: str
    default: float | None = None

    @property
    def dest(self) -> str:
        """The option's name on the parsed arguments."""
        return self.flag.removeprefix("--").replace("-", "_")


def add_numbers(
    parser: argparse.ArgumentParser, numbers: Iterable[Number], *, type: Callable[[str], float] = float
) -> None:
    """Declare `numbers`, in order, each read with `type`."""
    for number in numbers:
        parser.add_argument(number.flag, type=type, default=number.default, metavar=number.metavar,
                            help=number.help)
