"""tuner.traffic.scan: statistics and windows of a recording read a segment at a time agree with
today's whole-table ones (stats.describe, windows.busiest_window / window)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tuner.cli import main
from tuner.errors import TrafficError
from tuner.instants import parse_instant
from tuner.nightly.intake import newest_traffic
from tuner.traffic import busiest_window, describe, import_triton_trace, read_traffic, synth_diurnal, window
from tuner.traffic.recording import open_recording
from tuner.traffic.scan import busiest_in, describe_recording, read_all, read_range, read_since, read_window

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "traffic_profiles").glob("*.csv"))
T0 = 1_767_225_600.0


def _same(a, b, path="stats"):
    """Equal dicts of statistics: counts exactly, floats to 1e-9 (sums merged chunk by chunk)."""
    if isinstance(a, dict):
        assert list(a) == list(b), path
        for key in a:
            _same(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), path
    elif isinstance(a, float):
        assert b == pytest.approx(a, rel=1e-9, abs=1e-9), path
    else:
        assert a == b and type(a) is type(b), path


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_profiles_describe_the_same(path):
    for busiest in (60.0, 7.5):
        _same(describe(read_traffic(path), busiest), describe_recording(open_recording(path), busiest))


def test_shipped_triton_trace_describes_the_same(tmp_path):
    table = import_triton_trace(ROOT / "tests/data/triton_trace_timestamps.json")
    table.to_parquet(tmp_path / "trace.parquet", index=False)
    _same(describe(table), describe_recording(open_recording(tmp_path / "trace.parquet")))


def _week(rows: int = 200_000) -> pd.DataFrame:
    """A diurnal week with batch sizes, two shape columns and two models, on real epoch times."""
    df = synth_diurnal(rows / (7 * 86400.0), 7 * 86400.0, seed=3,
                       sizes={"batch_size": "zipf:a=1.5,max=32", "seq_len": "lognormal:median=200,sigma=0.7,max=512"})
    df["timestamp"] += T0
    df["images"] = np.arange(len(df), dtype=np.int64) % 7 + 1
    df["model"] = np.where(np.arange(len(df)) % 3 == 0, "b", "a")
    return df


def _hourly(df: pd.DataFrame, folder: Path, *, row_group_size: int = 500) -> Path:
    """The table as one Parquet file per hour, several row groups each, as a logging pipeline writes."""
    folder.mkdir(parents=True, exist_ok=True)
    hour = ((df["timestamp"] - T0) // 3600).astype(int)
    for h, part in df.groupby(hour):
        pq.write_table(pa.Table.from_pandas(part, preserve_index=False), folder / f"h{h:03d}.parquet",
                       row_group_size=row_group_size)
    return folder


def test_a_multi_file_week_describes_the_same(tmp_path):
    df = _week()
    folder = _hourly(df, tmp_path / "week")
    rec = open_recording(folder)
    assert len(list(folder.iterdir())) == 168 and rec.rows == len(df) and rec.notes == []
    for busiest in (60.0, 600.0, 3600.0):
        _same(describe(df, busiest), describe_recording(rec, busiest))
    # a glob of the same files is the same recording
    _same(describe(df), describe_recording(open_recording(str(folder / "h*.parquet"))))


def test_busiest_window_and_window_load_agree(tmp_path):
    df = _week()
    rec = open_recording(_hourly(df, tmp_path / "week"))
    for length in (1.0, 600.0, 5400.0):
        start, count = busiest_in(rec, length)
        assert (start, count) == busiest_window(df, length)
        got = read_window(rec, start, length)
        assert len(got) == count
        pd.testing.assert_frame_equal(got, window(df, start, length))
    pd.testing.assert_frame_equal(read_window(rec, 86400.0, 7200.0), window(df, 86400.0, 7200.0))
    pd.testing.assert_frame_equal(read_window(rec, 6.5 * 86400), window(df, 6.5 * 86400))
    pd.testing.assert_frame_equal(read_all(rec), df.reset_index(drop=True))
    with pytest.raises(TrafficError, match="holds no requests"):
        read_window(rec, 8 * 86400.0, 60.0)


def test_a_window_reads_only_its_row_groups(tmp_path):
    """A bad value in a file far from the window is never read by the window, only by the stats."""
    df = _week(50_000)
    folder = _hourly(df, tmp_path / "week")
    bad = pq.read_table(folder / "h100.parquet").to_pandas()
    bad.loc[3, "seq_len"] = -1
    pq.write_table(pa.Table.from_pandas(bad, preserve_index=False), folder / "h100.parquet", row_group_size=500)
    rec = open_recording(folder)
    assert len(read_window(rec, 3600.0, 600.0)) == len(window(df, 3600.0, 600.0))
    assert len(read_since(rec, rec.end - 1800.0)) == int((df["timestamp"] >= df["timestamp"].iloc[-1] - 1800).sum())
    with pytest.raises(TrafficError, match=r"h100.parquet: row 4, column 'seq_len': must be a positive integer"):
        describe_recording(rec)


def test_a_bad_row_in_a_later_row_group_is_named_by_its_row_in_the_file(tmp_path):
    df = pd.DataFrame({"timestamp": np.arange(3000.0), "batch_size": np.ones(3000, dtype=np.int64)})
    df.loc[2345, "batch_size"] = 0
    pq.write_table(pa.Table.from_pandas(df), tmp_path / "t.parquet", row_group_size=1000)
    with pytest.raises(TrafficError) as exc:
        describe_recording(open_recording(tmp_path / "t.parquet"))
    assert str(exc.value) == (f"{tmp_path / 't.parquet'}: row 2346, column 'batch_size': "
                              "must be a positive integer, got 0")


def test_overlapping_files_are_merged_in_time_and_said_so(tmp_path):
    df = _week(20_000)
    first, second = df.iloc[::2], df.iloc[1::2]  # two recorders of the same week, interleaved
    first.to_parquet(tmp_path / "a.parquet", index=False)
    second.to_parquet(tmp_path / "b.parquet", index=False)
    rec = open_recording(tmp_path)
    assert len(rec.notes) == 1
    note = rec.notes[0]
    assert "a.parquet" in note and "b.parquet" in note and "overlap in time" in note and "merged" in note
    _same(describe(df), describe_recording(rec))
    assert main(["traffic", "stats", str(tmp_path)]) == 0


def test_a_file_out_of_time_order_is_sorted_and_said_so(tmp_path):
    df = _week(5_000)
    shuffled = df.sample(frac=1.0, random_state=1)
    pq.write_table(pa.Table.from_pandas(shuffled, preserve_index=False), tmp_path / "s.parquet", row_group_size=700)
    rec = open_recording(tmp_path / "s.parquet")
    assert any("s.parquet is not in time order" in n for n in rec.notes)
    _same(describe(df), describe_recording(rec))
    _same(describe(df, 3600.0), describe_recording(rec, 3600.0))


def test_newest_hours_of_a_growing_directory_read_only_the_new_files(tmp_path):
    """Nightly's intake: old files are known by their footers alone (a bad value in one is not read)."""
    df = _week(30_000)
    folder = _hourly(df, tmp_path / "week")
    bad = pq.read_table(folder / "h010.parquet").to_pandas()
    bad.loc[0, "batch_size"] = 0
    pq.write_table(pa.Table.from_pandas(bad, preserve_index=False), folder / "h010.parquet")
    table, files = newest_traffic(folder, 2.0, model="a")
    keep = df[(df["timestamp"] >= df["timestamp"].iloc[-1] - 7200.0) & (df["model"] == "a")]
    assert len(files) == 168 and len(table) == len(keep)
    assert np.array_equal(table["timestamp"].to_numpy(), keep["timestamp"].to_numpy())


