"""tuner.files: the values JSON outputs hold."""

from __future__ import annotations

import json
import math

import numpy as np

from tuner.files import json_safe


def test_json_safe_turns_unmeasured_figures_into_null_and_numpy_into_plain_numbers():
    data = {"capacity": math.nan, "peak": math.inf, 4: np.float64(1.5), "sizes": (np.int64(3), -math.inf),
            "nested": [{"p99": np.float32(2.0)}]}
    safe = json_safe(data)
    assert safe == {"capacity": None, "peak": None, "4": 1.5, "sizes": [3, None], "nested": [{"p99": 2.0}]}
    assert json.loads(json.dumps(safe, allow_nan=False)) == safe  # strict JSON: no NaN token
