"""What several commands print or write alike."""

from __future__ import annotations

import sys

from tuner import export
from tuner.errors import NoFeasibleConfigError, OutputError


def print_outcome(summary: dict, output: str) -> int:
    """A finished study's closing table, its one-line verdict and where its outputs are; exit 3
    (NoFeasibleConfigError) when nothing met the SLA, else exit 2 (OutputError) when the report
    could not be written: a run whose output is missing does not end as a success."""
    print(export.closing_table(summary))
    print(f"\n{summary['message']}")
    for note in summary.get("notes") or []:
        print(f"note: {note}")
    print(f"outputs: {output}")
    if summary.get("report"):
        print(f"report:  {summary['report']}")
    check = export.check_command(summary, output)
    if check:
        print(f"check it: {check}")
    missing = summary.get("report_error")
    if not summary["feasible"]:
        if missing:  # exit 3 says the verdict; the missing report still goes where errors go
            print(f"tuner: report not written ({missing})", file=sys.stderr)
        raise NoFeasibleConfigError(summary["message"])
    if missing:
        raise OutputError(f"report not written ({missing}); the other outputs are in {output}")
    return 0
