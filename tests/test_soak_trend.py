"""tuner.soak.analysis: the trend test, the projected breach, the capacity trend and the batch limits, on
synthetic series whose truth is known (flat, drifting, an outlying window, drift masked by a load
change), and the fit of a table of windows in one call."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from tuner.errors import InputError
from tuner.soak.analysis import (
    DOWN,
    DRIFT,
    IMPROVING,
    NO_DRIFT,
    UP,
    Limit,
    SoakDataError,
    batch_limits,
    capacity_crossing,
    capacity_trend,
    crossing_time,
    fit_trend,
    fit_windows,
)

HOURS = 12.0


def _windows(n: int, *, seed: int, level: float = 10.0, drift_per_hour: float = 0.0, noise: float = 0.02,
             load_effect: float = -0.02, load: np.ndarray | None = None, heavy_tails: bool = False
             ) -> pd.DataFrame:
    """A soak's windows over 12 h: compute time per request = level * (1 + drift * t), lowered by a
    higher offered load (fuller batches), with relative noise; the load swings with the traffic."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) * HOURS / n
    if load is None:
        load = 50 + 20 * np.sin(2 * np.pi * t / 8 + rng.uniform(0, 2 * np.pi)) + rng.normal(0, 3, n)
    e = rng.standard_t(3, n) / np.sqrt(3) if heavy_tails else rng.normal(0, 1, n)
    value = level * (1 + drift_per_hour * t) + load_effect * (load - 50) + level * noise * e
    return pd.DataFrame({"window": np.arange(n), "t_hours": t, "offered_rps": load,
                         "compute_ms_per_request": value})


def test_a_flat_series_rarely_raises_a_false_alarm():
    # 200 seeded runs each of normal and heavy-tailed noise, small (2 %) and large (10 %), the load as
    # covariate: the 95 % interval excludes zero about 5 % of the time; the drift verdict (interval
    # AND >= 1 %/h) no more often, and almost never when the noise is small
    runs = 200
    for heavy in (False, True):
        for noise in (0.02, 0.10):
            outside = alarms = 0
            for seed in range(runs):
                df = _windows(24, seed=seed, heavy_tails=heavy, noise=noise)
                trend = fit_trend(df, "compute_ms_per_request", load="offered_rps")
                outside += trend.slope_low > 0 or trend.slope_high < 0
                alarms += trend.verdict == DRIFT
            print(f"flat, {'t3' if heavy else 'normal'} noise {noise:.0%}: interval excludes 0 in "
                  f"{outside}/{runs}, drift verdict in {alarms}/{runs}")
            assert outside / runs <= 0.09, outside
            assert alarms / runs <= (0.06 if noise > 0.05 else 0.01), alarms


def test_a_flat_series_says_no_drift_detected_with_its_figures():
    trend = fit_trend(_windows(24, seed=3), "compute_ms_per_request", load="offered_rps")
    assert trend.verdict == NO_DRIFT and trend.direction == ""
    assert trend.slope_low < 0 < trend.slope_high
    assert trend.level == pytest.approx(10.0, rel=0.02)
    assert trend.load_slope == pytest.approx(-0.02, abs=0.005)
    assert trend.windows == 24 and trend.span_hours == (0.0, pytest.approx(11.5))
    assert 0.05 < trend.p_value <= 1


def test_a_drift_is_detected_and_its_interval_holds_the_true_slope():
    runs, covered = 200, 0
    true_slope = 10.0 * 0.03  # 3 % of the level per hour
    for seed in range(runs):
        trend = fit_trend(_windows(24, seed=seed, drift_per_hour=0.03), "compute_ms_per_request",
                          load="offered_rps")
        assert trend.verdict == DRIFT and trend.direction == "up", seed
        covered += trend.slope_low <= true_slope <= trend.slope_high
    print(f"drift 3 %/h: the 95 % interval holds the true slope in {covered}/{runs}")
    assert covered / runs >= 0.90
    one = fit_trend(_windows(24, seed=0, drift_per_hour=0.03), "compute_ms_per_request", load="offered_rps")
    assert one.relative_per_hour == pytest.approx(0.03, abs=0.005)
    assert one.relative_low < one.relative_per_hour < one.relative_high
    assert one.p_value < 1e-6


