"""The command line as a whole: every command documents itself, bad usage is one line and exit 2."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from tuner.cli import build_parser, main


def _commands(parser: argparse.ArgumentParser, prefix=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield prefix + (name,), sub
                yield from _commands(sub, prefix + (name,))


COMMANDS = list(_commands(build_parser()))


def test_the_main_commands_exist():
    top = {path[0] for path, _ in COMMANDS}
    assert {"config", "traffic", "server"} <= top, top


@pytest.mark.parametrize("path,sub", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_command_has_help(path, sub):
    assert sub.description or sub.format_usage(), path
    help_text = sub.format_help()
    assert len(help_text.strip().splitlines()) >= 2, f"`tuner {' '.join(path)}` has no help"
    assert (sub.description or "").strip(), f"`tuner {' '.join(path)}` has no description"


def test_unknown_command_is_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["no-such-command"])
    assert exc.value.code == 2


def test_no_command_prints_help_and_exit_2(capsys):
    assert main([]) == 2
    assert "usage" in capsys.readouterr().out


def test_module_entry_point_runs():
    out = subprocess.run([sys.executable, "-m", "tuner", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("tuner ")
