"""What several commands declare alike: their parsers, and the arguments they share, each declared once.

A path a person gives is declared with a `PathArg` type (`add_study`, `add_output_file`, `add_input`,
...): parsing refuses only an empty path, and `check_paths` (run by tuner.cli.main once the command
line parses, before the command starts) checks each with tuner.paths, outputs first: a name too long,
a symbolic-link loop, a directory where a file is expected or the reverse, a place that takes no new
file are one line and exit 2 before any work. Parsing itself touches no file.
"""

from __future__ import annotations

import argparse
import math
import sys
import typing
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from tuner import paths
from tuner.errors import OutputError, did_you_mean, nearest

Run = Callable[[argparse.Namespace], int]

OUTPUT_DIR_HELP = "output directory (default: the study's output)"


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (`tuner: error: ...`) and exit 2, as every other
    error of tuner is; its subcommands' parsers are of this class too. An option is taken only by its
    whole name: a prefix (`--spe` for `--speed`) would change meaning in a script the day an option
    sharing it is added, and a misspelt option is told its nearest name instead."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._given: list[str] = []

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, keeping the arguments given this parser (a subcommand's parser is given its own
        by argparse) for `error` to name a misspelt option among them."""
        self._given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> typing.NoReturn:
        """Print `message` in one line with where to find the usage, and exit 2. A required argument
        missing beside an option this parser does not know is most likely that option misspelt
        (`config set X --sett a=1`): the option is named, with its nearest, instead."""
        if message.startswith("the following arguments are required"):
            given = self._given[:self._given.index("--")] if "--" in self._given else self._given
            unknown = [a for a in given if _is_option(self, a) and not _takes(self, a)]
            if unknown:
                message = _unrecognized(self, unknown)
        self.exit(2, f"tuner: error: {message} (see `{self.prog} --help`)\n")

    def _check_value(self, action: argparse.Action, value: object) -> None:
        """argparse's check of a choice (a command's name too), which also suggests the nearest choice:
        Python 3.14's `suggest_on_error` does, 3.11 and 3.12 have none. A private method overridden:
        argparse has no public hook for a bad choice's message; this is the one place that does it."""
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError:
            choices = list(action.choices or ())
            hint = did_you_mean(value, choices) if all(isinstance(c, str) for c in [value, *choices]) else ""
            if not hint:
                raise
            listed = ", ".join(map(repr, choices))
            raise argparse.ArgumentError(action, f"invalid choice: {value!r}; {hint} (choose from {listed})") from None


class PathArg:
    """The `type` of an argument that names a path: what it must be (`kind`, one of KINDS) and how its
    errors name it (`label`, a format of `path`). Parsing only refuses an empty path; `check` does the
    rest. With `each`, the command checks every path itself (to say one line per bad one)."""

    KINDS = {"file": paths.readable_file, "directory": paths.readable_dir, "file or directory": paths.readable,
             "output file": paths.writable_file, "output directory": paths.writable_dir}

    def __init__(self, kind: str, label: str = "{path}", *, what: str = "a file", each: bool = False):
        if kind not in self.KINDS:
            raise ValueError(f"unknown path kind {kind!r}")
        self.kind, self.label, self.what, self.each = kind, label, what, each
        self.__name__ = kind  # argparse names a type by it

    def __call__(self, text: str) -> str:
        if text == "":
            article = "an" if self.kind.startswith("o") else "a"
            raise argparse.ArgumentTypeError(f"an empty path (name {article} {self.kind}; '.' is this directory)")
        return text

    @property
    def writes(self) -> bool:
        """True for an output: checked before the inputs, so no input is read for nothing."""
        return self.kind.startswith("output")

    def check(self, path: str) -> None:
        """Raise InputError (OutputError for an output) naming the path unless it is fit for its kind."""
        extra = {"what": self.what} if self.kind in ("file", "directory") else {}
        self.KINDS[self.kind](path, label=self.label.format(path=path), **extra)

    def __repr__(self) -> str:
        return f"PathArg({self.kind!r}, {self.label!r})"