def test_a_figure_getting_better_with_age_is_improving_not_a_drift():
    # a compute time that falls 3 %/h (a server still warming up): an alarm only where down is worse
    falling = _windows(24, seed=2, drift_per_hour=-0.03)
    either = fit_trend(falling, "compute_ms_per_request", load="offered_rps")
    assert either.verdict == DRIFT and either.direction == "down"
    better = fit_trend(falling, "compute_ms_per_request", load="offered_rps", worse=UP)
    assert better.verdict == IMPROVING and not better.drifting and better.direction == ""
    assert better.relative_per_hour == pytest.approx(-0.03, abs=0.005)
    assert fit_trend(falling, "compute_ms_per_request", load="offered_rps", worse=DOWN).verdict == DRIFT
    rising = fit_trend(_windows(24, seed=2, drift_per_hour=0.03), "compute_ms_per_request",
                       load="offered_rps", worse=UP)
    assert rising.verdict == DRIFT and rising.as_dict()["worse"] == UP
    # an improving figure projects no breach of its limit
    assert crossing_time(better, Limit(5.0, bad="below")) is None
    with pytest.raises(SoakDataError, match="worse must be 'up', 'down' or None, got 'higher'"):
        fit_trend(falling, "compute_ms_per_request", worse="higher")


def test_a_drift_below_the_practical_threshold_is_not_called_drift():
    # 0.3 %/h is real (the interval excludes zero with this little noise) but below 1 %/h
    df = _windows(48, seed=1, drift_per_hour=0.003, noise=0.002)
    trend = fit_trend(df, "compute_ms_per_request", load="offered_rps")
    assert trend.slope_low > 0
    assert trend.verdict == NO_DRIFT
    strict = fit_trend(df, "compute_ms_per_request", load="offered_rps", min_drift_per_hour=0.001)
    assert strict.verdict == DRIFT


def test_one_outlying_window_neither_makes_nor_hides_a_drift():
    # a flat series whose last window is three times the level (a pause): least squares reads a drift
    flat = _windows(24, seed=5, load_effect=0.0)
    flat.loc[23, "compute_ms_per_request"] *= 3
    t, y = flat["t_hours"].to_numpy(), flat["compute_ms_per_request"].to_numpy()
    ols_slope = np.polyfit(t, y, 1)[0]
    assert ols_slope / 10.0 > 0.02  # the outlier alone would make a 2 %/h drift of it
    robust = fit_trend(flat, "compute_ms_per_request")
    assert robust.verdict == NO_DRIFT
    assert abs(robust.relative_per_hour) < 0.005
    assert robust.downweighted >= 1

    # a drifting series whose first window is slow (a warm-up): the slope stays right
    drifting = _windows(24, seed=6, drift_per_hour=0.02)
    drifting.loc[0, "compute_ms_per_request"] *= 3
    trend = fit_trend(drifting, "compute_ms_per_request", load="offered_rps")
    assert trend.verdict == DRIFT
    assert trend.slope_low <= 0.2 <= trend.slope_high
    t, y = drifting["t_hours"].to_numpy(), drifting["compute_ms_per_request"].to_numpy()
    assert np.polyfit(t, y, 1)[0] < 0.1  # least squares would halve it or worse


def _load_change(seed: int, *, per_hour: float, start: float) -> np.ndarray:
    """An offered load that moves through the soak, with the traffic's swings around the move."""
    rng = np.random.default_rng(seed)
    t = np.arange(36) * HOURS / 36
    return start + per_hour * t + 8 * np.sin(2 * np.pi * t / 3) + rng.normal(0, 2, len(t))


