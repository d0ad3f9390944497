"""tuner.study.study_traffic: the study's traffic, read from a file or a directory of files, cut to
its window; only the window's row groups are read."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tuner.settings import StudySettings, TrafficSettings
from tuner.study import study_traffic
from tuner.traffic import busiest_window, read_traffic, synth_bursty, window


@pytest.fixture
def hourly(tmp_path):
    """Six hours of bursty traffic as one Parquet file per hour, small row groups."""
    df = synth_bursty(20.0, 6 * 3600.0, seed=5, sizes={"seq_len": "lognormal:median=100,sigma=0.5,max=400"})
    hour = (df["timestamp"] // 3600).astype(int)
    for h, part in df.groupby(hour):
        pq.write_table(pa.Table.from_pandas(part, preserve_index=False), tmp_path / f"h{h}.parquet",
                       row_group_size=2000)
    return df, tmp_path


def _settings(path, **window) -> StudySettings:
    return StudySettings(name="s", model_repository=".", model="m", traffic=TrafficSettings(path=str(path), **window))


def test_the_busiest_window_of_a_directory(hourly):
    df, folder = hourly
    start, count = busiest_window(df, 300.0)
    got = study_traffic(_settings(folder, busiest_s=300.0))
    assert len(got) == count
    pd.testing.assert_frame_equal(got, window(df, start, 300.0))


def test_a_window_by_start_and_the_whole_directory(hourly):
    df, folder = hourly
    pd.testing.assert_frame_equal(study_traffic(_settings(folder, start_s=5000.0, duration_s=600.0)),
                                  window(df, 5000.0, 600.0))
    pd.testing.assert_frame_equal(study_traffic(_settings(folder)), df.reset_index(drop=True))


def test_a_date_range_of_a_directory(hourly):
    # synth's clock starts at 0: the range is given in the recording's own seconds, and as dates
    df, folder = hourly
    ts = df["timestamp"]
    expected = df[(ts >= 7200.0) & (ts < 9000.0)].reset_index(drop=True)
    pd.testing.assert_frame_equal(study_traffic(_settings(folder, since=7200.0, until="9000")), expected)
    shifted = df.assign(timestamp=ts + 1_767_225_600.0)  # 2026-01-01 00:00 UTC
    for h, part in shifted.groupby((ts // 3600).astype(int)):
        pq.write_table(pa.Table.from_pandas(part, preserve_index=False), folder / f"h{h}.parquet", row_group_size=2000)
    got = study_traffic(_settings(folder, since="2026-01-01T02:00", until="2026-01-01T02:30"))
    pd.testing.assert_frame_equal(got, expected.assign(timestamp=expected["timestamp"] + 1_767_225_600.0))


def test_a_single_csv_file_reads_as_before(tmp_path):
    times = np.concatenate([np.arange(40) * 0.25, 10 + np.arange(10) * 0.05])  # a burst at 10 s
    pd.DataFrame({"timestamp": times, "seq_len": np.arange(50) % 5 + 1}).to_csv(tmp_path / "t.csv", index=False)
    df = read_traffic(tmp_path / "t.csv")
    got = study_traffic(_settings(tmp_path / "t.csv", busiest_s=2.0))
    assert len(got) == 16  # 8.5 .. 9.75 s, then the burst
    pd.testing.assert_frame_equal(got, window(df, busiest_window(df, 2.0)[0], 2.0))


def test_a_busiest_stretch_longer_than_the_recording_is_the_whole_recording_and_says_so(tmp_path, capsys):
    df = pd.DataFrame({"timestamp": np.arange(50) * 0.1, "seq_len": 8})
    df.to_csv(tmp_path / "t.csv", index=False)
    got = study_traffic(_settings(tmp_path / "t.csv", busiest_s=60.0))
    assert len(got) == len(df)
    err = capsys.readouterr().err
    assert "traffic: busiest_s 60 s is longer than the recording (" in err and "the whole recording is replayed" in err
    study_traffic(_settings(tmp_path / "t.csv", busiest_s=2.0))
    assert "longer than the recording" not in capsys.readouterr().err


def test_a_recording_of_several_models_replays_the_study_models_requests_alone_and_says_so(tmp_path, capsys):
    # model m: one request every 0.5 s for 20 s, its burst at 15 s; model other: a denser burst at 5 s
    mine = pd.DataFrame({"timestamp": np.concatenate([np.arange(40) * 0.5, 15 + np.arange(20) * 0.01]),
                         "seq_len": 8, "model": "m"})
    theirs = pd.DataFrame({"timestamp": 5 + np.arange(50) * 0.01, "seq_len": 500, "model": "other"})
    both = pd.concat([mine, theirs]).sort_values("timestamp", kind="stable")
    both.to_csv(tmp_path / "t.csv", index=False)
    expected = mine.sort_values("timestamp", kind="stable").reset_index(drop=True)
    got = study_traffic(_settings(tmp_path / "t.csv"))
    assert len(got) == len(mine) and set(got["model"]) == {"m"} and got["seq_len"].max() == 8
    assert "only model m's requests are replayed (the 'model' column); left out: other (50)" in capsys.readouterr().err
    # the busiest second is found among its requests (the other model's burst is busier)
    got = study_traffic(_settings(tmp_path / "t.csv", busiest_s=1.0))
    start, count = busiest_window(expected, 1.0)
    assert start >= 14.0 and len(got) == count
    np.testing.assert_array_equal(got["timestamp"], window(expected, start, 1.0)["timestamp"])


def test_a_recording_without_the_study_models_requests_is_refused_in_one_line(tmp_path):
    from tuner.errors import TrafficError

    pd.DataFrame({"timestamp": np.arange(10) * 0.1, "model": "other"}).to_csv(tmp_path / "t.csv", index=False)
    for window_keys in ({}, {"busiest_s": 1.0}, {"start_s": 0.0, "duration_s": 1.0}):
        with pytest.raises(TrafficError, match=r"t\.csv: no requests for model m in its 'model' column"):
            study_traffic(_settings(tmp_path / "t.csv", **window_keys))


def test_the_model_files_are_its_version_directories_by_digest_a_large_file_by_its_size_and_ends(tmp_path):
    import dataclasses

    from tuner.settings import ServerSettings
    from tuner.study import model_files

    model = tmp_path / "repo" / "m"
    (model / "1" / "sub").mkdir(parents=True)
    (model / "config.pbtxt").write_text("max_batch_size: 8\n")  # compared by its fields, elsewhere
    (model / "README.md").write_text("notes\n")  # not loaded by Triton
    (model / "1" / "model.json").write_text("{}\n")  # the engine's arguments, compared by their values
    (model / "1" / "model.py").write_text("x = 1\n")
    (model / "1" / "sub" / "vocab.txt").write_text("a b\n")
    big = model / "1" / "weights.bin"
    with open(big, "wb") as fh:  # 65 MiB, sparse: only its size and two ends are read
        fh.truncate(65 * 2**20)
    settings = StudySettings(name="s", traffic=TrafficSettings(path="t.csv"), model_repository=str(tmp_path / "repo"),
                             model="m")
    files = model_files(settings)
    assert sorted(files) == ["1/model.py", "1/sub/vocab.txt", "1/weights.bin"]
    with open(big, "r+b") as fh:  # a byte changed in the middle goes unseen; at an end, or another size, not
        fh.seek(30 * 2**20)
        fh.write(b"\1")
    assert model_files(settings) == files
    with open(big, "r+b") as fh:
        fh.seek(65 * 2**20 - 1)
        fh.write(b"\1")
    assert model_files(settings)["1/weights.bin"] != files["1/weights.bin"]
    (model / "1" / "model.py").write_text("x = 2\n")
    assert model_files(settings)["1/model.py"] != files["1/model.py"]
    remote = dataclasses.replace(settings, server=ServerSettings(launcher="remote", url="http://127.0.0.1:8000"))
    assert model_files(remote) == {}  # a remote server loads its own files


def test_a_recording_of_the_study_models_requests_alone_is_read_as_it_was(tmp_path, monkeypatch, capsys):
    from tuner.traffic import recording

    pd.DataFrame({"timestamp": np.arange(50) * 0.1, "seq_len": 8, "model": "m"}).to_csv(tmp_path / "t.csv", index=False)
    rec = recording.open_recording(tmp_path / "t.csv")
    assert rec.of_model("m") is rec and rec.of_model("other").model == "other"  # the footers tell
    got = study_traffic(_settings(tmp_path / "t.csv", busiest_s=1.0))
    assert len(got) == busiest_window(read_traffic(tmp_path / "t.csv"), 1.0)[1]
    assert "left out" not in capsys.readouterr().err
