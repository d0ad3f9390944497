"""Bad usage of the command line, said alike by every command: one line on stderr, exit 2, naming what
was wrong, the nearest known name where one is close, and the `--help` of the command that was given it."""

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


def test_an_unknown_option_is_named_with_the_nearest_one_and_the_commands_help(capsys):
    # "3" is taken as the study and x.yaml left over: only the option is named
    err = _refused(capsys, ["tune", "--trails", "3", "x.yaml"])
    assert err == "tuner: error: unrecognized option --trails; did you mean --trials? (see `tuner tune --help`)\n"
    err = _refused(capsys, ["tune", "x.yaml", "--trails=3", "--quiett"])
    assert "unrecognized options --trails=3, --quiett; did you mean --trials? did you mean --quiet?" in err
    err = _refused(capsys, ["traffic", "--stat"])
    assert err == "tuner: error: unrecognized option --stat (see `tuner traffic --help`)\n"
    err = _refused(capsys, ["config", "set", "c.pbtxt", "--set", "a=1", "--in-plce"])
    assert err == "tuner: error: unrecognized option --in-plce; did you mean --in-place? " \
                  "(see `tuner config set --help`)\n"


def test_a_misspelt_option_is_named_where_a_required_one_seems_missing(capsys):
    # argparse stops at the missing --set before it would have named --sett
    err = _refused(capsys, ["config", "set", "c.pbtxt", "--sett", "a=1"])
    assert err == "tuner: error: unrecognized option --sett; did you mean --set? (see `tuner config set --help`)\n"
    # nothing misspelt: the missing arguments are named as argparse names them
    err = _refused(capsys, ["config", "set", "c.pbtxt"])
    assert "the following arguments are required: --set" in err
    err = _refused(capsys, ["config", "set", "--", "--sett"])  # after `--` a name is a positional
    assert "the following arguments are required: --set" in err


@pytest.mark.parametrize("argv, prefix", [(["replay", "x.yaml", "--spe", "2"], "--spe"),
                                          (["config", "set", "c.pbtxt", "--set", "a=1", "--in-pl"], "--in-pl")])
def test_an_options_prefix_is_not_taken_for_it(capsys, argv, prefix):
    # a prefix would change meaning in a script the day another option shares it
    assert f"unrecognized option {prefix}; did you mean" in _refused(capsys, argv)


def test_a_positional_no_command_takes_is_named_by_that_command(capsys):
    err = _refused(capsys, ["tune", "a.yaml", "b.yaml"])
    assert err == "tuner: error: unrecognized arguments: b.yaml (see `tuner tune --help`)\n"
    err = _refused(capsys, ["tune", "a.yaml", "-3"])  # a negative number is a positional, not an option
    assert "unrecognized arguments: -3 (see `tuner tune --help`)" in err


@pytest.mark.parametrize("argv,near,command", [
    (["tnue"], "tune", "tuner"),
    (["traffic", "stat"], "stats", "tuner traffic"),
    (["config", "shwo"], "show", "tuner config"),
    (["server", "instal"], "install", "tuner server"),
    (["traffic", "synth", "poison"], "poisson", "tuner traffic synth"),
    (["replay", "x.yaml", "--protocol", "HTTP"], "http", "tuner replay"),  # letters' case aside
])
def test_an_unknown_command_or_choice_suggests_the_nearest(capsys, argv, near, command):
    err = _refused(capsys, argv)
    assert f"invalid choice: {argv[-1]!r}; did you mean {near}? (choose from " in err
    assert err.endswith(f"(see `{command} --help`)\n"), err


def test_nothing_is_suggested_where_nothing_is_near(capsys):
    err = _refused(capsys, ["xyzzy"])
    assert "did you mean" not in err and "invalid choice: 'xyzzy' (choose from 'tune'," in err


def test_an_unknown_option_is_not_matched_on_its_dashes_and_every_group_names_its_commands_alike(capsys):
    # `--check` was "did you mean --help?" (the shared dashes made them near); `config chek` said
    # "argument SUBCOMMAND" where `traffic sytnh` said "argument COMMAND"
    err = _refused(capsys, ["finish", "--check", "s.yaml"])
    assert err == "tuner: error: unrecognized option --check (see `tuner finish --help`)\n"
    assert "argument COMMAND: invalid choice: 'chek'; did you mean check?" in _refused(capsys, ["config", "chek", "x"])
    assert "argument COMMAND: invalid choice: 'sytnh'; did you mean synth?" in _refused(capsys, ["traffic", "sytnh"])


@pytest.mark.parametrize("command", [["tune", "s.yaml"], ["finish", "s.yaml"], ["export"], ["tune", "s.yaml", "--check"]])
def test_an_empty_storage_url_is_refused_not_taken_for_the_studys_own(capsys, command):
    # `--storage "$DB"` with DB unset: the shared study must not quietly become a private SQLite file
    err = _refused(capsys, [*command, "--storage", ""])
    assert "argument --storage: an empty storage URL (an unset variable?)" in err