def test_the_load_covariate_unmasks_a_drift_hidden_by_a_rising_load():
    # compute per request drifts up 2 %/h, but the load rises through the soak (night into day) and
    # fuller batches bring compute per request down as fast: without the load it looks flat
    runs, right, masked, covered = 100, 0, 0, 0
    for seed in range(runs):
        load = _load_change(seed, per_hour=5, start=20)
        df = _windows(36, seed=1000 + seed, drift_per_hour=0.02, load=load, load_effect=-0.04, noise=0.01)
        masked += fit_trend(df, "compute_ms_per_request").verdict == NO_DRIFT
        fair = fit_trend(df, "compute_ms_per_request", load="offered_rps")
        right += fair.verdict == DRIFT and fair.direction == "up"
        covered += fair.slope_low <= 0.2 <= fair.slope_high
    print(f"drift under a rising load: hidden without the covariate in {masked}/{runs}, found with it in "
          f"{right}/{runs}, true slope in the interval in {covered}/{runs}")
    assert masked / runs >= 0.9
    assert right == runs
    assert covered / runs >= 0.88


def test_the_load_covariate_keeps_a_falling_load_from_passing_for_drift():
    # no drift, but the load falls through the soak (day into night): emptier batches raise compute
    # per request, which alone reads as drift
    runs, fooled, right = 100, 0, 0
    for seed in range(runs):
        load = _load_change(seed, per_hour=-5, start=80)
        df = _windows(36, seed=2000 + seed, load=load, load_effect=-0.04, noise=0.01)
        fooled += fit_trend(df, "compute_ms_per_request").verdict == DRIFT
        fair = fit_trend(df, "compute_ms_per_request", load="offered_rps")
        right += fair.verdict == NO_DRIFT
        assert fair.load_slope == pytest.approx(-0.04, abs=0.012)
    print(f"a falling load, no drift: drift without the covariate in {fooled}/{runs}, "
          f"no drift detected with it in {right}/{runs}")
    assert fooled / runs >= 0.9
    assert right == runs


def test_counts_that_start_at_zero_drift_only_when_they_grow():
    t = np.arange(24) * 0.5
    df = pd.DataFrame({"t_hours": t, "errors": 0, "spike": [0] * 23 + [5],
                       "failed_batches": [0] * 12 + list(range(1, 13))})
    assert fit_trend(df, "errors").verdict == NO_DRIFT
    spike = fit_trend(df, "spike")
    assert spike.verdict == NO_DRIFT and np.isnan(spike.relative_per_hour)
    assert "threshold is taken against the mean of spike" in spike.notes[0]
    growing = fit_trend(df, "failed_batches")
    assert growing.verdict == DRIFT and growing.direction == "up"


def _line(level: float, slope: float, n: int = 20, wobble: float = 0.5) -> pd.DataFrame:
    t = np.arange(n) * 0.5
    return pd.DataFrame({"t_hours": t, "p99_ms": level + slope * t + wobble * (-1.0) ** np.arange(n)})


def test_the_crossing_matches_the_hand_computed_time_and_interval():
    # p99 = 100 + 5 t ms: it reaches an SLA of 200 ms at t = 20 h
    trend = fit_trend(_line(100, 5), "p99_ms")
    c = crossing_time(trend, 200)
    assert c is not None and c.bad == "above" and not c.already
    assert c.hours == pytest.approx(20.0, rel=0.01)
    assert c.hours == pytest.approx((200 - trend.level) / trend.slope_per_hour)
    assert c.low_hours == pytest.approx((200 - trend.level) / trend.slope_high)
    assert c.high_hours == pytest.approx((200 - trend.level) / trend.slope_low)
    assert c.low_hours < c.hours < c.high_hours
    # the same series read against a floor it moves away from, and a falling one against a floor
    assert crossing_time(trend, 50) is None
    falling = fit_trend(_line(100, -5), "p99_ms")
    down = crossing_time(falling, 40)
    assert down.bad == "below" and down.hours == pytest.approx(12.0, rel=0.01)
    assert down.low_hours < down.hours < down.high_hours
    json.dumps(c.as_dict(), allow_nan=False)


