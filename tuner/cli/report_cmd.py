"""`tuner report OUTPUT_DIR`: write the HTML report of a finished study."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("report", help="write report.html (plots) for a tuner tune output directory",
                                   description="Write OUTPUT_DIR/report.html: the recommendation, every trial, "
                                   "the search, latency and batch plots, the config diff and the cost.")
    parser.add_argument("output_dir", metavar="OUTPUT_DIR", help="the directory `tuner tune` wrote")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tuner.report import write_report  # plotly and optuna load only for this command

    print(write_report(args.output_dir))
    return 0