def check_paths(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Check every path `args` holds for the command it chose (outputs first): InputError otherwise.
    An output file that is also one of the command's input files is refused (OutputError): writing it
    would replace what the user gave (`--json STUDY.yaml`); a command with `--in-place` checks that itself."""
    chosen = [a for a in _chosen_actions(parser, args) if isinstance(a.type, PathArg)]
    for action in sorted((a for a in chosen if not a.type.each), key=lambda a: not a.type.writes):
        for path in _values(args, action):
            action.type.check(path)
    if hasattr(args, "in_place"):  # a command that writes in place on request says how (config set)
        return
    inputs = [p for a in chosen if a.type.kind in ("file", "file or directory") for p in _values(args, a)]
    for action in (a for a in chosen if a.type.kind == "output file"):
        for out in _values(args, action):
            for path in inputs:
                if paths.same_file(out, path):
                    raise OutputError(f"{action.type.label.format(path=out)}: the same file as the input "
                                      f"{path}; refusing to write over it")


def _values(args: argparse.Namespace, action: argparse.Action) -> list[str]:
    """The paths an argument holds (none, one or a list)."""
    value = getattr(args, action.dest, None)
    return [v for v in (value if isinstance(value, list) else [value]) if v is not None]


def _chosen_actions(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Iterator[argparse.Action]:
    """The actions of `parser` and of the subcommands `args` chose."""
    for chosen in chosen_parsers(parser, args):
        yield from chosen._actions  # argparse has no public list of a parser's arguments


def chosen_parsers(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[argparse.ArgumentParser]:
    """`parser` and the parsers of the subcommands `args` chose, outermost first (`tuner`, `tuner traffic`,
    `tuner traffic stats`)."""
    chain = [parser]
    for action in _subcommands(parser):
        chosen = action.choices.get(getattr(args, action.dest, None) or "")
        if chosen is not None:
            chain += chosen_parsers(chosen, args)
    return chain


def _subcommands(parser: argparse.ArgumentParser) -> list[argparse._SubParsersAction]:
    return [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]


def refuse_bad_usage(parser: argparse.ArgumentParser, args: argparse.Namespace, extras: list[str]) -> None:
    """Refuse what parsing `parser.parse_known_args` let through, as argparse's own errors are (one line,
    exit 2), said by the command given it (so `see tuner tune --help`): arguments no parser took
    (`extras`), and a command group without its subcommand."""
    command = chosen_parsers(parser, args)[-1]
    if extras:
        command.error(_unrecognized(command, extras))
    groups = _subcommands(command)
    if groups:
        command.error(f"{command.prog} needs a subcommand: {', '.join(groups[0].choices)}")


def _unrecognized(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """argparse's `unrecognized arguments`, naming only the unknown options where there are any (each
    followed by the command's nearest option): the value after an unknown option is taken as the next
    positional, so another one is left over (`tune --trails 3 x.yaml` leaves x.yaml) and naming it misleads."""
    options = [a for a in extras if _is_option(parser, a)]
    if not options:
        return f"unrecognized arguments: {' '.join(extras)}"
    # matched without their dashes, which every option shares (`--check` was near enough to `--help`)
    known = {flag.lstrip(parser.prefix_chars): flag for action in parser._actions for flag in action.option_strings}
    near = [nearest(o.split("=", 1)[0].lstrip(parser.prefix_chars), known) for o in options]
    hints = [f"did you mean {known[name]}?" for name in near if name is not None]
    named = f"unrecognized option{'s' if len(options) > 1 else ''} {', '.join(options)}"
    return "; ".join([named, " ".join(hints)]) if hints else named


def _takes(parser: argparse.ArgumentParser, text: str) -> bool:
    """Whether `parser` has the option `text` names (`--name`, `--name=value`, `-x`, `-xVALUE`)."""
    flags = parser._option_string_actions  # argparse has no public table of a parser's option names
    name = text.split("=", 1)[0]
    return name in flags or (not text.startswith("--") and text[:2] in flags)


def _is_option(parser: argparse.ArgumentParser, text: str) -> bool:
    """Whether `text` reads as an option: a prefix character then more, and not a negative number
    (which argparse takes as a positional)."""
    if len(text) < 2 or text[0] not in parser.prefix_chars:
        return False
    try:
        float(text)
    except ValueError:
        return True
    return False


def finite_float(text: str) -> float:
    """A number from the command line that is finite: NaN passes every range check, so it is refused
    here, as infinity is."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def add_command(
    subparsers: argparse._SubParsersAction, name: str, *, run: Run, help: str, description: str | None = None,
    resumable: bool = False,
) -> argparse.ArgumentParser:
    """The parser of command `name`, which calls `run(args)`; `resumable` when running it again after a
    Ctrl-C or SIGTERM resumes where it stopped (what the interruption's message then says)."""
    parser = subparsers.add_parser(name, help=help, description=description)
    parser.set_defaults(func=run, resumable=resumable)
    return parser