def test_the_projected_capacity_breach_lands_near_the_true_one_under_noise():
    # 3 %/h on compute per request, 40 req/s fresh, 30 to serve: the truth is (4/3 - 1) / 0.03 = 11.1 h
    truth, runs = (40 / 30 - 1) / 0.03, 200
    errors, covered = [], 0
    for seed in range(runs):
        trend = fit_trend(_windows(24, seed=seed, drift_per_hour=0.03), "compute_ms_per_request",
                          load="offered_rps")
        c = capacity_crossing(trend, capacity_rps=40.0, rate_rps=30.0)
        errors.append(abs(c.hours / truth - 1))
        covered += c.low_hours <= truth <= c.high_hours
    errors = np.asarray(errors)
    print(f"capacity breach, truth {truth:.1f} h: error p95 {np.quantile(errors, 0.95):.1%}, max {errors.max():.1%}; "
          f"the interval holds the truth in {covered}/{runs} (the level's own uncertainty is left out)")
    assert (errors <= 0.25).mean() >= 0.95
    assert covered / runs >= 0.85


def test_no_drift_projects_no_crossing_but_a_broken_limit_is_reported_at_once():
    flat = fit_trend(_windows(24, seed=3), "compute_ms_per_request", load="offered_rps")
    assert crossing_time(flat, 12.0) is None
    already = crossing_time(flat, Limit(8.0, bad="above"))
    assert already.already and already.hours == 0.0
    with pytest.raises(SoakDataError, match="bad must be 'above' or 'below'"):
        crossing_time(flat, Limit(12.0, bad="over"))


def test_capacity_follows_one_over_compute_time_and_drops_below_the_rate_when_computed():
    # compute per request 2 ms + 0.05 ms/h; 100 req/s fresh: 80 req/s needs compute <= 2.5 ms: at 10 h
    t = np.arange(24) * 0.5
    df = pd.DataFrame({"t_hours": t, "compute_ms_per_request": 2.0 + 0.05 * t + 0.002 * (-1.0) ** np.arange(24)})
    compute = fit_trend(df, "compute_ms_per_request")
    cap = capacity_trend(compute, 100.0)
    assert cap.at(0.0) == pytest.approx(100.0)
    assert cap.at(10.0) == pytest.approx(80.0, rel=0.01)
    assert cap.relative_per_hour == pytest.approx(-0.025, rel=0.01)
    c = capacity_crossing(compute, capacity_rps=100.0, rate_rps=80.0)
    assert c.figure == "capacity_rps" and c.bad == "below"
    assert c.hours == pytest.approx(10.0, rel=0.01)
    assert c.low_hours < c.hours < c.high_hours
    assert cap.crossing(80.0) == c
    assert capacity_crossing(compute, capacity_rps=70.0, rate_rps=80.0).already
    with pytest.raises(SoakDataError, match="rate_rps must be a positive number"):
        capacity_crossing(compute, capacity_rps=100.0, rate_rps=0)


def test_too_few_windows_or_a_load_in_step_with_time_is_one_clear_error():
    df = _windows(24, seed=0)
    with pytest.raises(SoakDataError, match=r"needs at least 5 windows with a value, got 3"):
        fit_trend(df.head(3), "compute_ms_per_request")
    stepped = df.assign(offered_rps=10 + 2 * df["t_hours"])
    with pytest.raises(SoakDataError, match="offered_rps changes in step with t_hours"):
        fit_trend(stepped, "compute_ms_per_request", load="offered_rps")
    with pytest.raises(SoakDataError, match=r"no column 'p99_ms' \(columns found: window, t_hours"):
        fit_trend(df, "p99_ms")
    assert issubclass(SoakDataError, InputError)
    constant = fit_trend(df.assign(offered_rps=50.0), "compute_ms_per_request", load="offered_rps")
    assert constant.load is None and "the same in every window" in constant.notes[0]


def _fragmenting(windows: int = 24, seed: int = 0) -> dict:
    """Batch histograms of a server whose memory budget shrinks: size s fails from window first_fail[s]."""
    rng = np.random.default_rng(seed)
    first_fail = {16: 6, 15: 9, 14: 12, 13: 15, 12: 18}
    out = {}
    for w in range(windows):
        sizes = {}
        for size in range(1, 17):
            tries = int(rng.poisson(8 if size <= 8 else 2))
            if tries == 0:
                continue
            fails = tries if w >= first_fail.get(size, windows + 1) else 0
            sizes[size] = (tries - fails, fails)
        out[w] = sizes
    return out


