"""A soak's analysis (pure): what a soak replays, what each window measured, does the configuration
drift over the run, and when to restart it. No server, no replay, no soak directory: `tuner.soak`
does those.

findings       analyze(windows, executions, meta, ...) -> SoakFindings: the one analysis of a soak's
               tables (its own columns, soak.json's SLA and capacity), with .tables(), .text() and
               .as_dict() (findings.json); summary_lines: one or two lines for the audit and nightly
fit            fit_windows(windows, ...) -> SoakAnalysis: the step `analyze` takes, on a table of any
               columns: trends, breaches, batches, quiet windows, restart advice
trend          fit_trend -> Trend: a figure's slope per hour since load, its interval, the verdict
               (`drift` / `no drift detected`), robust to an outlying window, the load as covariate
projection     crossing_time(trend, limit) -> Crossing: when the trend reaches a limit;
               capacity_trend / capacity_crossing: capacity from compute time per request
batches        batch_limits -> BatchLimits: the largest batch still succeeding, when larger ones failed
restart        quiet_windows -> QuietWindows: each day's quietest stretch of the recorded traffic;
               restart_advice -> RestartAdvice: the restart interval before the projected breach
plan           make_plan -> SoakPlan: how the soak is cut into windows; window_traffic: one window of
               the repeated recording
windows        one window's figures from its measurement (the row windows.csv gets: `_run` builds it
               there), its executions split into successes and failures, the compute time at a fixed
               batch mix
tokens         a generative soak's (a vLLM-served model's) window in tokens: TTFT, TPOT, tokens, the
               engine's own statistics (preemptions, KV-cache use, sequences); the figures, limits and
               engine table its findings read (`analyze` takes them when soak.json's unit is `tokens`)
"""

from tuner.soak.analysis._batches import BatchLimits, SizeHistory, batch_limits
from tuner.soak.analysis._common import SoakDataError
from tuner.soak.analysis._findings import (
    LAST_WINDOWS,
    SoakFindings,
    analyze,
    observed_break,
    quiet_line,
    summary_lines,
)
from tuner.soak.analysis._fit import SoakAnalysis, fit_windows
from tuner.soak.analysis._plan import (
    MIN_WINDOWS,
    TIME_AXIS,
    SoakPlan,
    cycle_length,
    make_plan,
    window_traffic,
)
from tuner.soak.analysis._projection import (
    ABOVE,
    BELOW,
    CapacityTrend,
    Crossing,
    Limit,
    capacity_crossing,
    capacity_trend,
    crossing_time,
)
from tuner.soak.analysis._restart import (
    DAY_S,
    QuietWindow,
    QuietWindows,
    RestartAdvice,
    quiet_windows,
    restart_advice,
)
from tuner.soak.analysis._tokens import NOT_MEASURED, is_tokens, tpot_column, ttft_column
from tuner.soak.analysis._trend import DOWN, DRIFT, IMPROVING, NO_DRIFT, UP, Trend, fit_trend, huber_fit
from tuner.soak.analysis._windows import (
    CAPACITY_FIGURE,
    TREND_FIGURES,
    fixed_mix,
    latency_column,
    split_failures,
)

__all__ = [
    "ABOVE",
    "BELOW",
    "CAPACITY_FIGURE",
    "DAY_S",
    "DOWN",
    "DRIFT",
    "IMPROVING",
    "LAST_WINDOWS",
    "MIN_WINDOWS",
    "NOT_MEASURED",
    "NO_DRIFT",
    "TIME_AXIS",
    "TREND_FIGURES",
    "UP",
    "BatchLimits",
    "CapacityTrend",
    "Crossing",
    "Limit",
    "QuietWindow",
    "QuietWindows",
    "RestartAdvice",
    "SizeHistory",
    "SoakAnalysis",
    "SoakDataError",
    "SoakFindings",
    "SoakPlan",
    "Trend",
    "analyze",
    "batch_limits",
    "capacity_crossing",
    "capacity_trend",
    "crossing_time",
    "cycle_length",
    "fit_trend",
    "fit_windows",
    "fixed_mix",
    "huber_fit",
    "is_tokens",
    "latency_column",
    "make_plan",
    "observed_break",
    "quiet_line",
    "quiet_windows",
    "restart_advice",
    "split_failures",
    "summary_lines",
    "tpot_column",
    "ttft_column",
    "window_traffic",
]
