"""tuner.traffic.io: the table on disk, round trips, and the malformed files it refuses."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tuner.cli import main
from tuner.errors import TrafficError
from tuner.traffic import read_traffic, shape_columns, validate_traffic, write_traffic


def _table() -> pd.DataFrame:
    rng = np.random.default_rng(3)
    n = 500
    return pd.DataFrame(
        {
            "timestamp": np.sort(rng.uniform(1.7e9, 1.7e9 + 100, n)),
            "batch_size": rng.integers(1, 9, n),
            "seq_len": rng.integers(1, 513, n),
            "image_h": rng.integers(32, 64, n),
            "model": rng.choice(["bert", "resnet"], n),
        }
    )


def test_csv_parquet_round_trip_keeps_every_column_and_dtype(tmp_path):
    original = read_traffic(write_traffic(_table(), tmp_path / "a.csv"))
    assert list(original.columns) == ["timestamp", "batch_size", "seq_len", "image_h", "model"]
    assert original["timestamp"].dtype == np.float64
    assert original["batch_size"].dtype == np.int64 and original["seq_len"].dtype == np.int64
    assert pd.api.types.is_string_dtype(original["model"])
    via_parquet = read_traffic(write_traffic(original, tmp_path / "b.parquet"))
    back_to_csv = read_traffic(write_traffic(via_parquet, tmp_path / "c.csv"))
    for other in (via_parquet, back_to_csv):
        assert list(other.columns) == list(original.columns)
        assert dict(other.dtypes) == dict(original.dtypes)
        pd.testing.assert_frame_equal(other, original, check_exact=True)
    # bit-for-bit times, not just close
    assert (back_to_csv["timestamp"].to_numpy() == _table()["timestamp"].to_numpy()).all()


def test_defaults_sorting_and_iso_times(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(
        "timestamp,seq_len\n"
        "2023-11-16T18:17:05Z,10\n"
        "2023-11-16 18:17:03.5,20\n"
        "2023-11-16T19:17:03.5+01:00,30\n"
    )
    df = read_traffic(path)
    assert df["batch_size"].tolist() == [1, 1, 1] and df["batch_size"].dtype == np.int64
    # stable sort: the two equal instants keep file order
    assert df["seq_len"].tolist() == [20, 30, 10]
    t0 = pd.Timestamp("2023-11-16 18:17:03.5", tz="UTC").timestamp()
    assert df["timestamp"].tolist() == [t0, t0, t0 + 1.5]
    assert shape_columns(df) == ["seq_len"]


def test_datetime_column_in_parquet_becomes_epoch_seconds(tmp_path):
    path = tmp_path / "d.parquet"
    pd.DataFrame(
        {"timestamp": pd.to_datetime(["2024-01-01 00:00:00.25", "2024-01-01 00:00:01"], format="ISO8601")}
    ).to_parquet(path)
    df = read_traffic(path)
    assert df["timestamp"].tolist() == [1704067200.25, 1704067201.0]


def test_validate_accepts_a_frame_and_does_not_change_it():
    raw = pd.DataFrame({"timestamp": [2.0, 1.0], "batch_size": [1.0, 2.0]})
    before = raw.copy()
    out = validate_traffic(raw, "<frame>")
    pd.testing.assert_frame_equal(raw, before)
    assert out["timestamp"].tolist() == [1.0, 2.0] and out["batch_size"].tolist() == [2, 1]
    assert out["batch_size"].dtype == np.int64


MALFORMED = {
    "no_timestamp.csv": ("ts,batch_size\n1,1\n", "no 'timestamp' column"),
    "empty.csv": ("", "empty file"),
    "header_only.csv": ("timestamp,batch_size\n", "no requests"),
    "bad_time.csv": (
        "timestamp\n1.0\n2.0\nyesterday\n",
        "line 4, column 'timestamp': unparsable time 'yesterday'",
    ),
    "negative.csv": ("timestamp\n1.0\n-2.0\n", "line 3, column 'timestamp': negative time"),
    "nan_time.csv": ("timestamp,batch_size\n1.0,1\n,1\n", "line 3, column 'timestamp': empty (NaN)"),
    "zero_batch.csv": (
        "timestamp,batch_size\n1.0,1\n2.0,0\n",
        "line 3, column 'batch_size': must be a positive integer",
    ),
    "neg_batch.csv": (
        "timestamp,batch_size\n1.0,-4\n",
        "line 2, column 'batch_size': must be a positive integer",
    ),
    "frac_batch.csv": ("timestamp,batch_size\n1.0,1.5\n", "line 2, column 'batch_size': not a whole number"),
    "nan_seq.csv": ("timestamp,seq_len\n1.0,5\n2.0,\n3.0,7\n", "line 3, column 'seq_len': empty (NaN)"),
    "text_shape.csv": ("timestamp,request_id\n1.0,abc\n", "line 2, column 'request_id': not a number"),
    "empty_model.csv": ("timestamp,model\n1.0,a\n2.0,\n", "line 3, column 'model': empty model name"),
    "inf_time.csv": ("timestamp\n1.0\ninf\n", "line 3, column 'timestamp': not a finite time"),
    "ragged.csv": ("timestamp,batch_size\n1.0,1\n2.0,1,5,6\n", "not a readable CSV table"),
    "notes.txt": ("timestamp\n1\n", "unknown traffic file type '.txt'"),
    "broken.parquet": ("this is not parquet", "not a readable Parquet file"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_input_is_exit_2_and_one_line(name, tmp_path, capsys):
    content, expected = MALFORMED[name]
    path = tmp_path / name
    path.write_text(content)
    assert main(["traffic", "stats", str(path)]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"tuner: error: {path}"), lines[0]
    assert expected in lines[0], lines[0]
    assert path.read_text() == content  # never modifies the user's file


def test_missing_file_is_exit_2(tmp_path, capsys):
    assert main(["traffic", "stats", str(tmp_path / "nope.csv")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_parquet_rows_are_counted_from_one(tmp_path):
    path = tmp_path / "p.parquet"
    pd.DataFrame({"timestamp": [1.0, 2.0, 3.0], "batch_size": [1, 1, 0]}).to_parquet(path)
    with pytest.raises(TrafficError, match=r"p.parquet: row 3, column 'batch_size'"):
        read_traffic(path)


def test_malformed_file_in_a_real_process_prints_no_traceback(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("timestamp,batch_size\n1.0,1\n2.0,zero\n")
    run = subprocess.run(
        [sys.executable, "-m", "tuner", "traffic", "stats", str(path)], capture_output=True, text=True
    )
    assert run.returncode == 2
    assert run.stderr.strip() == f"tuner: error: {path}: line 3, column 'batch_size': not a number: 'zero'"
    assert "Traceback" not in run.stderr + run.stdout


def test_public_api_others_code_against():
    import inspect

    import tuner.traffic as traffic

    contract = {
        "read_traffic": ["path"],
        "write_traffic": ["df", "path"],
        "validate_traffic": ["df", "source", "first_line"],
        "due_offsets": ["df", "speed"],
        "window": ["df", "start_s", "duration_s"],
        "busiest_window": ["df", "duration_s"],
        "scale_time": ["df", "speed"],
        "describe": ["df", "busiest_s"],
        "shape_columns": ["df"],
        "import_azure": ["path"],
        "import_csv": ["path", "mapping", "time_unit"],
    }
    for name, params in contract.items():
        assert list(inspect.signature(getattr(traffic, name)).parameters) == params, name
    for name in ("synth_poisson", "synth_bursty", "synth_diurnal", "synth_flash_crowd"):
        params = list(inspect.signature(getattr(traffic, name)).parameters)
        assert params[1:4] == ["duration_s", "seed", "sizes"], name
    assert set(contract) | {"format_stats", "import_triton_trace", "plot_stats"} <= set(traffic.__all__)


# --- paths the OS refuses (these fail for root too: no chmod) ------------------------------------

LONG_NAME = "a" * 300 + ".csv"  # above the 255 bytes a file name may have on Linux filesystems


def _unreadable(case: str, tmp_path) -> tuple:
    if case == "a name too long":
        return tmp_path / LONG_NAME, "cannot read (File name too long)"
    if case == "a directory":
        (tmp_path / "day.csv").mkdir()
        return tmp_path / "day.csv", "is a directory, not a traffic file"
    if case == "a directory without a suffix":
        (tmp_path / "profiles").mkdir()
        return tmp_path / "profiles", "is a directory, not a traffic file"
    if case == "a symbolic-link loop":
        (tmp_path / "a.csv").symlink_to(tmp_path / "b.csv")
        (tmp_path / "b.csv").symlink_to(tmp_path / "a.csv")
        return tmp_path / "a.csv", "cannot read (Too many levels of symbolic links)"
    if case == "a FIFO":  # opening it would wait for a writer forever
        os.mkfifo(tmp_path / "pipe.csv")
        return tmp_path / "pipe.csv", "not a regular file"
    if case == "unreadable":
        (tmp_path / "t.parquet").symlink_to(write_only_file())
        return tmp_path / "t.parquet", "cannot read (Permission denied)"
    (tmp_path / "f").write_text("timestamp\n1\n")
    return tmp_path / "f" / "t.csv", "cannot read (Not a directory)"


def write_only_file() -> Path:
    """A file no process can read, root included: a write-only sysfs attribute (EACCES on open)."""
    return sorted(Path("/sys/bus").glob("*/drivers_probe"))[0]


READ_CASES = ["a name too long", "a directory", "a directory without a suffix", "a file in the way",
              "a symbolic-link loop", "a FIFO", "unreadable"]


@pytest.mark.parametrize("case", READ_CASES)
def test_a_path_that_cannot_be_read_is_one_line(case, tmp_path, capsys):
    path, expected = _unreadable(case, tmp_path)
    with pytest.raises(TrafficError) as exc:
        read_traffic(path)
    assert str(exc.value) == f"{path}: {expected}"
    if case.startswith("a directory"):
        # `traffic stats` reads a directory as one recording of the files in it: this one has none
        expected = "an empty directory (no .parquet, .pq or .csv files in it)"
    assert main(["traffic", "stats", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"tuner: error: {path}: {expected}\n"


def _unwritable(case: str, tmp_path) -> tuple:
    if case == "a name too long":
        return tmp_path / LONG_NAME, "cannot write (File name too long: 304 bytes, the most here is 255)"
    if case == "a directory in the way":
        (tmp_path / "out.csv").mkdir()
        return tmp_path / "out.csv", "cannot write: it is a directory"
    if case == "a file where its folder should be":
        (tmp_path / "f").write_text("x")
        return tmp_path / "f" / "out.csv", f"cannot write: {tmp_path / 'f'} is not a directory"
    if case == "no folder":
        return tmp_path / "nowhere" / "out.csv", f"cannot write: no directory {tmp_path / 'nowhere'}"
    # procfs takes no new file, not even root's
    return Path("/proc/tuner-out.csv"), "cannot write: the directory /proc takes no new file ("


WRITE_CASES = ["a name too long", "a directory in the way", "a file where its folder should be", "no folder",
               "a system folder"]


@pytest.mark.parametrize("case", WRITE_CASES)
def test_a_path_that_cannot_be_written_is_one_traffic_error_and_nothing_is_written(case, tmp_path):
    path, expected = _unwritable(case, tmp_path)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(TrafficError) as exc:
        write_traffic(_table(), path)
    assert str(exc.value).startswith(f"{path}: {expected}"), str(exc.value)
    assert "\n" not in str(exc.value)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_a_write_leaves_only_the_file_it_names(tmp_path):
    for name in ("t.csv", "t.parquet"):
        write_traffic(_table(), tmp_path / name)
        write_traffic(_table().iloc[:10], tmp_path / name)  # over an existing one
        assert len(read_traffic(tmp_path / name)) == 10
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv", "t.parquet"]


# --- cells that are not one value (a Parquet list or struct column) -------------------------------

@pytest.mark.parametrize("column,cells,shown", [
    ("seq_len", [[1, 2], [3]], "a list ([1, 2])"),
    ("timestamp", [[0.0], [1.0]], "a list ([0.0])"),
    ("model", [["a"], ["b"]], "a list (['a'])"),
    ("batch_size", [{"n": 1}, {"n": 2}], "a mapping ({'n': 1})"),
])
def test_a_parquet_column_of_lists_is_refused_naming_it(column, cells, shown, tmp_path, capsys):
    path = tmp_path / "nested.parquet"
    table = {"timestamp": [0.0, 1.0], column: cells}
    pd.DataFrame(table).to_parquet(path)
    expected = f"{path}: row 1, column {column!r}: {shown}, not one value per request"
    with pytest.raises(TrafficError) as exc:
        read_traffic(path)
    assert str(exc.value) == expected
    assert main(["traffic", "stats", str(path)]) == 2
    assert capsys.readouterr().err == f"tuner: error: {expected}\n"


def test_a_list_after_plain_values_is_named_by_its_row():
    df = pd.DataFrame({"timestamp": [0.0, 1.0, 2.0], "seq_len": pd.Series([4, 5, (6, 7)], dtype=object)})
    with pytest.raises(TrafficError, match=r"^frame: row 3, column 'seq_len': a tuple \(\(6, 7\)\), not one"):
        validate_traffic(df, "frame")


def test_an_arrow_list_column_is_refused():
    import pyarrow as pa

    lists = pd.Series([None, [2, 3]], dtype=pd.ArrowDtype(pa.list_(pa.int64())))
    with pytest.raises(TrafficError, match=r"^frame: row 2, column 'seq_len': a list \(\[2, 3\]\)"):
        validate_traffic(pd.DataFrame({"timestamp": [0.0, 1.0], "seq_len": lists}), "frame")


# --- text encodings: Excel's "CSV UTF-8" starts with a byte-order mark -----------------------------

@pytest.mark.parametrize("head", [
    b"\xef\xbb\xbftimestamp,seq_len\r\n",  # Excel's CSV UTF-8: a BOM and CRLF lines
    b'\xef\xbb\xbf"timestamp","seq_len"\r\n',
    b"\xef\xbb\xbf\xef\xbb\xbftimestamp,seq_len \n",  # marked twice (a BOM saved again), a trailing space
])
def test_a_csv_with_a_byte_order_mark_reads_as_without(head, tmp_path):
    path = tmp_path / "excel.csv"
    path.write_bytes(head + b"1.5,7\r\n2.5,9\r\n")
    df = read_traffic(path)
    assert list(df.columns) == ["timestamp", "batch_size", "seq_len"]
    assert df["timestamp"].tolist() == [1.5, 2.5] and df["seq_len"].tolist() == [7, 9]


def test_utf16_text_is_named_as_such(tmp_path, capsys):
    path = tmp_path / "unicode.csv"
    path.write_bytes("timestamp,seq_len\n1,7\n".encode("utf-16"))  # Excel's "Unicode Text"
    assert main(["traffic", "stats", str(path)]) == 2
    assert capsys.readouterr().err == (f"tuner: error: {path}: not a readable CSV table "
                                       "(UTF-16 text; save it as UTF-8 CSV)\n")


def test_a_column_name_with_a_character_that_does_not_show_is_quoted(tmp_path):
    path = tmp_path / "zw.csv"
    path.write_text("\u200btimestamp,seq_len\n1,7\n")  # a zero-width space before the name
    with pytest.raises(TrafficError, match=r"no 'timestamp' column \(columns found: '\\u200btimestamp', seq_len\)"):
        read_traffic(path)


def test_a_parquet_binary_model_column_reads_as_the_names(tmp_path):
    path = tmp_path / "binary.parquet"
    pd.DataFrame({"timestamp": [1.0, 2.0], "model": [b"bert", b"resnet"]}).to_parquet(path)
    assert read_traffic(path)["model"].tolist() == ["bert", "resnet"]


def test_a_generative_table_keeps_its_tokens_and_prefix_ids(tmp_path):
    from tuner.traffic.io import is_generative

    df = pd.DataFrame({"timestamp": [2.0, 1.0, 3.0], "prompt_tokens": [100, 7, 3000],
                       "output_tokens": [20, 1, 500], "prefix_id": ["chat-1", "chat-1", 42]})
    for suffix in ("csv", "parquet"):
        back = read_traffic(write_traffic(df, tmp_path / f"g.{suffix}"))
        assert back["prompt_tokens"].tolist() == [7, 100, 3000] and back["output_tokens"].tolist() == [1, 20, 500]
        assert back["prompt_tokens"].dtype == np.int64 and back["output_tokens"].dtype == np.int64
        assert back["prefix_id"].tolist() == ["chat-1", "chat-1", "42"]  # an id, not a size
        assert is_generative(back) and shape_columns(back) == ["prompt_tokens", "output_tokens"]
    assert not is_generative(df.drop(columns="output_tokens"))
    ids = pd.DataFrame({"timestamp": [1.0, 2.0], "prompt_tokens": 5, "output_tokens": 5, "prefix_id": [3.0, 12.0]})
    assert validate_traffic(ids, "x")["prefix_id"].tolist() == ["3", "12"]  # a CSV's ids with a gap read as floats


@pytest.mark.parametrize("cells,expected", [
    ("1.0,10,\n", "line 2, column 'output_tokens': empty (NaN) (every generative request needs its output tokens, "
                  "at least 1)"),
    ("1.0,10,5\n2.0,10,0\n", "line 3, column 'output_tokens': must be a positive integer, got 0 (every generative "
                             "request needs its output tokens, at least 1)"),
    ("1.0,0,5\n", "line 2, column 'prompt_tokens': must be a positive integer, got 0 (every generative request "
                  "needs its prompt tokens, at least 1)"),
])
def test_a_row_without_its_output_length_is_one_line_naming_it(cells, expected, tmp_path, capsys):
    path = tmp_path / "g.csv"
    path.write_text("timestamp,prompt_tokens,output_tokens\n" + cells)
    assert main(["traffic", "stats", str(path)]) == 2
    assert capsys.readouterr().err == f"tuner: error: {path}: {expected}\n"


def test_an_empty_prefix_id_is_named():
    df = pd.DataFrame({"timestamp": [1.0, 2.0], "prompt_tokens": 5, "output_tokens": 5, "prefix_id": ["a", " "]})
    with pytest.raises(TrafficError, match=r"^x: row 2, column 'prefix_id': empty$"):
        validate_traffic(df, "x")


def test_a_csv_written_as_parquet_chunk_by_chunk_reads_back_as_the_csv(tmp_path):
    """csv_to_parquet: each chunk made a table by the caller (its first file line given), the rows
    written counted after each chunk, and the file the same table read_traffic reads from the CSV."""
    from tuner.traffic.io import csv_to_parquet, validate_part

    src = tmp_path / "t.csv"
    write_traffic(_table(), src)
    lines, written = [], []

    def table(chunk, line):
        lines.append(line)
        return validate_part(chunk, str(src), first_line=line)

    rows = csv_to_parquet(src, tmp_path / "t.parquet", rows=200, table=table, on_rows=written.append)
    assert rows == 500 and written == [200, 400, 500] and lines == [2, 202, 402]
    pd.testing.assert_frame_equal(read_traffic(tmp_path / "t.parquet"), read_traffic(src))


@pytest.mark.parametrize("text, expected", [
    ("timestamp,seq_len\n", "t.csv: no requests (a header but no rows)"),
    # a broken row past the first chunk: pandas' error comes as that chunk is read, and is one line
    ("timestamp,seq_len\n1,3\n2,4\n3,5,9,9\n", "t.csv: not a readable CSV table ("),
])
def test_a_csv_that_cannot_become_parquet_is_one_line_and_nothing_is_written(text, expected, tmp_path):
    from tuner.traffic.io import csv_to_parquet, validate_part

    src = tmp_path / "t.csv"
    src.write_text(text)
    with pytest.raises(TrafficError) as caught:
        csv_to_parquet(src, tmp_path / "t.parquet", rows=2,
                       table=lambda chunk, line: validate_part(chunk, str(src), first_line=line))
    message = str(caught.value)
    assert message.startswith(f"{tmp_path}/{expected}") and "\n" not in message, message
    assert ("line 4" in message) == ("5,9,9" in text)  # pandas names the broken row's line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


@pytest.mark.parametrize("reader", ["whole", "chunks"])
def test_a_ctrl_c_while_a_csv_is_read_is_the_interrupt_not_a_bad_file(reader, tmp_path, monkeypatch):
    # pandas' C parser turned a SIGINT that landed in its read into a ParserError ("Calling
    # read(nbytes) on source failed") with nothing behind it: `tuner: error: big.csv: not a readable CSV
    # table`, exit 2, instead of `tuner: interrupted`, exit 130
    from tuner.traffic import io as traffic_io

    big = tmp_path / "big.csv"
    big.write_bytes(b"ts,tokens\n" + b"".join(b"%d,%d\n" % (i, i % 50 + 1) for i in range(1_000_000)))
    reading = threading.Event()

    class Reading(io.FileIO):
        """The file, saying once its second block is asked for: the read is under way."""

        def readinto(self, buffer) -> int:
            if self.tell() > 0:
                reading.set()
            return super().readinto(buffer)

    monkeypatch.setattr(traffic_io.files, "open_input", lambda path, **_: io.BufferedReader(Reading(path)))
    killer = threading.Thread(target=lambda: reading.wait(60) and os.kill(os.getpid(), signal.SIGINT))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own Ctrl-C
    killer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            if reader == "whole":
                traffic_io.read_raw(big)
            else:
                for _ in traffic_io._iter_csv(big, 100_000):
                    pass
    finally:
        killer.join()
        signal.signal(signal.SIGINT, previous)
