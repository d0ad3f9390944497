"""Bad usage of the command line, said alike by every command: one line on stderr, exit 2, naming what
was wrong and the `--help` of the command that was given it."""

from __future__ import annotations

import argparse

import pytest

from tuner.cli import build_parser, main

GROUPS = {name: sub for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction)
          for name, sub in action.choices.items()
          if any(isinstance(a, argparse._SubParsersAction) for a in sub._actions)}


def _refused(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and out == "" and err.count("\n") == 1 and err.startswith("tuner: error: "), err
    return err


def test_the_groups_are_found():
    assert {"config", "traffic", "server"} <= set(GROUPS), GROUPS


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_a_group_without_its_subcommand_names_them_in_one_line(capsys, group):
    err = _refused(capsys, [group])
    names = next(a for a in GROUPS[group]._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert err == f"tuner: error: tuner {group} needs a subcommand: {', '.join(names)} " \
                  f"(see `tuner {group} --help`)\n"


def test_tuner_alone_prints_its_help_on_stderr_and_exits_2(capsys):
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("usage: tuner ") and "traffic" in err
