"""tuner.trial.step's windows: where each replay's measured window ends (pure: no server)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tuner.settings import study_from_dict
from tuner.traffic import due_offsets
from tuner.trial.step import check_measured, step_windows, whole_traffic


def study(step_s: float, warmup_s: float = 1.0):
    return study_from_dict({"name": "w", "model_repository": ".", "model": "m", "traffic": {"path": "t.csv"},
                            "replay": {"warmup_s": warmup_s},
                            "search": {"capacity": {"step_duration_s": step_s}}})


def test_a_sparse_step_ends_at_its_length_not_at_its_last_request():
    # 2 req/s for 60 s, 5 more in [30, 30.5): the busiest 10 s holds requests up to 39.5 s only
    stamps = np.sort(np.concatenate([np.arange(120) / 2.0, 30.0 + np.arange(5) / 10.0]))
    traffic = pd.DataFrame({"timestamp": stamps, "seq_len": 4})
    part, warmup, end = step_windows(traffic, study(10.0))(1.0)
    due = due_offsets(part, 1.0)
    assert end == pytest.approx(warmup + 10.0) and float(due[-1]) < end


def test_a_whole_trace_ends_at_its_last_request_when_shorter_than_asked():
    traffic = pd.DataFrame({"timestamp": np.arange(30) / 10.0, "seq_len": 4})  # due up to 2.9 s at speed 1
    assert whole_traffic(traffic, 0.5, 1.0)(1.0)[2] == pytest.approx(1.5)     # cut: the window asked for
    assert whole_traffic(traffic, 0.5, 1000.0)(1.0)[2] is None                 # all of it: its own span
    assert whole_traffic(traffic, 0.5, 1000.0)(0.1)[2] is None
    assert whole_traffic(traffic, 0.5)(1.0)[2] is None
    # a trace no longer than a step: all of it, over its own span, not the step's planned length
    part, warmup, end = step_windows(traffic, study(10.0, warmup_s=0.5))(1.0)
    assert part is traffic and warmup == 0.5 and end is None
    check_measured(step_windows(traffic, study(10.0, warmup_s=0.5)), 1.0, source="t.csv")


def test_a_measured_window_that_lasts_no_time_is_refused_naming_its_requests():
    from tuner.errors import TrafficError

    # three requests due where the 0.5 s warm-up ends, and the window ends at the last of them
    traffic = pd.DataFrame({"timestamp": [0.0, 0.25, 0.5, 0.5, 0.5], "seq_len": 4})
    with pytest.raises(TrafficError, match=r"^t.csv: the measured window has no length: at speed 1 its 3 "
                                           r"request\(s\) are all due at 0.5 s, where the warm-up ends"):
        check_measured(whole_traffic(traffic, 0.5), 1.0, source="t.csv")
    with pytest.raises(TrafficError, match="the measured window has no length"):
        check_measured(step_windows(traffic, study(10.0, warmup_s=0.5)), 1.0, source="t.csv")
    with pytest.raises(TrafficError, match="the measured window has no length"):  # longer than the traffic
        check_measured(whole_traffic(traffic, 0.5, 2.0), 1.0, source="t.csv")
    check_measured(whole_traffic(traffic, 0.25), 1.0, source="t.csv")      # 0.25 s from the warm-up's end
