"""tuner.traffic.windows: due times at a speed, windows, and the busiest window against brute force."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from tuner.errors import TrafficError
from tuner.traffic import busiest_window, due_offsets, parse_duration, scale_time, synth_bursty, window


def _frame(times) -> pd.DataFrame:
    times = np.asarray(times, dtype=np.float64)
    return pd.DataFrame({"timestamp": times, "batch_size": np.ones(len(times), dtype=np.int64)})


def _brute_force_busiest(off: np.ndarray, d: float) -> int:
    # every half-open window [s, s + d) for s on a fine grid and at every request time
    starts = np.concatenate([off, np.arange(-d, off[-1] + d, d / 97)])
    return max(int(((off >= s) & (off < s + d)).sum()) for s in starts)


def test_due_offsets_follow_the_definition():
    df = _frame([100.0, 100.5, 103.0])
    assert due_offsets(df).tolist() == [0.0, 0.5, 3.0]
    assert due_offsets(df, speed=2.0).tolist() == [0.0, 0.25, 1.5]
    assert due_offsets(df, speed=0.5).tolist() == [0.0, 1.0, 6.0]
    with pytest.raises(TrafficError, match="speed must be a positive number"):
        due_offsets(df, speed=0)


def test_scale_time_keeps_the_first_request_and_rows():
    df = _frame([100.0, 101.0, 104.0]).assign(seq_len=[1, 2, 3])
    out = scale_time(df, 4.0)
    assert out["timestamp"].tolist() == [100.0, 100.25, 101.0]
    assert out["seq_len"].tolist() == [1, 2, 3]
    assert df["timestamp"].tolist() == [100.0, 101.0, 104.0]  # input untouched


def test_a_speed_that_makes_requests_simultaneous_is_refused():
    # 1e16 at t0 = 100 s: gaps of a second become 1e-16 s, below what a timestamp there resolves (1.4e-14
    # s): the requests would fall on one instant and the file's rates would be nonsense
    df = _frame([100.0, 101.0, 104.0])
    with pytest.raises(TrafficError, match=r"speed 1e\+16: requests apart in the recording fall on one timestamp"):
        scale_time(df, 1e16)
    assert scale_time(df, 1e6)["timestamp"].is_monotonic_increasing  # still apart


@pytest.mark.parametrize("speed,lasts", [(1e-300, "3.5e+300 s"), (1e-10, "3.5e+10 s"), (1e-308, "inf s")])
def test_a_speed_that_stretches_past_what_a_timestamp_holds_is_refused(speed, lasts):
    df = _frame([1000.0, 1001.5, 1003.5])
    with pytest.raises(TrafficError, match=rf"^speed {speed:g}: the traffic's 3.5 s would last {re.escape(lasts)}, "
                                           "past the 292 years a time in nanoseconds can hold: a higher speed$"):
        scale_time(df, speed)


def test_a_span_already_past_292_years_may_still_be_compressed():
    df = _frame([0.0, 1.0, 1e11])
    assert scale_time(df, 2.0)["timestamp"].tolist() == [0.0, 0.5, 5e10]
    assert scale_time(df, 1.0)["timestamp"].tolist() == [0.0, 1.0, 1e11]
    assert scale_time(_frame([1000.0, 1003.5]), 1e-9)["timestamp"].tolist() == [1000.0, 1000.0 + 3.5e9]


def test_window_is_half_open_and_relative_to_the_first_request():
    df = _frame([10.0, 11.0, 12.0, 13.0, 14.0])
    assert window(df, 1.0, 2.0)["timestamp"].tolist() == [11.0, 12.0]
    assert window(df, 3.0)["timestamp"].tolist() == [13.0, 14.0]
    assert window(df, duration_s=1.5)["timestamp"].tolist() == [10.0, 11.0]
    with pytest.raises(TrafficError, match="holds no requests"):
        window(df, 100.0, 5.0)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("d", [0.05, 0.5, 3.0])
def test_busiest_window_agrees_with_brute_force(seed, d):
    df = synth_bursty(40, 20, seed=seed)
    off = df["timestamp"].to_numpy() - df["timestamp"].iloc[0]
    start, count = busiest_window(df, d)
    assert count == _brute_force_busiest(off, d)
    # and the window it names really holds that many
    assert ((off >= start) & (off < start + d)).sum() == count
    assert len(window(df, start, d)) == count


def test_busiest_window_longer_than_the_traffic_holds_everything():
    df = _frame([0.0, 1.0, 1.0, 2.0])
    assert busiest_window(df, 10.0) == (0.0, 4)
    assert busiest_window(df, 0.5) == (1.0, 2)


@pytest.mark.parametrize(
    "text,seconds",
    [
        ("90", 90.0),
        ("90s", 90.0),
        ("1.5m", 90.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("250ms", 0.25),
        (12, 12.0),
    ],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


def test_parse_duration_rejects_nonsense():
    with pytest.raises(TrafficError, match="--start: cannot read 'soon'"):
        parse_duration("soon", "--start")


@pytest.mark.parametrize("start, duration, message", [
    (-1.0, None, "window start must be >= 0 s from the first request, got -1.0"),
    (float("nan"), None, "window start must be >= 0 s from the first request, got nan"),
    (0.0, 0.0, "window duration must be a positive number of seconds, got 0.0"),
    (None, float("inf"), "window duration must be a positive number of seconds, got inf"),
])
def test_a_window_with_bad_bounds_is_refused_alike_in_a_table_and_a_recording(start, duration, message, tmp_path):
    """The table's window and the recording's (tuner.traffic.scan.read_window) check bounds as one."""
    from tuner.traffic import write_traffic
    from tuner.traffic.recording import open_recording
    from tuner.traffic.scan import read_window

    df = _frame([100.0, 101.0, 102.0])
    write_traffic(df, tmp_path / "t.parquet")
    with pytest.raises(TrafficError) as in_table:
        window(df, start, duration)
    with pytest.raises(TrafficError) as in_recording:
        read_window(open_recording(tmp_path / "t.parquet"), start, duration)
    assert str(in_table.value) == str(in_recording.value) == message


def test_a_traffic_fits_one_step_when_it_lasts_no_longer_than_a_step_and_its_warm_up_at_that_speed():
    from tuner.traffic import fits_one_step, step_window

    traffic = pd.DataFrame({"timestamp": np.arange(31) / 10.0, "seq_len": 4})  # 3 s of the recording
    assert fits_one_step(traffic, 1.0, 0.5, measured_s=2.5)        # 3 s <= 0.5 + 2.5
    assert not fits_one_step(traffic, 1.0, 0.5, measured_s=2.4)
    assert fits_one_step(traffic, 2.0, 0.5, measured_s=1.0)        # at twice the speed it lasts 1.5 s
    assert fits_one_step(traffic.iloc[:0], 1.0, 0.0, measured_s=1.0)  # nothing: nothing to choose from
    # step_window replays all of a traffic that fits, and a stretch of one that does not
    assert step_window(traffic, 1.0, 0.5, measured_s=2.5)[0] is traffic
    assert len(step_window(traffic, 1.0, 0.5, measured_s=1.0)[0]) < len(traffic)
