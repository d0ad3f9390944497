"""The command line as a whole: every command documents itself, bad usage is one line and exit 2."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]


def _commands(parser: argparse.ArgumentParser, prefix=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield prefix + (name,), sub
                yield from _commands(sub, prefix + (name,))


COMMANDS = list(_commands(build_parser()))


def test_the_main_commands_exist():
    top = {path[0] for path, _ in COMMANDS}
    assert {"tune", "finish", "replay", "export", "report", "traffic", "config", "server", "nightly", "audit",
            "profile", "simulate", "soak", "exporter"} <= top, top


@pytest.mark.parametrize("path,sub", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_command_has_help(path, sub):
    name = " ".join(path)
    description = " ".join((sub.description or "").split())
    assert description, f"`tuner {name}` has no description"
    help_text = sub.format_help()
    assert help_text.startswith(f"usage: tuner {name} "), help_text  # under its own name
    assert description in " ".join(help_text.split()), f"`tuner {name} --help` does not show its description"


def test_unknown_command_is_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["no-such-command"])
    assert exc.value.code == 2


def test_no_command_prints_help_and_exit_2(capsys):
    assert main([]) == 2
    assert "usage" in capsys.readouterr().err  # bad usage, on stderr (tests/test_cli_usage.py)


def test_module_entry_point_runs():
    out = subprocess.run([sys.executable, "-m", "tuner", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("tuner ")


# --- argparse's own errors, numbers that are not finite, the interruption's message -------------------

@pytest.mark.parametrize("argv,words", [
    (["tune"], "the following arguments are required: STUDY.yaml"),
    (["tune", "s.yaml", "--no-such-flag"], "unrecognized option --no-such-flag"),
    (["traffic", "synth", "nope"], "argument kind: invalid choice: 'nope'"),
])
def test_argparse_errors_are_one_line_and_exit_2(capsys, argv, words):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and err.startswith("tuner: error: ") and words in err, err


@pytest.mark.parametrize("argv,flag,value", [
    (["replay", "STUDY", "--speed", "nan"], "--speed", "nan"),
    (["replay", "STUDY", "--duration", "inf"], "--duration", "inf"),
    (["soak", "STUDY", "--hours", "NaN"], "--hours", "NaN"),
    (["simulate", "STUDY", "--profile", "p.csv", "--sla-ms=-inf"], "--sla-ms", "-inf"),
])
def test_a_number_that_is_not_finite_is_refused_before_anything_starts(tmp_path, capsys, argv, flag, value):
    study = tmp_path / "study.yaml"
    study.write_text("not: read\n")
    with pytest.raises(SystemExit) as exc:
        main([str(study) if a == "STUDY" else a for a in argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1, err
    assert f"argument {flag}: expected a finite number, got {value!r}" in err


def _interrupted(monkeypatch, capsys, module, name: str, argv: list[str]) -> str:
    from tuner.errors import Terminated

    def stop(args):
        raise Terminated()

    monkeypatch.setattr(module, name, stop)  # registered again by main, so the command is this one
    assert main(argv) == 143
    return capsys.readouterr().err


def test_sigterm_says_resume_only_where_running_again_resumes(tmp_path, monkeypatch, capsys):
    import tuner.cli
    from tuner.cli import _args, replay_cmd

    study = tmp_path / "study.yaml"
    study.write_text("x: 1\n")
    err = _interrupted(monkeypatch, capsys, replay_cmd, "_replay", ["replay", str(study)])
    assert err == "tuner: terminated (SIGTERM)\n"  # a replay measures again from the start

    def resumable(subparsers):
        _args.add_command(subparsers, "resumes", run=lambda args: replay_cmd._replay(args), help="h",
                          resumable=True)

    module = type(sys)("tuner.cli.resumes_cmd")
    module.register = resumable
    monkeypatch.setitem(sys.modules, "tuner.cli.resumes_cmd", module)
    monkeypatch.setattr(tuner.cli, "COMMAND_MODULES", (*tuner.cli.COMMAND_MODULES, "tuner.cli.resumes_cmd"))
    err = _interrupted(monkeypatch, capsys, replay_cmd, "_replay", ["resumes"])
    assert err == "tuner: terminated (SIGTERM); run the same command again to resume\n"

    def ctrl_c(args):
        raise KeyboardInterrupt

    # Ctrl-C says it too (it said only "tuner: interrupted")
    monkeypatch.setattr(replay_cmd, "_replay", ctrl_c)
    assert main(["resumes"]) == 130
    assert capsys.readouterr().err == "tuner: interrupted; run the same command again to resume\n"
    assert main(["replay", str(study)]) == 130
    assert capsys.readouterr().err == "tuner: interrupted\n"


# (command, dest) of numbers still read with plain float, which takes "nan" and "inf": each is a
# one-line change to `type=finite_float` (tuner/cli/_args.py); one changed must leave this list
NOT_YET_FINITE: set[tuple[str, str]] = set()


def test_every_number_on_the_command_line_is_read_as_a_finite_number():
    plain = {(" ".join(path), a.dest) for path, sub in COMMANDS for a in sub._actions if a.type is float}
    assert plain - NOT_YET_FINITE == set(), "read these with finite_float (tuner/cli/_args.py)"
    assert NOT_YET_FINITE - plain == set(), "these are finite now: remove them from NOT_YET_FINITE"


def test_tune_stops_starting_trials_at_the_studys_search_timeout_unless_timeout_says_otherwise(
        tmp_path, monkeypatch, capsys):
    """search.timeout_s of the study file is the run's limit (it was read and never used); --timeout,
    for one run, replaces it; --check says it."""
    from pathlib import Path

    import yaml

    import tuner.tune
    from tuner.cli import main

    root = Path(__file__).resolve().parent.parent
    study = yaml.safe_load((root / "examples" / "quickstart.yaml").read_text())
    study["model_repository"] = str((root / "examples" / study["model_repository"]).resolve())
    study["traffic"]["path"] = str((root / "examples" / study["traffic"]["path"]).resolve())
    study["search"]["timeout_s"] = 7
    study["output"] = str(tmp_path / "out")
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    seen = []

    def fake_tune(settings, trials, **kw):
        seen.append(kw["timeout_s"])
        return tuner.tune.Handover("s", "storage", {"host": "h", "pid": 1, "gpu": "cpu"}, 0)

    monkeypatch.setattr(tuner.tune, "tune", fake_tune)
    assert main(["tune", str(path), "--quiet"]) == 0
    assert main(["tune", str(path), "--quiet", "--timeout", "60"]) == 0
    assert seen == [7, 60]
    assert main(["tune", str(path), "--check"]) == 0
    assert "no trial started after 7 s (search.timeout_s)" in capsys.readouterr().out
    # the dry run says what this run would do: --timeout and --trials, not the study's values
    assert main(["tune", str(path), "--check", "--timeout", "60", "--trials", "3"]) == 0
    out = capsys.readouterr().out
    assert "no trial started after 60 s (--timeout)" in out and ", 3 trials, " in out


def test_tune_check_says_what_the_replay_sends_each_input(tmp_path, capsys):
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parent.parent
    study = yaml.safe_load((root / "examples" / "quickstart.yaml").read_text())
    study["model_repository"] = str((root / "examples" / study["model_repository"]).resolve())
    study["traffic"]["path"] = str((root / "examples" / study["traffic"]["path"]).resolve())
    study["output"] = str(tmp_path / "out")
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    assert main(["tune", str(path), "--check"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^input\s+INPUT_IDS: INT32 \[batch_size, -1 from seq_len\], sent$", out, re.M), out


def test_output_into_a_closed_pipe_ends_quietly_as_a_unix_tool_does(tmp_path):
    # `tuner traffic stats FILE | head -1` printed a BrokenPipeError traceback
    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written: every write fails
    try:
        done = subprocess.run([sys.executable, "-m", "tuner", "traffic", "stats", str(ROOT / "traffic_profiles" / "bursty_60s.csv")],
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        os.close(write)
    assert done.returncode == 141 and done.stderr == "", done.stderr


def test_export_says_what_it_writes_for_a_model_vllm_serves():
    sub = dict((" ".join(p), s) for p, s in COMMANDS)["export"]
    text = " ".join(sub.format_help().split())
    assert "for a model vLLM serves its model.json" in text and "same text, or with --force" in text
