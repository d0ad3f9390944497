"""`tuner soak`: one configuration replayed against a long stretch of the recorded traffic, measured
window by window, and what `tuner.soak` (the pure analysis) reads from the windows.

    make_plan(traffic, hours=, speed=, window_minutes=) -> SoakPlan    how the soak is cut
    window_traffic(traffic, start_s, end_s, cycle_s)    one window of the recording, repeated as needed
    run_soak(settings, config, plan, traffic, output=, quiet=, ...) -> SoakResult   the soak (IO)
    analyze_soak(windows, executions, meta) -> SoakFindings   the findings of a soak's tables (pure)
    last_soak(output) -> list[str]      one or two lines on the soak an output directory holds
    soak_dir, has_soak, read_meta, read_windows, read_executions, read_findings   OUTPUT/soak/

The soak's time axis is hours of recorded traffic (the replay speed compresses them), counted from
the server's start.
"""

from __future__ import annotations

from pathlib import Path

from tuner.soaking._files import (
    TIME_AXIS,
    SoakFileError,
    has_soak,
    read_executions,
    read_findings,
    read_meta,
    read_windows,
    soak_dir,
)
from tuner.soaking._findings import LAST_WINDOWS, SoakFindings, analyze_soak, observed_break, summary_lines
from tuner.soaking._plan import MIN_WINDOWS, SoakPlan, cycle_length, make_plan, window_traffic
from tuner.soaking._run import SoakResult, run_soak
from tuner.soaking._windows import CAPACITY_FIGURE, TREND_FIGURES, fixed_mix, latency_column, split_failures

__all__ = [
    "CAPACITY_FIGURE",
    "LAST_WINDOWS",
    "MIN_WINDOWS",
    "TIME_AXIS",
    "TREND_FIGURES",
    "SoakFileError",
    "SoakFindings",
    "SoakPlan",
    "SoakResult",
    "analyze_soak",
    "cycle_length",
    "fixed_mix",
    "has_soak",
    "last_soak",
    "latency_column",
    "make_plan",
    "observed_break",
    "read_executions",
    "read_findings",
    "read_meta",
    "read_windows",
    "run_soak",
    "soak_dir",
    "split_failures",
    "summary_lines",
    "window_traffic",
]


def last_soak(output: str | Path) -> list[str]:
    """One or two lines on the findings of the soak in `output` (empty when it holds none, or an
    unreadable one: said in the line)."""
    if not has_soak(output):
        return []
    folder = soak_dir(output)
    try:
        findings = read_findings(folder)
        meta = read_meta(folder)
    except SoakFileError as exc:
        return [f"last soak: unreadable ({exc})"]
    if findings is None:
        return [f"last soak ({str(meta.get('started_utc', '?'))[:16]}): no findings yet (still running, or killed)"]
    return summary_lines(findings, meta)
