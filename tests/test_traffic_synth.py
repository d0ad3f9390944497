"""tuner.traffic.synth: each arrival process measures as asked, sizes follow their spec, seeds repeat."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from tuner.cli import main
from tuner.errors import TrafficError
from tuner.traffic import (
    SizeSpec,
    busiest_window,
    describe,
    synth_bursty,
    synth_diurnal,
    synth_flash_crowd,
    synth_poisson,
)
from tuner.traffic.synth import MAX_ROWS


@pytest.mark.parametrize("rate,seed", [(100.0, 1), (250.0, 7), (20.0, 3)])
def test_poisson_rate_and_cv_within_5_percent(rate, seed):
    df = synth_poisson(rate, 60_000 / rate, seed=seed)  # about 60,000 requests
    stats = describe(df)
    assert stats["mean_rps"] == pytest.approx(rate, rel=0.05)
    assert stats["interarrival_cv"] == pytest.approx(1.0, rel=0.05)


def test_bursty_has_cv_above_2_and_the_asked_mean():
    df = synth_bursty(150.0, 600.0, seed=2)
    stats = describe(df)
    assert stats["interarrival_cv"] > 2
    assert stats["mean_rps"] == pytest.approx(150.0, rel=0.10)
    assert stats["peak_rps"] > 3 * 150


def test_diurnal_rate_follows_the_compressed_day():
    df = synth_diurnal(100.0, 600.0, seed=1, period_s=600.0, amplitude=0.5, peak_at_s=150.0)
    t = df["timestamp"].to_numpy()
    per_minute = np.histogram(t, bins=np.arange(0, 601, 60))[0] / 60.0
    expected = [
        100 * (1 + 0.5 * np.mean(np.cos(2 * np.pi * (np.linspace(a, a + 60, 601) - 150) / 600)))
        for a in range(0, 600, 60)
    ]
    assert np.allclose(per_minute, expected, rtol=0.1)
    assert describe(df)["mean_rps"] == pytest.approx(100.0, rel=0.05)


def test_flash_crowd_peaks_where_asked():
    df = synth_flash_crowd(20.0, 120.0, seed=4, peak_factor=10.0, spike_at_s=40.0, ramp_s=5.0, hold_s=10.0)
    start, count = busiest_window(df, 10.0)
    assert 40.0 <= start <= 50.0
    assert count / 10.0 == pytest.approx(200.0, rel=0.15)
    before = ((df["timestamp"] > 5) & (df["timestamp"] < 35)).sum() / 30.0
    assert before == pytest.approx(20.0, rel=0.25)


def test_same_seed_same_table_other_seed_other_table():
    sizes = {"seq_len": "lognormal:median=200,sigma=0.7,max=512", "batch_size": "zipf:a=1.2,max=16"}
    for make in (synth_poisson, synth_bursty, synth_diurnal, synth_flash_crowd):
        a, b, c = (make(50.0, 60.0, seed=s, sizes=sizes) for s in (5, 5, 6))
        pd.testing.assert_frame_equal(a, b, check_exact=True)
        assert not a["timestamp"].equals(c["timestamp"])
        assert a["timestamp"].is_monotonic_increasing and a["timestamp"].iloc[0] >= 0


def test_size_specs():
    rng = np.random.default_rng(0)
    assert (SizeSpec.parse("constant:4").draw(rng, 10) == 4).all()
    zipf = SizeSpec.parse("zipf:a=1.5,max=8").draw(rng, 50_000)
    assert zipf.min() == 1 and zipf.max() == 8
    weights = np.arange(1, 9) ** -1.5
    assert np.mean(zipf == 1) == pytest.approx(weights[0] / weights.sum(), rel=0.05)
    logn = SizeSpec.parse("lognormal:median=200,sigma=0.7,max=512").draw(rng, 50_000)
    assert np.median(logn) == pytest.approx(200, rel=0.03) and logn.max() == 512 and logn.min() >= 1
    assert logn.dtype == np.int64


@pytest.mark.parametrize(
    "text,expected",
    [
        ("gauss:1", "unknown kind 'gauss'"),
        ("zipf:a=1.5,top=3", "expected key=value with keys a, max"),
        ("constant:0", "a constant size must be >= 1"),
        ("lognormal:median=-1", "lognormal needs median > 0"),
        ("zipf:a=x", "a must be a number"),
        ("constant:2.5", "value must be a whole number, got 2.5"),  # was cut to 2 without a word
        ("lognormal:median=200,max=511.5", "max must be a whole number"),
        ("constant:inf", "value must be a whole number"),  # was an OverflowError's traceback
        ("constant:1e19", "value must be <= 1,000,000,000"),  # the same, from numpy's int64
        ("zipf:a=1.5,max=10,a=2", "a is given twice"),  # the last won without a word
        ("lognormal:median=1e19,sigma=0.5", r"median 1e\+19 lies outside \[min, max\] = \[1, 512\]"),  # all 512
    ],
)
def test_bad_size_specs(text, expected):
    with pytest.raises(TrafficError, match=expected):
        SizeSpec.parse(text)


def test_bad_rates():
    with pytest.raises(TrafficError, match="rate must be a positive number"):
        synth_poisson(0, 10)
    with pytest.raises(TrafficError, match="drew no requests"):
        synth_poisson(1e-9, 1, seed=0)
    with pytest.raises(TrafficError, match="amplitude must be in"):
        synth_diurnal(10, 10, amplitude=2)


@pytest.mark.parametrize("make,expected", [
    (lambda: synth_poisson(1e12, 7 * 86400), "poisson: 1e+12 requests/s for 604800 s would make about "
     "605,000,000,000,000,000 rows, above the limit of 100,000,000 rows"),
    (lambda: synth_diurnal(2e5, 1000, amplitude=0.6), "diurnal: 320000 requests/s at the peak for 1000 s "
     "would make about 320,000,000 rows"),
    (lambda: synth_bursty(2e5, 1000), "bursty: 200000 requests/s for 1000 s would make about 200,000,000 rows"),
    (lambda: synth_flash_crowd(2e4, 1000), "flash crowd: 200000 requests/s at the peak for 1000 s would "
     "make about 200,000,000 rows"),
    (lambda: synth_bursty(1.0, 7 * 86400, mean_on_s=1e-9), "bursty: bursts of 1e-09 s on average for 604800 s "
     "would make about 242,000,000,000,000 on/off periods, above the limit of 100,000,000"),
])
def test_a_table_that_cannot_fit_is_refused_before_it_is_drawn(make, expected):
    with pytest.raises(TrafficError) as exc:
        make()
    assert str(exc.value).startswith(expected), str(exc.value)
    assert "lower the rate or the duration" in str(exc.value) or "on/off periods" in str(exc.value)


def test_the_row_limit_leaves_room_below_it():
    assert synth_poisson(MAX_ROWS / 1e6, 1e4, seed=0).shape[0] == pytest.approx(MAX_ROWS / 100, rel=0.01)


def test_a_zipf_support_that_cannot_fit_is_refused():
    with pytest.raises(TrafficError, match=r"zipf max must be <= 10,000,000, got max=1000000000000"):
        SizeSpec.parse("zipf:a=1.2,max=1e12")


@pytest.mark.parametrize("make", [synth_poisson, synth_diurnal, synth_bursty, synth_flash_crowd])
@pytest.mark.parametrize("seed", [-1, 2**32, 1.5, True])
def test_a_seed_out_of_range_is_one_line(make, seed):
    with pytest.raises(TrafficError, match=rf"^seed: must be in 0\.\.4294967295, got {re.escape(repr(seed))}$"):
        make(10.0, 10.0, seed=seed)


def test_the_seed_range_reaches_both_ends():
    for seed in (0, 2**32 - 1, np.uint32(2**32 - 1)):
        assert len(synth_poisson(10.0, 10.0, seed=seed)) > 0


@pytest.mark.parametrize("kind", ["poisson", "diurnal", "bursty", "flash-crowd"])
def test_synth_refuses_a_seed_out_of_range_in_one_line(kind, tmp_path, capsys):
    out = tmp_path / "s.csv"
    assert main(["traffic", "synth", kind, "--rate", "1", "--duration", "10", "--seed", "-1", "-o", str(out)]) == 2
    assert capsys.readouterr().err == "tuner: error: --seed: must be in 0..4294967295, got -1\n"
    assert not out.exists()


@pytest.mark.parametrize("spike", [10.0, 100.0, -1.0])
def test_a_flash_crowd_spike_outside_the_traffic_is_refused(spike):
    with pytest.raises(TrafficError, match=rf"^flash crowd needs its spike within the traffic, 0 <= spike_at_s < "
                                           rf"duration_s, got spike_at_s={spike}, duration_s=10.0$"):
        synth_flash_crowd(1.0, 10.0, spike_at_s=spike)
    assert len(synth_flash_crowd(1.0, 10.0, spike_at_s=9.9, seed=1)) > 0


def test_synth_refuses_a_spike_after_the_end_in_one_line(tmp_path, capsys):
    out = tmp_path / "s.csv"
    argv = ["traffic", "synth", "flash-crowd", "--rate", "1", "--duration", "10", "--spike-at", "100", "-o", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["tuner: error: flash crowd needs its spike within the traffic, 0 <= spike_at_s < duration_s, "
                   "got spike_at_s=100.0, duration_s=10.0"], err
    assert not out.exists()


@pytest.mark.parametrize("column", ["timestamp", "model", "prefix_id"])
def test_a_size_for_a_column_that_is_not_a_size_is_refused(column, tmp_path, capsys):
    # its values would replace the drawn arrival times, or name models
    with pytest.raises(TrafficError, match=f"size '{column}': not a size column"):
        synth_poisson(10.0, 10.0, sizes={column: "constant:3"})
    out = tmp_path / "y.csv"
    assert main(["traffic", "synth", "poisson", "--rate", "10", "--duration", "10",
                 "--size", f"{column}=constant:3", "-o", str(out)]) == 2
    assert f"size '{column}': not a size column" in capsys.readouterr().err and not out.exists()


def test_an_option_of_another_kind_of_traffic_is_refused_and_one_left_out_takes_its_default(tmp_path, capsys):
    out = tmp_path / "p.csv"
    argv = ["traffic", "synth", "poisson", "--rate", "5", "--duration", "2", "-o", str(out)]
    assert main([*argv, "--period", "5"]) == 2
    assert "--period applies to 'traffic synth diurnal' only, not to 'traffic synth poisson'" in capsys.readouterr().err and not out.exists()
    # a diurnal day's default (1d) when --period is left out, as synth_diurnal's own default
    assert main(["traffic", "synth", "diurnal", "--rate", "5", "--duration", "1h", "-o", str(out)]) == 0
    pd.testing.assert_frame_equal(pd.read_csv(out), synth_diurnal(5.0, 3600.0, period_s=86400.0), check_exact=False)