def test_batch_limits_name_the_largest_size_that_still_succeeds_and_when_larger_ones_failed():
    hist = _fragmenting()
    limits = batch_limits(hist, last=3)
    assert limits.largest_recent == 11 and limits.largest_ever == 16
    assert limits.smallest_failing == 12
    firsts = {}
    for size in (12, 13, 14, 15, 16):  # the first window where that size was tried and failed
        firsts[size] = min(w for w, sizes in hist.items() if sizes.get(size, (0, 0))[1] > 0)
    assert limits.first_failures == firsts
    assert all(firsts[s] >= f for s, f in {16: 6, 15: 9, 14: 12, 13: 15, 12: 18}.items())
    table = limits.table()
    assert table["size"].tolist() == [11, 12, 13, 14, 15, 16]
    assert set(table.loc[table["size"] > 11, "status"]) == {"stopped succeeding"}
    # the same counts as a long table give the same answer
    long = pd.DataFrame([(w, s, ok, bad) for w, sizes in hist.items() for s, (ok, bad) in sizes.items()],
                        columns=["window", "size", "successes", "failures"])
    assert batch_limits(long, last=3) == limits
    json.dumps(limits.as_dict(), allow_nan=False)


def test_batch_limits_refuse_bad_counts_by_window_and_column():
    with pytest.raises(SoakDataError, match=r"window 2, column 'failures': must be a whole number >= 0, got -1"):
        batch_limits({1: {4: (3, 0)}, 2: {4: (3, -1)}})
    with pytest.raises(SoakDataError, match="no column 'failures'"):
        batch_limits(pd.DataFrame({"window": [0], "size": [1], "successes": [1]}))
    with pytest.raises(SoakDataError, match="no executions recorded"):
        batch_limits({})


def test_fit_windows_reads_a_soak_table_in_one_call():
    rng = np.random.default_rng(2)
    df = _windows(36, seed=2, drift_per_hour=0.03)
    df["p99_ms"] = 80 + 2.0 * df["t_hours"] + rng.normal(0, 1.5, len(df))
    df["fill_rate"] = 0.6 + rng.normal(0, 0.02, len(df))
    result = fit_windows(df, limits={"p99_ms": 200.0}, capacity_rps=40.0, rate_rps=30.0,
                     executions=_fragmenting())
    assert [t.figure for t in result.trends] == ["compute_ms_per_request", "p99_ms", "fill_rate"]
    assert result.verdict == DRIFT
    assert result.trend("fill_rate").verdict == NO_DRIFT
    # capacity 40 -> 30 req/s when compute per request is 4/3 of its level: 1/3 / 3 %/h = 11.1 h,
    # p99 reaches 200 ms after 60 h: the capacity is the breach
    assert result.breach.figure == "capacity_rps"
    assert result.breach.hours == pytest.approx((4 / 3 - 1) / 0.03, rel=0.15)
    table = result.table()
    assert table["figure"].tolist() == ["compute_ms_per_request", "p99_ms", "fill_rate",
                                        "capacity_rps (from compute_ms_per_request)"]
    assert table["limit"].tolist() == ["", "> 200", "", "< 30"]
    assert table.loc[1, "breach h"] == pytest.approx(60.0, rel=0.15)
    assert set(result.tables()) == {"trends", "batches", "restart"}
    assert "capacity_rps" in result.text()
    doc = json.loads(json.dumps(result.as_dict(), allow_nan=False))
    assert doc["verdict"] == "drift" and doc["batches"]["largest_recent"] == 11
    assert doc["restart"]["action"] == "restart"
    with pytest.raises(SoakDataError, match="limit on 'p50_ms': no such figure"):
        fit_windows(df, limits={"p50_ms": 100.0})
    with pytest.raises(SoakDataError, match="needs both capacity_rps and rate_rps"):
        fit_windows(df, capacity_rps=40.0)


def test_fit_windows_without_a_load_column_fits_without_it_and_says_so():
    df = _windows(24, seed=4).drop(columns=["offered_rps"])
    result = fit_windows(df)
    assert result.verdict == NO_DRIFT
    assert result.trends[0].load is None
    assert "no column 'offered_rps'" in result.trends[0].notes[-1]
    assert result.restart is None and result.breach is None
