"""What several commands print or write alike."""

from __future__ import annotations

from tuner import export
from tuner.errors import NoFeasibleConfigError


def print_outcome(summary: dict, output: str) -> int:
    """A finished study's closing table, its one-line verdict and where its outputs are; exit 3
    (NoFeasibleConfigError) when nothing met the SLA."""
    print(export.closing_table(summary))
    print(f"\n{summary['message']}\noutputs: {output}")
    if summary.get("report"):
        print(f"report:  {summary['report']}")
    elif summary.get("report_error"):
        print(f"report:  not written ({summary['report_error']})")
    if not summary["feasible"]:
        raise NoFeasibleConfigError(summary["message"])
    return 0


