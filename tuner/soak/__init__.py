"""`tuner soak`: one configuration replayed against a long stretch of the recorded traffic, measured
window by window, and what the windows show (drift, the breach, the restart advice). The front door:
everything outside this package imports from here.

    make_plan(traffic, hours=, speed=, window_minutes=) -> SoakPlan    how the soak is cut
    soak_config(settings, output, assignments, config_path=) -> (config, source)   what is soaked
    soak_engine(settings, output, assignments, config_path=) -> (config, engine, source) | None
                                        what is soaked when vLLM serves the model (its model.json)
    check_generative_traffic(settings, config, traffic, args=)   traffic a generative soak can stream
    restart_windows(traffic, minutes=, day_hours=) -> (QuietWindows | None, line)   the restart slot
    window_drain_s(settings, traffic) -> float | None   how long a generative window goes on after its traffic
    run_soak(settings, config, plan, traffic, output=, quiet=, engine=, ...) -> SoakResult   the soak (IO)
    analyze(windows, executions, meta) -> SoakFindings   the findings of a soak's tables (pure)
    last_soak(output) -> list[str]      one or two lines on the soak an output directory holds
    soak_dir, has_soak, read_meta, read_windows, read_executions, read_findings   OUTPUT/soak/

Inside: `analysis/` is pure (no server, no replay, no soak directory: import-linter holds it to that);
`_inputs` reads what a soak starts from, `_run` runs it, `_files` is its directory.

A vLLM-served model's soak (`engine`: its engine arguments) measures each window in tokens (TTFT,
TPOT, output tokens/s) with the engine's own statistics (preemptions, KV-cache use, sequences running
and waiting); its soak.json says `unit: tokens`, and `analyze` reads its windows as such.

The soak's time axis is hours of recorded traffic (the replay speed compresses them), counted from
the server's start.
"""

from __future__ import annotations

from tuner.soak._files import (
    SoakFileError,
    has_soak,
    last_soak,
    read_executions,
    read_findings,
    read_meta,
    read_windows,
    soak_dir,
)
from tuner.soak._inputs import (
    check_generative_traffic,
    restart_windows,
    soak_config,
    soak_engine,
    window_drain_s,
)
from tuner.soak._run import SoakResult, run_soak
from tuner.soak.analysis import (
    LAST_WINDOWS,
    NOT_MEASURED,
    TIME_AXIS,
    SoakFindings,
    SoakPlan,
    analyze,
    is_tokens,
    latency_column,
    make_plan,
    quiet_line,
    tpot_column,
    ttft_column,
)

__all__ = [
    "LAST_WINDOWS",
    "NOT_MEASURED",
    "TIME_AXIS",
    "SoakFileError",
    "SoakFindings",
    "SoakPlan",
    "SoakResult",
    "analyze",
    "check_generative_traffic",
    "has_soak",
    "is_tokens",
    "last_soak",
    "latency_column",
    "make_plan",
    "quiet_line",
    "read_executions",
    "read_findings",
    "read_meta",
    "read_windows",
    "restart_windows",
    "run_soak",
    "soak_config",
    "soak_dir",
    "soak_engine",
    "tpot_column",
    "ttft_column",
    "window_drain_s",
]
