"""`tuner report OUTPUT_DIR`: write the HTML report of a finished study (or, given AUDIT.json, of a
production audit)."""

from __future__ import annotations

import argparse

from tuner.cli._args import PathArg, add_command


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `tuner report` to `subparsers`."""
    parser = add_command(subparsers, "report", run=run,
                         help="write report.html (plots) for a tuner tune output directory",
                         description="Write OUTPUT_DIR/report.html: the recommendation, every trial, "
                         "the search, latency and batch plots, the config diff and the cost; and, "
                         "when OUTPUT_DIR/soak/ holds a `tuner soak`, OUTPUT_DIR/soak/report.html: "
                         "its windows over time with the fitted trends and the breach. Given the JSON of "
                         "`tuner audit --prometheus --json`, AUDIT.html beside it: the audit's hourly series "
                         "(throughput, fill rate, ratio, queue and compute time, errors) as plots.")
    parser.add_argument("output_dir", metavar="OUTPUT_DIR|AUDIT.json", type=PathArg("file or directory"),
                        help="the directory `tuner tune` (or `tuner soak`) wrote, or a production audit's JSON")


def run(args: argparse.Namespace) -> int:
    """Write the output directory's HTML reports and print their paths; exit 0."""
    from tuner.report import is_production_audit, write_production_report, write_reports  # plotly loads here

    if is_production_audit(args.output_dir):
        print(write_production_report(args.output_dir))
        return 0
    for path in write_reports(args.output_dir):
        print(path)
    return 0