def add_group(
    subparsers: argparse._SubParsersAction, name: str, *, help: str, description: str,
    metavar: str = "COMMAND",
) -> argparse._SubParsersAction:
    """A command group `name`; its subcommands go under what it returns. Given none, it is refused in one
    line naming them (refuse_bad_usage)."""
    parser = subparsers.add_parser(name, help=help, description=description)
    return parser.add_subparsers(dest=f"{name}_command", metavar=metavar)


def add_study(parser: argparse.ArgumentParser, help: str, *, optional: bool = False) -> None:
    """The STUDY.yaml positional, as `args.study`: a file to read."""
    parser.add_argument("study", nargs="?" if optional else None, metavar="STUDY.yaml", type=PathArg("file"),
                        help=help)


def add_tune_output(parser: argparse.ArgumentParser, help: str, *, optional: bool = False) -> None:
    """The OUTPUT_DIR positional, a directory `tuner tune` wrote, as `args.output_dir`."""
    parser.add_argument("output_dir", nargs="?" if optional else None, metavar="OUTPUT_DIR",
                        type=PathArg("directory"), help=help)


def add_input(parser: argparse.ArgumentParser, flag: str, *, kind: str = "file", what: str = "a file",
              metavar: str | None = None, help: str | None = None, required: bool = False, each: bool = False,
              nargs: str | None = None) -> None:
    """A path to read: an option `--flag` (its errors start `--flag PATH`) or a positional `flag` (they
    start with the path). `kind`: "file", "directory" or "file or directory"; `what` names the file a
    directory is not (e.g. "a traffic file"); `each`: the command checks each path itself (PathArg)."""
    option = flag.startswith("-")
    label = f"{flag} {{path}}" if option else "{path}"
    extra = {"required": required} if option else {}
    parser.add_argument(flag, type=PathArg(kind, label, what=what, each=each), metavar=metavar, help=help,
                        nargs=nargs, **extra)


def add_storage(parser: argparse.ArgumentParser, help: str) -> None:
    """`--storage URL`: an Optuna storage (a file it names is relative to the working directory, as every
    path on the command line; the study file's `storage:` is relative to the study file)."""
    parser.add_argument("--storage", metavar="URL", type=_storage_url,
                        help=f"{help} (a file it names, sqlite:///PATH or a journal, is relative to the working directory)")