def test_a_date_range_reads_only_its_row_groups_and_matches_the_whole_table(tmp_path):
    """`since <= t < until` on a week of hourly files: the same rows as cutting the whole table, the
    dates read as UTC, a bad file outside the range never read, an empty range refused with the span."""
    df = _week(50_000)
    folder = _hourly(df, tmp_path / "week")
    bad = pq.read_table(folder / "h100.parquet").to_pandas()
    bad.loc[3, "seq_len"] = -1
    pq.write_table(pa.Table.from_pandas(bad, preserve_index=False), folder / "h100.parquet", row_group_size=500)
    rec = open_recording(folder)
    since, until = T0 + 26 * 3600 + 0.5, T0 + 30 * 3600
    ts = df["timestamp"]
    expected = df[(ts >= since) & (ts < until)].reset_index(drop=True)
    got = read_range(rec, parse_instant(instant_iso(since)), parse_instant(instant_iso(until)))
    pd.testing.assert_frame_equal(got, expected)
    assert 0 < len(got) < len(df)
    pd.testing.assert_frame_equal(read_range(rec, None, T0 + 3600), df[ts < T0 + 3600].reset_index(drop=True))
    with pytest.raises(TrafficError, match=r"holds no requests \(the traffic spans 20"):
        read_range(rec, T0 + 8 * 86400, None)
    with pytest.raises(TrafficError, match="must come after its start"):
        read_range(rec, until, since)


