"""Open-loop replay of recorded traffic against a Triton model, with Locust (see `_run.replay`).

The only package of tuner that imports locust and gevent, and only in its load-generator processes
(`python -m tuner.replay`, module `_worker`). Names are imported lazily so that starting such a
process does not load this side's modules before Locust has monkey-patched it.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "send_one_by_one": "tuner.replay._sequential",
    "send_together": "tuner.replay._sequential",
    "check_fits": "tuner.replay._sequential",
    "Sent": "tuner.replay._sequential",
    "replay": "tuner.replay._run",
    "ReplayResult": "tuner.replay._run",
    "records_table": "tuner.replay._run",
    "RECORDS_FRONT": "tuner.replay._run",
    "choose_workers": "tuner.replay._calibrate",
    "calibrate": "tuner.replay._calibrate",
    "Calibration": "tuner.replay._calibrate",
    "MAX_REQUEST_BYTES": "tuner.replay._plan",
    "plan_requests": "tuner.replay._plan",
    "describe_inputs": "tuner.replay._plan",
    "ignored_columns": "tuner.replay._plan",
    "RequestPlan": "tuner.replay._plan",
    "peak_rate": "tuner.replay._plan",
    "model_info": "tuner.replay._plan",
    "statistics": "tuner.replay._plan",
    "plan_generate": "tuner.replay._generate",
    "GeneratePlan": "tuner.replay._generate",
    "is_generative_model": "tuner.replay._generate",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'tuner.replay' has no attribute {name!r}")