def _storage_url(text: str) -> str:
    """`--storage`'s value: an empty one (most likely an unset shell variable) is refused, where it would
    silently fall back to the study's own storage instead of the shared one."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty storage URL (an unset variable?): give the URL, or leave "
                                         "--storage out for the study's own")
    return text


def add_output_dir(parser: argparse.ArgumentParser, *, note: str | None = None, flag: str = "--output",
                   help: str | None = None, label: str = "output directory {path}") -> None:
    """`--output DIR`: where a study's outputs go instead of its `output`; `note` adds to the help (or
    `help` replaces it, for another `flag`). It must be (or be able to become) a directory that takes a
    new file; the check makes nothing. Its errors start with `label`, a format of `path`."""
    help = help or (f"{OUTPUT_DIR_HELP}; {note}" if note else OUTPUT_DIR_HELP)
    parser.add_argument(flag, metavar="DIR", type=PathArg("output directory", label), help=help)


def add_output_file(
    parser: argparse.ArgumentParser, *, metavar: str | None = None, help: str | None = None,
    required: bool = False, flags: tuple[str, ...] = ("-o", "--output"), label: str | None = None,
) -> None:
    """`-o/--output`: the one file a command writes (its errors start with the path, or with `label`, a
    format of `path`, e.g. "-o {path}"). It must be a place a file can be written; the check makes nothing."""
    parser.add_argument(*flags, required=required, metavar=metavar, type=PathArg("output file", label or "{path}"),
                        help=help)


def add_json(parser: argparse.ArgumentParser, what: str, *, force: bool = False) -> None:
    """`--json OUT`: also write `what` as JSON (checked as an output file before the work). With `force`,
    `--force` too: the command replaces only a JSON it wrote, else with --force (tuner.files.check_replaceable)."""
    parser.add_argument("--json", metavar="OUT", type=PathArg("output file", "--json {path}"),
                        help=f"also write {what} as JSON to OUT")
    if force:
        add_flag(parser, "--force", "replace a --json file that tuner did not write (the study's own inputs "
                 "are never replaced)")


class _Textfile(PathArg):
    """node_exporter's textfile: an output file whose directory exists (the collector reads a directory
    that nothing here makes)."""

    def __init__(self) -> None:
        super().__init__("output file", "--textfile {path}")

    def check(self, path: str) -> None:
        """PathArg's check of an output file, then its directory's existence (tuner.production)."""
        super().check(path)
        # imported only where --textfile is given: tuner.production loads prometheus_client
        from tuner.production import check_textfile

        check_textfile(path)


def add_textfile(parser: argparse.ArgumentParser, what: str) -> None:
    """`--textfile PATH`: also write `what` as Prometheus metrics for node_exporter's textfile collector
    (checked before the work, its directory too; the command checks it against its study with
    `check_textfile_output`)."""
    parser.add_argument("--textfile", metavar="PATH", type=_Textfile(),
                        help=f"also write {what} as Prometheus metrics to PATH, for node_exporter's textfile "
                        "collector (PATH ending in .prom, in its --collector.textfile.directory); it replaces "
                        "a textfile tuner wrote, another file only with --force, never one of the study's "
                        "inputs nor a file in its model's directory")


def check_textfile_output(path: str, settings, *, force: bool, inputs: Iterable[tuple[str, str]] = ()) -> None:
    """--textfile's rules, --json's (tuner.cli.simulate_cmd.check_output): never over one of the study's
    inputs (or `inputs`: (path, what)) nor into its model's directory; over another existing file only if
    it is a textfile tuner wrote, or with `force`. Said before the work, as one OutputError line."""
    from tuner.cli.simulate_cmd import check_output

    check_output(path, settings, label=f"--textfile {path}", force=force, ours=_is_tuner_textfile, inputs=inputs)


def _is_tuner_textfile(path) -> bool:
    """Whether `path` holds what tuner.production.write_textfile writes: Prometheus's text format, every
    family named `tuner_...`, its first line a HELP line (or nothing: an audit with no figures). Every
    run replaces its own textfile, as node_exporter reads the newest. Another file is not read whole."""
    from prometheus_client.parser import text_string_to_metric_families

    head = b"# HELP tuner_"
    with open(path, "rb") as fh:
        start = fh.read(len(head))
        if start and start != head:
            return False
        fh.seek(0)
        data = fh.read()
    try:
        return all(f.name.startswith("tuner_") for f in text_string_to_metric_families(data.decode()))
    except ValueError:  # a line not of the format, or bytes not UTF-8: someone's own file
        return False


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
    parser: argparse.ArgumentParser, numbers: Iterable[Number], *, type: Callable[[str], float] = finite_float
) -> None:
    """Declare `numbers`, in order, each read with `type` (default: a finite float)."""
    for number in numbers:
        parser.add_argument(number.flag, type=type, default=number.default, metavar=number.metavar,
                            help=number.help)
