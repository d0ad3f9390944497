"""`tuner report OUTPUT_DIR`: write the HTML report of a finished study."""

from __future__ import annotations

import argparse

from tuner.cli._args import add_command, add_tune_output


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `tuner report` to `subparsers`."""
    parser = add_command(subparsers, "report", run=run,
                         help="write report.html (plots) for a tuner tune output directory",
                         description="Write OUTPUT_DIR/report.html: the recommendation, every trial, "
                         "the search, latency and batch plots, the config diff and the cost; and, "
                         "when OUTPUT_DIR/soak/ holds a `tuner soak`, OUTPUT_DIR/soak/report.html: "
                         "its windows over time with the fitted trends and the breach.")
    add_tune_output(parser, "the directory `tuner tune` (or `tuner soak`) wrote")


def run(args: argparse.Namespace) -> int:
    """Write the output directory's HTML reports and print their paths; exit 0."""
    from tuner.report import write_reports  # plotly and optuna load only for this command

    for path in write_reports(args.output_dir):
        print(path)
    return 0
