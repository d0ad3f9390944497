"""`tuner finish STUDY.yaml --storage URL`: re-measure the top configurations of a study other hosts
searched, on this host's server, and write the outputs; with `--no-remeasure`, write the outputs of a
finished study from its storage alone (on any machine that reaches it)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from tuner.cli._args import add_command, add_flag, add_output_dir, add_quiet, add_storage, add_study
from tuner.errors import SettingsError
from tuner.settings import read_study


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `tuner finish` to `subparsers`."""
    parser = add_command(
        subparsers,
        "finish",
        run=run,
        help="re-measure the best of a study several hosts searched, and write its outputs",
        description="The host that finds a shared study's search over re-measures its top configurations "
        "and writes the outputs by itself; `tuner finish` does it on this host instead (if that host "
        "stopped, or to re-measure on a chosen one): the top configurations and the incumbent are measured "
        "again on this host's server, then recommended/config.pbtxt, summary.json, trials.csv and "
        "report.html are written. With --no-remeasure no server starts: the outputs are written from the "
        "storage (the re-measurement's per-request latencies stay on the host that measured them). "
        "Exit codes: 0 done, 2 bad input, 3 no configuration met the SLA, 1 anything else.",
    )
    add_study(parser, "the study file (needed to re-measure)", optional=True)
    add_storage(parser, "the study's storage (default: the study file's)")
    parser.add_argument("--study", dest="name", metavar="NAME",
                        help="the study's name, without STUDY.yaml (needed if the storage holds several)")
    add_output_dir(parser)
    add_flag(parser, "--no-remeasure", "write the outputs from the storage alone, starting no server")
    add_quiet(parser)


def run(args: argparse.Namespace) -> int:
    """Re-measure a shared study's best here (or only read its storage), write the outputs; the exit code."""
    import optuna

    from tuner import search
    from tuner.cli._common import print_outcome
    from tuner.cli._progress import Bars
    from tuner.tune import finish, outputs_from_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.study is None and not (args.no_remeasure and args.storage and args.output):
        raise SettingsError("give STUDY.yaml, or --storage URL --output DIR --no-remeasure (the outputs "
                            "from the storage alone)")
    if args.study is not None and args.name is not None:
        raise SettingsError("--study names the study only without STUDY.yaml (the file names it)")
    settings = read_study(args.study) if args.study is not None else None
    # the study file's storage (its output directory's, by default) even when --output writes elsewhere
    storage = args.storage or (search.storage_url(settings) if settings is not None else None)
    if settings is not None and args.output:
        settings = dataclasses.replace(settings, output=str(Path(args.output).resolve()))
    if args.no_remeasure:
        output = args.output or settings.output
        summary = outputs_from_storage(storage, settings.name if settings else args.name, output, settings=settings)
    else:
        summary = finish(settings, storage=storage, progress=Bars(enabled=not args.quiet))
        output = settings.output
    return print_outcome(summary, output)
