"""`tuner tune STUDY.yaml`: search the study's space, re-measure the best, write the outputs."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import optuna

from tuner import export
from tuner.errors import NoFeasibleConfigError, SettingsError
from tuner.settings import load_study
from tuner.tune import tune


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "tune",
        help="find the dynamic-batching configuration with the most requests per dollar under the SLA",
        description="Run the study: replay the recorded traffic against each trial configuration on a "
        "real Triton, find its capacity under the SLA, let Optuna choose the next one, re-measure the "
        "best, and write recommended/config.pbtxt, summary.json and trials.csv into the output "
        "directory. Running the same command again resumes the study. Exit codes: 0 done, 2 bad input, "
        "3 no configuration met the SLA, 1 anything else.",
    )
    parser.add_argument("study", metavar="STUDY.yaml", help="the study file")
    parser.add_argument("--trials", type=int, metavar="N", help="trials in all (default: search.trials)")
    parser.add_argument("--timeout", type=float, metavar="S", help="stop starting trials after S seconds")
    parser.add_argument("--output", metavar="DIR", help="output directory (default: the study's output)")
    parser.add_argument("--storage", metavar="URL", help="Optuna storage URL or journal file "
                        "(default: DIR/study.journal)")
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="worker processes on this machine, each with its own server (default 1)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the progress bar says what matters
    settings = load_study(args.study)
    if args.output:
        settings = dataclasses.replace(settings, output=str(Path(args.output).resolve()))
    for flag, value in (("--trials", args.trials), ("--workers", args.workers), ("--timeout", args.timeout)):
        if value is not None and value <= 0:
            raise SettingsError(f"{flag}: must be > 0, got {value}")
    summary = tune(settings, trials=args.trials or settings.search.trials, timeout_s=args.timeout,
                   storage=args.storage, workers=args.workers, progress=not args.quiet)
    print(export.closing_table(summary))
    print(f"\n{summary['message']}\noutputs: {settings.output}")
    if summary.get("report"):
        print(f"report:  {summary['report']}")
    elif summary.get("report_error"):
        print(f"report:  not written ({summary['report_error']})")
    if not summary["feasible"]:
        raise NoFeasibleConfigError(summary["message"])
    return 0
