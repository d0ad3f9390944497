"""tuner.traffic.recording: files, directories and globs read as one recording; CSV converted once
into the cache; bad files named in one line (exit 2)."""

from __future__ import annotations

import fcntl
import os
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tuner.cli import main
from tuner.errors import TrafficError
from tuner.traffic import describe, read_traffic
from tuner.traffic import recording as rec_mod
from tuner.traffic.recording import cache_dir, joins_recording, open_recording
from tuner.traffic.scan import describe_recording, read_all


def _table(start: float, n: int, **extra) -> pd.DataFrame:
    return pd.DataFrame({"timestamp": start + np.arange(n) * 0.5, "batch_size": np.ones(n, dtype=np.int64),
                         "seq_len": np.arange(n, dtype=np.int64) % 9 + 1, **extra})


def _one_line_exit_2(capsys, args: list[str], expected: str) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err, err


def test_an_empty_directory_is_one_line(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("no traffic here")
    with pytest.raises(TrafficError, match="an empty directory"):
        open_recording(tmp_path)
    _one_line_exit_2(capsys, ["traffic", "stats", str(tmp_path)], f"{tmp_path}: an empty directory")
    _one_line_exit_2(capsys, ["traffic", "stats", str(tmp_path / "*.parquet")], "no .parquet, .pq or .csv files match")


def test_a_path_that_is_not_there_is_said_so_whatever_its_suffix(tmp_path, capsys):
    for name in ("missingdir", "gone.csv", "gone.parquet"):
        _one_line_exit_2(capsys, ["traffic", "stats", str(tmp_path / name)], f"{tmp_path / name}: no such file")


def test_a_corrupt_file_in_a_directory_is_named(tmp_path, capsys):
    _table(0, 100).to_parquet(tmp_path / "a.parquet", index=False)
    _table(50, 100).to_parquet(tmp_path / "b.parquet", index=False)
    data = (tmp_path / "b.parquet").read_bytes()
    (tmp_path / "b.parquet").write_bytes(data[: len(data) // 2])  # a copy cut short
    _one_line_exit_2(capsys, ["traffic", "stats", str(tmp_path)], f"{tmp_path / 'b.parquet'}: not a readable Parquet file")
    _one_line_exit_2(capsys, ["traffic", "window", str(tmp_path), "--busiest", "5", "-o", str(tmp_path / "w.csv")],
                     f"{tmp_path / 'b.parquet'}: not a readable Parquet file")
    (tmp_path / "b.parquet").write_bytes(b"")
    _one_line_exit_2(capsys, ["traffic", "stats", str(tmp_path)], f"{tmp_path / 'b.parquet'}: empty file")


def test_a_file_of_other_columns_is_named(tmp_path, capsys):
    _table(0, 100).to_parquet(tmp_path / "a.parquet", index=False)
    _table(50, 100).drop(columns="seq_len").to_parquet(tmp_path / "b.parquet", index=False)
    _one_line_exit_2(capsys, ["traffic", "stats", str(tmp_path)],
                     f"{tmp_path / 'b.parquet'}: columns batch_size, timestamp differ from {tmp_path / 'a.parquet'}'s")
    _table(50, 100, model=["m"] * 100).drop(columns="seq_len").rename(columns={"model": "seq_len"}) \
        .to_parquet(tmp_path / "b.parquet", index=False)
    _one_line_exit_2(capsys, ["traffic", "stats", str(tmp_path)],
                     f"{tmp_path / 'b.parquet'}: column 'seq_len' holds text, but numbers in")


def test_overlapping_files_are_said_and_merged_by_the_cli(tmp_path, capsys):
    _table(0, 100).to_parquet(tmp_path / "a.parquet", index=False)
    _table(20.25, 100).to_parquet(tmp_path / "b.parquet", index=False)
    assert main(["traffic", "stats", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "note: " in out and "a.parquet, " in out and "overlap in time" in out and "merged, sorted by time" in out
    assert re.search(r"^requests\s+200$", out, re.M)


def test_a_csv_is_converted_once_into_the_cache_and_left_alone(tmp_path):
    src = tmp_path / "mine" / "t.csv"
    src.parent.mkdir()
    _table(0, 1000).to_csv(src, index=False)
    before = (src.read_bytes(), os.stat(src).st_mtime_ns, sorted(os.listdir(src.parent)))
    rec = open_recording(src)
    converted = [p for seg in rec.segments for p in seg][0].file
    assert converted.parent == cache_dir() and converted.suffix == ".parquet"
    made = os.stat(converted).st_mtime_ns
    pd.testing.assert_frame_equal(read_all(open_recording(src)), read_traffic(src))
    assert os.stat(converted).st_mtime_ns == made  # the second open reads the conversion
    assert (src.read_bytes(), os.stat(src).st_mtime_ns, sorted(os.listdir(src.parent))) == before


def test_a_csv_replaced_by_one_of_the_same_size_and_modification_time_is_converted_again(tmp_path):
    # what `cp -p`, `rsync -a` or `tar x` do: other content, the same size and mtime
    src = tmp_path / "t.csv"
    _table(0, 100).assign(seq_len=128).to_csv(src, index=False)
    st = os.stat(src)
    assert read_all(open_recording(src))["seq_len"].max() == 128
    src.write_text(src.read_text().replace(",128", ",999", 1))
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(src).st_size == st.st_size and os.stat(src).st_mtime_ns == st.st_mtime_ns
    assert read_all(open_recording(src))["seq_len"].max() == 999


def test_a_csv_is_streamed_and_a_bad_line_in_a_later_chunk_named(tmp_path, monkeypatch):
    monkeypatch.setattr(rec_mod, "CSV_ROWS", 100)
    df = _table(0, 1000)
    src = tmp_path / "t.csv"
    df.to_csv(src, index=False)
    rec = open_recording(src)
    assert sum(len(seg) for seg in rec.segments) == 10 and rec.notes == []  # ten chunks, ten row groups
    assert describe_recording(rec) == describe(read_traffic(src))
    lines = src.read_text().splitlines()
    lines[555] = lines[555].replace(",1,", ",-3,", 1)  # line 556 of the file: a negative batch size
    src.write_text("\n".join(lines) + "\n")
    with pytest.raises(TrafficError) as exc:
        open_recording(src)
    assert str(exc.value) == f"{src}: line 556, column 'batch_size': must be a positive integer, got -3"


def test_a_glob_and_a_list_are_recordings(tmp_path):
    for h in range(3):
        pq.write_table(pa.Table.from_pandas(_table(h * 100.0, 200)), tmp_path / f"h{h}.parquet")
    (tmp_path / "other.parquet").write_bytes(b"not parquet")
    assert open_recording(str(tmp_path / "h*.parquet")).rows == 600
    assert open_recording([tmp_path / "h0.parquet", tmp_path / "h2.parquet"]).rows == 400


def test_a_file_joins_a_recording_where_its_directory_or_glob_would_read_it(tmp_path):
    (tmp_path / "rec").mkdir()
    (tmp_path / "rec" / "a.csv").write_text("timestamp\n0\n")
    (tmp_path / "link").symlink_to(tmp_path / "rec")
    directory, pattern, single = tmp_path / "rec", str(tmp_path / "rec" / "day*.parquet"), tmp_path / "rec" / "a.csv"
    assert joins_recording(tmp_path / "rec" / "new.csv", directory)  # not there yet: it would be, once written
    assert joins_recording(tmp_path / "link" / "new.PQ", directory)  # the same directory by another name
    assert not joins_recording(tmp_path / "rec" / "ranking.json", directory)  # not a traffic file's suffix
    assert not joins_recording(tmp_path / "rec" / "sub" / "new.csv", directory)  # a directory is read flat
    assert not joins_recording(tmp_path / "new.csv", directory)
    assert joins_recording(tmp_path / "rec" / "day2.parquet", pattern)
    assert not joins_recording(tmp_path / "rec" / "night2.parquet", pattern)
    assert not joins_recording(tmp_path / "rec" / "b.csv", single)  # one file: only itself, by same_file


@pytest.mark.parametrize("damage", ["empty", "truncated", "not parquet"])
def test_a_damaged_conversion_in_the_cache_is_converted_again_not_blamed_on_the_csv(tmp_path, monkeypatch, capsys, damage):
    # an emptied cache entry gave `t.csv: empty file`, a truncated one `t.csv: not a readable Parquet file`,
    # and each stayed: the CSV (14 KB, fine) was blamed for the cache's fault, run after run
    monkeypatch.setenv("TUNER_TRAFFIC_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "t.csv"
    _table(0, 500).to_csv(src, index=False)
    assert main(["traffic", "stats", str(src)]) == 0
    first = capsys.readouterr().out
    [entry] = (tmp_path / "cache").iterdir()
    if damage == "empty":
        entry.write_bytes(b"")
    elif damage == "truncated":
        entry.write_bytes(entry.read_bytes()[:100])
    else:
        entry.write_text("timestamp\n0\n")
    for _ in range(2):  # converted again, and that conversion read the next time
        assert main(["traffic", "stats", str(src)]) == 0
        assert capsys.readouterr().out == first
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [entry.name]
    pd.testing.assert_frame_equal(read_all(open_recording(src)), read_traffic(src))


def _entries(cache):
    return sorted(p.name for p in cache.iterdir())


def test_a_new_version_of_a_csv_replaces_its_earlier_conversions_and_keeps_other_files(tmp_path, monkeypatch):
    # `touch big.csv` (or replacing it) left a full stale Parquet copy each time, never removed
    cache = tmp_path / "cache"
    monkeypatch.setenv("TUNER_TRAFFIC_CACHE", str(cache))
    src, other = tmp_path / "big.csv", tmp_path / "other.csv"
    _table(0, 300).to_csv(src, index=False)
    _table(0, 200).to_csv(other, index=False)
    read_all(open_recording(other))
    kept = _entries(cache)
    for n in range(3):
        os.utime(src, ns=(10**18 + n, 10**18 + n))  # a new modification time: a new version
        assert len(read_all(open_recording(src))) == 300
        assert len(_entries(cache)) == 2 and set(kept) < set(_entries(cache))
    (tmp_path / "new.csv").write_text(src.read_text())
    os.replace(tmp_path / "new.csv", src)  # another inode
    assert len(read_all(open_recording(src))) == 300
    assert len(_entries(cache)) == 2 and set(kept) < set(_entries(cache))
    # the same file by another name (a link) is the same source: one entry for it still
    (tmp_path / "link.csv").symlink_to(src)
    assert len(read_all(open_recording(tmp_path / "link.csv"))) == 300
    assert len(_entries(cache)) == 2


def test_an_earlier_conversion_still_read_is_left_until_it_is_not(tmp_path, monkeypatch):
    # two processes at once: one reads the conversion of the version it found, while the other converts
    # the file as it is now; a removal needs the entry's lock, which every reader holds (shared)
    cache = tmp_path / "cache"
    monkeypatch.setenv("TUNER_TRAFFIC_CACHE", str(cache))
    src = tmp_path / "t.csv"
    _table(0, 300).to_csv(src, index=False)
    reading = open_recording(src)
    [first] = _entries(cache)
    other = open(cache / first)  # as another process reading it would: a lock of its own
    fcntl.flock(other, fcntl.LOCK_SH)
    del reading  # this process is done with it; the other is not
    os.utime(src, ns=(10**18, 10**18))
    assert len(read_all(open_recording(src))) == 300
    assert len(_entries(cache)) == 2 and first in _entries(cache)
    other.close()
    os.utime(src, ns=(2 * 10**18, 2 * 10**18))
    still = open_recording(src)
    assert len(_entries(cache)) == 1 and first not in _entries(cache)
    assert len(read_all(still)) == 300
    os.utime(src, ns=(3 * 10**18, 3 * 10**18))
    assert len(read_all(open_recording(src))) == 300
    assert len(_entries(cache)) == 2  # `still` reads its version: kept
