"""One trial, by level: what it is (pure) and how it is run on a server (IO), one module per level.

    record     TrialRecord and its parts (Figures, Bracket, Warmup), `Evaluate` (params, Hints) ->
               TrialRecord, `assess` (a measured trial's record), the record as Optuna attributes (pure)
    capacity   the capacity search: `Probe` (speed -> Measurement), `find_capacity`, `Hints` (pure)
    step       the measurement step on a server: one replay of a window, measured, with its retry and
               repeat policies -> a Probe (`make_probe`)
    warmup     a freshly loaded configuration brought to steady state before it is measured
    run        a trial on a server: apply the configuration, warm it, measure it (`make_evaluate`,
               `make_measure`, `session`)

Below it: `tuner.measurement` (one replay's figures), `tuner.score` (the SLA check and the scores),
`tuner.study` (the study's traffic and base config). This front door re-exports the pure levels
only: importing it starts no server and loads no replay; the IO levels are imported by their names
(`from tuner.trial.run import session`).
"""

from tuner.trial.capacity import Capacity, Hints, Probe, Step, find_capacity
from tuner.trial.record import (
    CRASHED,
    MEASURED,
    NO_VERDICT,
    REFUSED,
    UNMEASURED,
    UNSTABLE,
    Bracket,
    Evaluate,
    Figures,
    TrialRecord,
    Warmup,
    assess,
    from_attrs,
    is_feasible,
    record_of,
    to_attrs,
)

__all__ = [
    "CRASHED", "REFUSED", "MEASURED", "NO_VERDICT", "UNMEASURED", "UNSTABLE", "Bracket", "Capacity", "Evaluate", "Figures",
    "Hints", "Probe", "Step", "TrialRecord", "Warmup", "assess", "find_capacity", "from_attrs", "is_feasible",
    "record_of", "to_attrs",
]
