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
    print(f"\n{summary['message']}\noutputs: {output}")
    if summary.get("report"):
        print(f"report:  {summary['report']}")
    check = check_command(summary, output)
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


def check_command(summary: dict, output: str) -> str | None:
    """The `tuner replay` that measures the recommendation's deciding step again: its recommended
    config.pbtxt (model.json for a vLLM-served model) at its capacity's speed (the recorded load's, when
    scored by utilization), replayed as a search step (`--step`). None without a recommendation."""
    import shlex
    from pathlib import Path

    best, study = summary.get("best"), summary.get("study_file")
    config = next((Path(output) / rel for rel in (export.RECOMMENDED_ENGINE, export.RECOMMENDED)
                   if (Path(output) / rel).is_file()), None)
    if not summary.get("feasible") or not best or not study or config is None:
        return None
    speed = best.get("capacity_speed") if summary.get("scoring") == "capacity" else None
    speed = speed or (summary.get("traffic") or {}).get("speed")
    if not speed:
        return None
    return (f"tuner replay {shlex.quote(str(study))} --config {shlex.quote(str(config))} --speed {speed:.4g} --step")