def instant_iso(seconds: float) -> str:
    """Unix seconds as a naive ISO-8601 time (UTC), microseconds kept."""
    import datetime

    return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC).replace(tzinfo=None).isoformat()


@pytest.mark.slow
def test_a_ten_million_request_week_describes_the_same(tmp_path):
    """The issue's figure of agreement at scale: 10 M requests in 168 hourly files of several row groups
    each, described out of core and whole: the same counts, floats within 1e-9 (`_same`)."""
    df = _week(10_000_000)
    rec = open_recording(_hourly(df, tmp_path / "week", row_group_size=20_000))
    assert rec.rows == len(df)
    _same(describe(df, 600.0), describe_recording(rec, 600.0))


# --- traffic spanning a long time: no array per bin of the span ---------------------------------------

FAR = [
    [0.0, 1.0, 1e11],  # a request 3,000 years after the first two: 800 billion bins of the span
    [0.0, 0.5, 1e11, 1e11 + 0.25, 1e11 + 0.5, 1e11 + 0.75],  # the busiest second at the far end
    [0.0, 1.0, 1e20, 1e20 + 2**14, 1e20 + 2**14],  # bin numbers past float64's precision: counted exactly
]


@pytest.mark.parametrize("times", FAR, ids=["3,000 years", "busiest at the far end", "past float precision"])
@pytest.mark.parametrize("busiest", [1.0, 60.0])
def test_traffic_spanning_ages_is_scanned_without_an_array_per_bin(times, busiest, tmp_path):
    df = pd.DataFrame({"timestamp": times, "batch_size": 1})
    df.to_parquet(tmp_path / "far.parquet", index=False)
    rec = open_recording(tmp_path / "far.parquet")
    assert busiest_in(rec, busiest) == busiest_window(read_traffic(tmp_path / "far.parquet"), busiest)
    _same(describe(read_traffic(tmp_path / "far.parquet"), busiest), describe_recording(rec, busiest))


def test_the_occupied_bins_bound_the_counts_as_every_bin_does():
    from tuner.traffic.scan import _reaching_dense, _reaching_sparse

    rng = np.random.default_rng(5)
    for _ in range(300):
        n = int(rng.integers(1, 500))
        bins = np.sort(rng.integers(0, int(rng.integers(1, 5 * n + 2)), n))
        bins -= bins[0]
        done, fine, floor = int(rng.integers(1, n + 1)), int(rng.integers(8, 100)), int(rng.integers(0, 4))
        dense = _reaching_dense(bins, done, fine, floor=floor)
        assert np.array_equal(_reaching_sparse(bins, done, fine, floor=floor), dense)


def test_stats_and_window_of_far_apart_requests_are_figures_not_a_traceback(tmp_path, capsys):
    far = tmp_path / "far.csv"
    far.write_text("timestamp,batch_size\n0,1\n1,1\n100000000000,1\n")
    assert main(["traffic", "stats", str(far)]) == 0
    assert "requests" in capsys.readouterr().out
    assert main(["traffic", "window", str(far), "--busiest", "10", "-o", str(tmp_path / "fw.csv")]) == 0
    assert read_traffic(tmp_path / "fw.csv")["timestamp"].tolist() == [0.0, 1.0]
