"""tuner.soak.analysis: each day's quietest window of the recorded traffic against a brute-force scan of every
start second (the shipped diurnal profile included), and the restart interval a projected breach
implies."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tuner.errors import TrafficError
from tuner.soak.analysis import Crossing, SoakDataError, fit_windows, quiet_windows, restart_advice
from tuner.traffic import read_traffic, synth_diurnal, validate_traffic

ROOT = Path(__file__).resolve().parents[1]
DIURNAL = ROOT / "traffic_profiles" / "diurnal_day_in_10m.csv"


def _offsets(traffic: pd.DataFrame) -> np.ndarray:
    ts = np.sort(traffic["timestamp"].to_numpy(dtype=np.float64))
    return ts - ts[0]


def _brute_force(off: np.ndarray, start: int, stop: int, length: int) -> tuple[int, int]:
    """The earliest whole-second start in [start, stop - length] whose [s, s + length) holds the
    fewest requests, counting every window one by one."""
    best_s, best_n = -1, None
    for s in range(start, stop - length + 1):
        n = int(np.count_nonzero((off >= s) & (off < s + length)))
        if best_n is None or n < best_n:
            best_s, best_n = s, n
    return best_s, best_n


@pytest.mark.parametrize("length_s", [300, 60, 17])
def test_the_diurnal_profiles_quiet_window_is_its_quietest_stretch(length_s):
    # the shipped profile plays a day in ten minutes: its day is the recording (period 600 s)
    traffic = read_traffic(DIURNAL)
    off = _offsets(traffic)
    quiet = quiet_windows(traffic, length_s=length_s, period_s=600)
    assert len(quiet.windows) == 1
    (w,) = quiet.windows
    start, count = _brute_force(off, 0, int(np.floor(off[-1])), length_s)
    print(f"diurnal_day_in_10m, {length_s} s: quiet window at {w.start_s:g} s with {w.requests:g} requests "
          f"({w.rps:.1f}/s against {w.day_rps:.1f}/s for the day); brute force: {start} s, {count}")
    assert (w.start_s, w.requests) == (start, count)
    assert quiet.slot_offset_s == start and quiet.slot_requests == count
    assert w.rps < (0.6 if length_s <= 60 else 0.9) * w.day_rps  # the profile's night, below the day's mean
    # with the default period the recording (shorter than a day) is one day, and the same window
    default = quiet_windows(traffic, length_s=length_s)
    assert [(x.start_s, x.requests) for x in default.windows] == [(start, count)]


def _per_second_scan(off: np.ndarray, start: int, stop: int, length: int) -> tuple[int, int]:
    """The same scan, by whole-second bins: a request is in [s, s + length) exactly when its second
    floor(offset) is in s .. s + length - 1 (s and length whole)."""
    bins = np.bincount(np.floor(off).astype(np.int64), minlength=stop + length + 1)
    counts = np.convolve(bins, np.ones(length, dtype=np.int64), mode="full")[length - 1:]
    window = counts[start: stop - length + 1]
    best = int(np.argmin(window))
    return start + best, int(window[best])


def test_each_day_of_a_multi_day_recording_gets_its_quietest_window_and_a_daily_slot():
    # 2.5 days of a diurnal rate (peak 14:00, trough 02:00) at a low rate, with the nights moved
    traffic = synth_diurnal(0.3, 2.5 * 86400, seed=4, period_s=86400, amplitude=0.8)
    off = _offsets(traffic)
    length = 300
    quiet = quiet_windows(traffic, length_s=length)
    assert [w.day for w in quiet.windows] == [0, 1, 2]
    end = off[-1]
    for w in quiet.windows:
        a = w.day * 86400
        b = int(np.floor(min(a + 86400, end)))
        start, count = _per_second_scan(off, a, b, length)
        assert (w.start_s, w.requests) == (start, count), w
        assert w.offset_s == w.start_s - a
    # the first day checked by counting every window one by one as well (over its night, to be quick)
    first = quiet.windows[0]
    s, n = _brute_force(off, 0, 6 * 3600, length)
    assert n >= first.requests and (n > first.requests or s == first.start_s)
    # the daily slot: the offset into the day with the fewest requests averaged over the days holding it
    bins = np.bincount(np.floor(off).astype(np.int64), minlength=3 * 86400 + length)
    sums = np.convolve(bins, np.ones(length, dtype=np.int64), mode="full")[length - 1:]
    days_with = [(d * 86400, min(d * 86400 + 86400, end)) for d in range(3)]
    offsets = np.arange(86400 - length + 1)
    total = np.zeros(len(offsets))
    covering = np.zeros(len(offsets))
    for a, b in days_with:
        inside = a + offsets + length <= b
        total[inside] += sums[a + offsets[inside]]
        covering[inside] += 1
    mean = np.where(covering > 0, total / np.maximum(covering, 1), np.inf)
    assert quiet.slot_offset_s == int(np.argmin(mean))
    assert quiet.slot_requests == pytest.approx(float(mean.min()))
    assert 0 <= quiet.slot_offset_s < 6 * 3600  # in the night
    table = quiet.table()
    assert table["day"].tolist() == [1, 2, 3, "daily slot"]
    json.dumps(quiet.as_dict(), allow_nan=False)


def test_iso_timestamps_give_the_windows_clock_time_and_weights_count_rows():
    # a quiet stretch from 03:00 to 03:10 UTC in a recording that starts at 00:00 UTC
    stamps = pd.date_range("2024-05-01T00:00:00Z", "2024-05-01T06:00:00Z", freq="2s")
    stamps = stamps[(stamps < "2024-05-01T03:00:00Z") | (stamps >= "2024-05-01T03:10:00Z")]
    raw = pd.DataFrame({"timestamp": stamps.strftime("%Y-%m-%dT%H:%M:%SZ"),
                        "batch_size": np.where(np.arange(len(stamps)) % 2 == 0, 1, 4)})
    traffic = validate_traffic(raw, "iso.csv")
    quiet = quiet_windows(traffic, length_s=600)
    (w,) = quiet.windows
    # the earliest empty window: from just after the last request before the gap (02:59:58)
    assert (w.start_s, w.requests) == (3 * 3600 - 1, 0.0)
    assert quiet.table().loc[0, "clock (UTC)"] == "2024-05-01 02:59:59"
    weighed = quiet_windows(traffic, length_s=1200, weight="batch_size")
    assert weighed.windows[0].requests == sum(raw["batch_size"].iloc[5400 - 300: 5400])  # 02:50-03:10


def test_quiet_windows_refuse_what_cannot_be_scanned():
    traffic = read_traffic(DIURNAL)
    with pytest.raises(TrafficError, match=r"spans 599.86\d* s, shorter than the window of 900 s"):
        quiet_windows(traffic, length_s=900, period_s=1200)
    with pytest.raises(TrafficError, match=r"length_s <= period_s must hold, but got \(length_s=700, period_s=600\)"):
        quiet_windows(traffic, length_s=700, period_s=600)
    with pytest.raises(TrafficError, match="step_s must be a positive number"):
        quiet_windows(traffic, step_s=0)
    with pytest.raises(TrafficError, match="no column 'tokens'"):
        quiet_windows(traffic, weight="tokens")


def _breach(hours: float, low: float | None = None, high: float | None = None) -> Crossing:
    return Crossing(figure="capacity_rps", limit=30.0, bad="below", level=40.0, hours=hours, low_hours=low or 0.9 * hours, high_hours=high or 1.1 * hours, confidence=0.95)


def test_the_restart_interval_is_the_breach_less_the_margin_rounded_down():
    quiet = quiet_windows(synth_diurnal(0.3, 2 * 86400, seed=1), length_s=300)
    days = restart_advice(_breach(100.0), quiet)           # 80 h: every 3 days, in the daily slot
    assert (days.action, days.every, days.unit, days.interval_hours) == ("restart", 3, "day", 72.0)
    assert days.slot_offset_s == quiet.slot_offset_s and days.length_s == 300
    assert "restart every 3 days, in the quiet window" in days.reason
    hours = restart_advice(_breach(10.0), quiet)           # 8 h
    assert (hours.every, hours.unit, hours.interval_hours) == (8, "hour", 8.0)
    assert hours.slot_offset_s is None and "not every restart falls in the quiet window" in hours.reason
    minutes = restart_advice(_breach(0.5), quiet, margin=0.1)  # 27 min
    assert (minutes.every, minutes.unit) == (27, "minute")
    early = restart_advice(_breach(100.0, low=40.0), quiet, basis="early")  # 32 h: every day
    assert (early.every, early.unit, early.basis_hours) == (1, "day", 40.0)
    assert restart_advice(_breach(0.01), quiet).action == "restart does not help"
    assert restart_advice(None, quiet).action == "none"
    already = Crossing(figure="p99_ms", limit=200.0, bad="above", level=250.0, hours=0.0, low_hours=0.0, high_hours=0.0, confidence=0.95, already=True)
    assert restart_advice(already, quiet).action == "restart does not help"
    with pytest.raises(SoakDataError, match="margin must be a fraction in"):
        restart_advice(_breach(10.0), quiet, margin=1.5)
    assert days.table()["what"].tolist() == ["advice", "projected breach", "restart interval", "restart window"]
    json.dumps(days.as_dict(), allow_nan=False)


def test_a_compressed_day_counts_restart_days_in_its_own_period():
    # a day played in ten minutes: a breach after 1 h of traffic is 6 such days; 20 % less: 4 days
    quiet = quiet_windows(read_traffic(DIURNAL), length_s=60, period_s=600)
    advice = restart_advice(_breach(1.0), quiet)
    assert (advice.every, advice.unit) == (4, "day")
    assert advice.interval_hours == pytest.approx(4 * 600 / 3600)


def test_fit_windows_gives_the_restart_advice_from_its_breach_and_the_traffic():
    t = np.arange(24) * 0.5
    windows = pd.DataFrame({"t_hours": t, "compute_ms_per_request": 2.0 + 0.01 * t + 0.001 * (-1.0) ** np.arange(24)})
    traffic = synth_diurnal(0.3, 2 * 86400, seed=2)
    # a slow drift (0.5 %/h), called drift here with a lower practical threshold
    assert fit_windows(windows, capacity_rps=40.0, rate_rps=30.0).breach is None
    result = fit_windows(windows, capacity_rps=40.0, rate_rps=30.0, traffic=traffic, min_drift_per_hour=0.002)
    # compute reaches 4/3 of 2 ms, i.e. +0.667 ms, at 0.01 ms/h: 66.7 h; less 20 %: 53.3 h: 2 days
    assert result.breach.hours == pytest.approx(66.7, rel=0.01)
    assert (result.restart.every, result.restart.unit) == (2, "day")
    assert result.restart.slot_offset_s == result.quiet.slot_offset_s
    assert set(result.tables()) == {"trends", "quiet windows", "restart"}
    json.dumps(result.as_dict(), allow_nan=False)
