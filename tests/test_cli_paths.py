"""Every path a command line names is a path the user gave (tuner/cli/_args.py: PathArg, checked with
tuner.paths before the command runs): walked here over the real parser with the names the OS refuses.

Each command's path arguments get a name too long, a symbolic-link loop, a directory where a file is
expected, a file where a directory is expected and a place that takes no new file (/proc): exit 2, one
line naming the path, no traceback, nothing made. A path-like argument declared without a PathArg fails
the test, unless it is in NOT_YET_CHECKED: the ones still to be wired, each a one-line change.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from tuner import paths
from tuner.cli import build_parser, main
from tuner.cli._args import PathArg
from tuner.errors import InputError, OutputError

# (command, dest) of path arguments still declared without a PathArg (see the report of issue 24):
# an entry that gets its type must leave this list, so the list is exactly what remains.
NOT_YET_CHECKED: set[tuple[str, str]] = set()

# a metavar that names a file or directory, or a destination that does (when its metavar does not say
# it is something else, e.g. `export --study NAME`)
PATH_METAVAR = re.compile(r"FILE|DIR|OUT|PATH|STUDY|NIGHTLY|PROFILE|\.yaml|\.csv|\.png|\.json")
PATH_DEST = {"input", "output", "output_dir", "json", "plot", "profile", "config", "path", "paths", "baseline",
             "dir", "study", "nightly"}
NOT_A_PATH_METAVAR = {"NAME", "URL", "HOST:PORT"}


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield prefix + (name,), sub
                yield from _commands(sub, prefix + (name,))


def _path_like(action: argparse.Action) -> bool:
    metavar = action.metavar if isinstance(action.metavar, str) else ""
    if metavar in NOT_A_PATH_METAVAR:
        return False
    return bool(PATH_METAVAR.search(metavar)) or action.dest in PATH_DEST


COMMANDS = list(_commands(build_parser()))
PATH_ACTIONS = [(" ".join(cmd), sub, a) for cmd, sub in COMMANDS for a in sub._actions if _path_like(a)]
TYPED = [(cmd, sub, a) for cmd, sub, a in PATH_ACTIONS if isinstance(a.type, PathArg)]


def test_every_path_argument_is_declared_as_a_path_the_user_gave():
    untyped = {(cmd, a.dest) for cmd, _, a in PATH_ACTIONS if not isinstance(a.type, PathArg)}
    assert untyped - NOT_YET_CHECKED == set(), "declare these with a PathArg (tuner/cli/_args.py)"
    assert NOT_YET_CHECKED - untyped == set(), "these are checked now: remove them from NOT_YET_CHECKED"
    # the walk below sees every command that shares a declaration
    assert {"tune", "replay", "export", "report", "config set", "traffic import"} <= {c for c, _, _ in TYPED}


# --- the walk --------------------------------------------------------------------------------------

def _bad_paths(tmp: Path, kind: str) -> dict[str, Path]:
    """The names each kind of path must refuse, made under `tmp`."""
    loop = tmp / "loop"
    loop.symlink_to(loop.name)  # a link to itself: ELOOP
    a_file, a_dir = tmp / "a-file", tmp / "a-dir"
    a_file.write_text("not a directory")
    a_dir.mkdir()
    bad = {"a name too long": tmp / ("n" * 300 + ".yaml"), "a symbolic-link loop": loop,
           "a file where a directory is expected": a_file / "x.yaml", "a place that takes no new file":
           Path("/proc/tuner-walk/x.yaml")}
    if kind in ("file", "output file"):
        bad["a directory"] = a_dir
    if kind in ("directory", "output directory"):
        bad["a file, not a directory"] = a_file
    return bad


def _good_path(tmp: Path, kind: str) -> str:
    if kind in ("file", "file or directory"):
        (tmp / "good.yaml").write_text("a: 1\n")
        return str(tmp / "good.yaml")
    if kind == "directory":
        (tmp / "good-dir").mkdir(exist_ok=True)
        return str(tmp / "good-dir")
    return str(tmp / ("out.csv" if kind == "output file" else "out-dir"))  # outputs: not there yet


def _argv(command: str, sub: argparse.ArgumentParser, target: argparse.Action, bad: str, tmp: Path) -> list[str]:
    """`tuner COMMAND ...` with `bad` for `target` and a value that parses for every other required one."""
    required_groups = {g._group_actions[0] for g in sub._mutually_exclusive_groups if g.required}
    argv = command.split()
    for action in sub._actions:
        needed = action.required or action in required_groups or action is target
        if not needed or isinstance(action, argparse._HelpAction):
            continue
        if action is target:
            value = bad
        elif isinstance(action.type, PathArg):
            value = _good_path(tmp, action.type.kind)
        else:
            value = str(action.choices and next(iter(action.choices)) or "1")
        argv += [action.option_strings[0], value] if action.option_strings else [value]
    return argv


def _walk_ids():
    cases = []
    for cmd, sub, action in TYPED:
        for case in ("a name too long", "a symbolic-link loop", "a file where a directory is expected",
                     "a place that takes no new file", "a directory", "a file, not a directory"):
            kind = action.type.kind
            if case == "a directory" and kind not in ("file", "output file"):
                continue
            if case == "a file, not a directory" and kind not in ("directory", "output directory"):
                continue
            cases.append(pytest.param(cmd, sub, action, case, id=f"{cmd} {action.dest}: {case}"))
    return cases


@pytest.mark.parametrize("command,sub,action,case", _walk_ids())
def test_a_path_the_os_refuses_is_one_line_before_any_work(command, sub, action, case, tmp_path, capsys):
    bad = _bad_paths(tmp_path, action.type.kind)[case]
    argv = _argv(command, sub, action, str(bad), tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(argv) == 2, argv
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and str(bad) in err, (argv, err)
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing made, not even a probe


def test_an_empty_path_is_refused_not_taken_for_the_default(tmp_path, capsys):
    study = tmp_path / "study.yaml"
    study.write_text("a: 1\n")
    for argv in (["tune", str(study), "--output", ""], ["export", str(tmp_path), "-o", ""], ["tune", ""]):
        with pytest.raises(SystemExit) as exit:
            main(argv)
        err = capsys.readouterr().err
        assert exit.value.code == 2 and err.count("\n") == 1 and "an empty path" in err, err


def test_outputs_are_checked_before_inputs_and_a_check_makes_nothing(tmp_path, capsys):
    # a missing study and an output under /proc: the output is named (the study would be read first)
    assert main(["replay", str(tmp_path / "missing.yaml"), "--json", "/proc/tuner-x.json"]) == 2
    assert "--json /proc/tuner-x.json: cannot write" in capsys.readouterr().err
    # an output directory that can be made is not made by the check
    assert main(["tune", str(tmp_path / "missing.yaml"), "--output", str(tmp_path / "new" / "out")]) == 2
    assert "missing.yaml: no such file" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


# --- tuner.paths -----------------------------------------------------------------------------------

def test_the_checks_say_the_os_reason_and_what_stands_in_the_way(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(InputError, match=rf"^{tmp_path}/f/t.csv: cannot read \(Not a directory\)$"):
        paths.readable_file(tmp_path / "f" / "t.csv")
    assert paths.writable_file(tmp_path / "f") == tmp_path / "f"  # a file may be written over
    with pytest.raises(OutputError, match=r"^out: cannot write \(Not a directory\)$"):
        paths.writable_file(tmp_path / "f" / "new" / "x.json", label="out")
    with pytest.raises(OutputError, match=r"^d: cannot write there \(File name too long: 300 bytes"):
        paths.writable_dir(tmp_path / "new" / ("d" * 300), label="d")
    with pytest.raises(InputError, match=r"^m: no such directory$"):
        paths.readable_dir(tmp_path / "missing", label="m")
    with pytest.raises(InputError, match=r"^f: is a traffic file, not a directory$"):
        paths.readable_dir(tmp_path / "f", label="f", what="a traffic file")


def test_writable_places_pass_and_a_directory_is_made_only_when_asked(tmp_path):
    assert paths.writable_file(tmp_path / "a" / "b" / "x.json") == tmp_path / "a" / "b" / "x.json"
    assert paths.writable_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert list(tmp_path.iterdir()) == []
    paths.writable_dir(tmp_path / "a" / "b", create=True)
    assert (tmp_path / "a" / "b").is_dir() and list((tmp_path / "a" / "b").iterdir()) == []


def test_nameable_leaves_a_missing_path_to_its_reader_and_refuses_a_name_no_file_can_have(tmp_path):
    assert paths.nameable(tmp_path / "missing.csv", label="x") == tmp_path / "missing.csv"
    (tmp_path / "loop").symlink_to("loop")
    for bad in (tmp_path / "loop", tmp_path / ("t" * 300)):
        with pytest.raises(InputError, match=r"^x: (Too many levels of symbolic links|File name too long)$"):
            paths.nameable(bad, label="x")


# --- an output that is one of the command's inputs --------------------------------------------------

SAME_FILE = [
    "replay IN --json OUT", "audit IN --json OUT", "simulate IN --profile IN --json OUT", "profile IN -o OUT",
    "traffic stats IN --plot OUT", "traffic convert IN -o OUT",
]  # `config set IN -o IN` is refused by the command itself, with its --in-place hint (test_config_cli)


@pytest.mark.parametrize("command", SAME_FILE)
@pytest.mark.parametrize("through", ["itself", "another spelling", "a symbolic link"])
def test_an_output_that_is_the_commands_input_is_refused_and_the_input_kept(command, through, tmp_path,
                                                                            monkeypatch, capsys):
    given = tmp_path / "mine.yaml"
    given.write_text("name: mine  # the user's own file\n")
    out = {"itself": str(given), "another spelling": "./sub/../mine.yaml", "a symbolic link": "link.yaml"}[through]
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.yaml").symlink_to(given)
    monkeypatch.chdir(tmp_path)
    argv = command.replace("IN", str(given)).replace("OUT", out).split()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(f"the same file as the input {given}; refusing to write over it"), err
    assert given.read_text() == "name: mine  # the user's own file\n" and not given.is_symlink()
