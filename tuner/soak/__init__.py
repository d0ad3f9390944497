"""A soak's analysis (pure): does a configuration drift over a long run, and when to restart it.

analyze        analyze(windows, ...) -> SoakAnalysis: the whole analysis of a table of windows, with
               .table() (rows a person reads), .tables(), .text() and .as_dict() (JSON)
trend          fit_trend -> Trend: a figure's slope per hour since load, its interval, the verdict
               (`drift` / `no drift detected`), robust to an outlying window, the load as covariate
projection     crossing_time(trend, limit) -> Crossing: when the trend reaches a limit;
               capacity_trend / capacity_crossing: capacity from compute time per request
batches        batch_limits -> BatchLimits: the largest batch still succeeding, when larger ones failed
restart        quiet_windows -> QuietWindows: each day's quietest stretch of the recorded traffic;
               restart_advice -> RestartAdvice: the restart interval before the projected breach
"""

from tuner.soak._analysis import SoakAnalysis, analyze
from tuner.soak._batches import BatchLimits, SizeHistory, batch_limits
from tuner.soak._common import SoakDataError
from tuner.soak._projection import (
    ABOVE,
    BELOW,
    CapacityTrend,
    Crossing,
    Limit,
    capacity_crossing,
    capacity_trend,
    crossing_time,
)
from tuner.soak._restart import DAY_S, QuietWindow, QuietWindows, RestartAdvice, quiet_windows, restart_advice
from tuner.soak._trend import DOWN, DRIFT, IMPROVING, NO_DRIFT, UP, Trend, fit_trend, huber_fit

__all__ = [
    "ABOVE",
    "BELOW",
    "DAY_S",
    "DOWN",
    "DRIFT",
    "IMPROVING",
    "NO_DRIFT",
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
    "Trend",
    "analyze",
    "batch_limits",
    "capacity_crossing",
    "capacity_trend",
    "crossing_time",
    "fit_trend",
    "huber_fit",
    "quiet_windows",
    "restart_advice",
]
