"""`tuner tune STUDY.yaml`: search the study's space, re-measure the best, write the outputs."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from tuner.cli._args import (
    add_command,
    add_flag,
    add_output_dir,
    add_quiet,
    add_storage,
    add_study,
    finite_float,
)
from tuner.errors import SettingsError, UnmeasuredError
from tuner.settings import read_study


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `tuner tune` to `subparsers`."""
    parser = add_command(
        subparsers,
        "tune",
        run=run,
        resumable=True,
        help="find the configuration (dynamic batching, or a vLLM model's engine knobs) with the most "
             "requests (or output tokens) per dollar under the SLA",
        description="Run the study: replay the recorded traffic against each trial configuration on a "
        "real Triton, find its capacity under the SLA, let Optuna choose the next one, re-measure the "
        "best, and write recommended/config.pbtxt, summary.json and trials.csv into the output "
        "directory. Running the same command again resumes the study. Exit codes: 0 done, 2 bad input, "
        "3 no configuration met the SLA, 1 anything else.",
    )
    add_study(parser, "the study file")
    parser.add_argument("--trials", type=int, metavar="N", help="trials in all (default: search.trials)")
    parser.add_argument("--timeout", type=finite_float, metavar="S", help="stop starting trials after S seconds (default: the study's search.timeout_s; none)")
    add_output_dir(parser)
    add_storage(parser, "Optuna storage URL, e.g. postgresql://user@db/tuner for hosts sharing the study "
                "(the password from $PGPASSWORD), or a journal file: a name ending in .journal or .log, or "
                "an existing Optuna journal; anything else (a mistyped URL, someone's file) is refused before "
                "anything is written (default: sqlite:///DIR/study.db)")
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="worker processes on this machine, each with its own server (default 1)")
    add_quiet(parser)
    add_flag(parser, "--check", "a dry run: check the study (settings, model config, traffic as the replay "
             "plans it, space, profile, output, storage: a database server is reached, nothing made in it), "
             "print what it would do, start nothing")


def run(args: argparse.Namespace) -> int:
    """Run the study (or only check it, with --check) and print its outcome; the exit code."""
    import optuna

    from tuner import export
    from tuner.cli._common import print_outcome
    from tuner.cli._progress import Bars
    from tuner.tune import Handover, check_table, check_workers, prepare, tune

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the progress bar says what matters
    settings = read_study(args.study)
    if args.output:
        settings = dataclasses.replace(settings, output=str(Path(args.output).resolve()))
    for flag, value in (("--trials", args.trials), ("--workers", args.workers), ("--timeout", args.timeout)):
        if value is not None and value <= 0:
            raise SettingsError(f"{flag}: must be > 0, got {value}")
    if args.check:
        check_workers(settings, args.workers)
        # the dry run says what this run would do: its --trials and --timeout, not the study's
        given = frozenset(flag for flag, value in (("--trials", args.trials), ("--timeout", args.timeout))
                          if value is not None)
        settings = dataclasses.replace(settings, search=dataclasses.replace(
            settings.search, trials=args.trials or settings.search.trials,
            timeout_s=args.timeout or settings.search.timeout_s))
        prepared = prepare(settings, args.storage, dry_run=True)
        rows = check_table(prepared, workers=args.workers, given=given)
        width = max(len(what) for what, _ in rows)
        print("\n".join(f"{what:<{width}}  {value}" for what, value in rows))
        print(f"\n{settings.source or 'the study'}: ok (nothing was started)")
        return 0
    bars = Bars(enabled=not args.quiet)
    try:
        summary = tune(settings, trials=args.trials or settings.search.trials,
                       timeout_s=args.timeout or settings.search.timeout_s,
                       storage=args.storage, workers=args.workers, progress=bars)
    except UnmeasuredError:
        print(f"outputs: {settings.output}", file=sys.stderr)
        raise
    if isinstance(summary, Handover):  # another host re-measures and writes the outputs
        if summary.hosts:
            print(export.hosts_table(summary.hosts))
        print(f"\nstudy {summary.study_name!r} in {summary.storage}: {summary.message(args.study)}")
        return 0
    return print_outcome(summary, settings.output)
