"""`tuner traffic synth|window|fit|scale|convert`: each command end to end through `tuner.cli.main`."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tuner.cli import main
from tuner.traffic import busiest_window, read_traffic, write_traffic


@pytest.fixture
def profile(tmp_path):
    times = np.concatenate([np.arange(0, 10, 1.0), 20 + np.arange(50) * 0.01, np.arange(30, 40, 1.0)])
    df = pd.DataFrame({"timestamp": 1000 + times, "seq_len": np.arange(len(times)) + 1})
    return write_traffic(df, tmp_path / "p.csv")


def test_window_start_duration(profile, tmp_path, capsys):
    out = tmp_path / "w.csv"
    assert main(["traffic", "window", str(profile), "--start", "5", "--duration", "10s", "-o", str(out)]) == 0
    assert read_traffic(out)["timestamp"].tolist() == [1005.0, 1006.0, 1007.0, 1008.0, 1009.0]


def test_window_busiest(profile, tmp_path, capsys):
    out = tmp_path / "b.parquet"
    assert main(["traffic", "window", str(profile), "--busiest", "2", "-o", str(out)]) == 0
    df = read_traffic(out)
    assert len(df) == 50 and df["timestamp"].iloc[0] == 1020.0
    assert busiest_window(read_traffic(profile), 2.0) == (20.0, 50)
    assert "busiest 2 s window starts 20.000 s" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args,expected",
    [
        (["--start", "500", "--duration", "5"], "holds no requests"),
        (["--busiest", "5", "--duration", "5"], "--duration goes with --start"),
        (["--start", "soon"], "--start: cannot read 'soon'"),
    ],
)
def test_window_errors_are_exit_2(profile, tmp_path, capsys, args, expected):
    assert main(["traffic", "window", str(profile), *args, "-o", str(tmp_path / "x.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0]


def test_fit_keeps_the_requests_within_the_context_and_says_how_many_it_left_out(tmp_path, capsys):
    tokens = pd.DataFrame({"timestamp": np.arange(5.0), "prompt_tokens": [100, 2000, 1948, 3000, 10],
                           "output_tokens": [10, 100, 100, 5, 2038]})
    source = write_traffic(tokens, tmp_path / "tokens.csv")
    before = source.read_bytes()
    out = tmp_path / "fit.csv"
    assert main(["traffic", "fit", str(source), "--context", "2048", "-o", str(out)]) == 0
    kept = read_traffic(out)
    assert kept["timestamp"].tolist() == [0.0, 2.0, 4.0]  # 2,048 tokens exactly fit; 2,100 and 3,005 do not
    assert "2 of 5 requests need more than 2,048 tokens: left out" in capsys.readouterr().out
    assert source.read_bytes() == before
    for args, expected in ((["--context", "0"], "must be at least 1 token"),
                           (["--context", "5"], "none of the 5 requests fits a context of 5 tokens")):
        assert main(["traffic", "fit", str(source), *args, "-o", str(tmp_path / "x.csv")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expected in err[0]
    assert not (tmp_path / "x.csv").exists()


def test_fit_of_a_trace_without_tokens_is_one_line(profile, tmp_path, capsys):
    assert main(["traffic", "fit", str(profile), "--context", "2048", "-o", str(tmp_path / "x.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "only a generative trace has tokens to fit" in err[0]


def test_refuses_to_overwrite_the_input(profile, capsys):
    before = profile.read_bytes()
    assert main(["traffic", "convert", str(profile), "-o", str(profile)]) == 2
    assert "the same file as the input" in capsys.readouterr().err  # tuner/cli/_args.check_paths
    assert profile.read_bytes() == before


def test_scale_and_convert(profile, tmp_path):
    out = tmp_path / "s.parquet"
    assert main(["traffic", "scale", str(profile), "--speed", "2", "-o", str(out)]) == 0
    scaled, original = read_traffic(out), read_traffic(profile)
    assert np.allclose(scaled["timestamp"] - 1000, (original["timestamp"] - 1000) / 2)
    back = tmp_path / "back.csv"
    assert main(["traffic", "convert", str(out), "-o", str(back)]) == 0
    pd.testing.assert_frame_equal(read_traffic(back), scaled, check_exact=True)


@pytest.mark.parametrize(
    "kind,extra",
    [
        ("poisson", []),
        ("diurnal", ["--period", "1m"]),
        ("bursty", []),
        ("flash-crowd", ["--spike-at", "10s"]),
    ],
)
def test_synth_each_kind(kind, extra, tmp_path, capsys):
    out = tmp_path / f"{kind}.csv"
    argv = [
        "traffic",
        "synth",
        kind,
        "--rate",
        "50",
        "--duration",
        "1m",
        "--seed",
        "3",
        "--size",
        "seq_len=lognormal:median=100,sigma=0.5,max=256",
        *extra,
        "-o",
        str(out),
    ]
    assert main(argv) == 0
    df = read_traffic(out)
    assert len(df) > 500 and df["seq_len"].max() <= 256 and df["timestamp"].max() < 60
    again = tmp_path / "again.csv"
    assert main(argv[:-1] + [str(again)]) == 0
    assert again.read_bytes() == out.read_bytes()


def test_synth_bad_size_is_exit_2(tmp_path, capsys):
    argv = [
        "traffic",
        "synth",
        "poisson",
        "--rate",
        "5",
        "--duration",
        "10",
        "--size",
        "seq_len=gauss:3",
        "-o",
        str(tmp_path / "x.csv"),
    ]
    assert main(argv) == 2
    assert "unknown kind 'gauss'" in capsys.readouterr().err


def test_synth_a_column_sized_twice_is_refused_not_the_last_taken(tmp_path, capsys):
    out = tmp_path / "x.csv"
    argv = ["traffic", "synth", "poisson", "--rate", "5", "--duration", "10",
            "--size", "seq_len=constant:128", "--size", "seq_len=constant:64", "-o", str(out)]
    assert main(argv) == 2
    assert "seq_len is given twice" in capsys.readouterr().err and not out.exists()


# --- paths the OS refuses: checked before any work, one line, nothing written ---------------------

LONG_NAME = "a" * 300 + ".csv"


def _bad_output(case: str, tmp_path):
    if case == "a name too long":
        return tmp_path / LONG_NAME, "File name too long"
    if case == "a directory in the way":
        (tmp_path / "out.csv").mkdir()
        return tmp_path / "out.csv", "it is a directory"
    return Path("/proc/tuner-out.parquet"), "the directory /proc takes no new file ("


@pytest.mark.parametrize("case", ["a name too long", "a directory in the way", "a system folder"])
@pytest.mark.parametrize("command", [
    ["convert", "IN"], ["scale", "IN", "--speed", "2"], ["window", "IN", "--start", "0"],
    ["import", "csv", "IN"], ["import", "triton", "IN"], ["import", "azure", "IN"],
    ["synth", "poisson", "--rate", "5", "--duration", "10"],
])
def test_an_output_that_cannot_be_written_is_refused_before_the_work(command, case, tmp_path, capsys):
    out, expected = _bad_output(case, tmp_path)
    missing = tmp_path / "missing.csv"  # had the input been read first, the error would name it
    before = sorted(p.name for p in tmp_path.rglob("*"))
    argv = ["traffic", *[str(missing) if a == "IN" else a for a in command], "-o", str(out)]
    assert main(argv) == 2
    captured = capsys.readouterr()
    # the command line's own check names the option (`-o PATH`), the traffic writer the path alone
    assert captured.out == "" and re.match(rf"tuner: error: (-o )?{re.escape(str(out))}: cannot write",
                                           captured.err), captured.err
    assert captured.err.count("\n") == 1 and expected in captured.err, captured.err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("plot,expected", [
    ("/proc/tuner-rate.png", "cannot write: the directory /proc takes no new file ("),
    ("DIR/" + "b" * 300 + ".png", "File name too long"),
    ("DIR/rate.xyz", "unknown image type '.xyz'"),
])
def test_stats_plot_path_is_checked_before_the_stats(profile, tmp_path, capsys, plot, expected):
    plot = plot.replace("DIR", str(tmp_path))
    assert main(["traffic", "stats", str(profile), "--plot", plot]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith(f"tuner: error: {plot}: "), captured.err
    assert captured.err.count("\n") == 1 and expected in captured.err, captured.err


@pytest.mark.parametrize("kind,path_case,expected", [
    ("triton", "a name too long", "cannot read (File name too long)"),
    ("triton", "a directory", "is a directory, not a Triton trace file"),
    ("azure", "a name too long", "cannot read (File name too long)"),
    ("csv", "a directory", "is a directory, not a traffic file"),
])
def test_import_input_that_cannot_be_read_is_one_line(kind, path_case, expected, tmp_path, capsys):
    path = tmp_path / ("t" * 300 + ".json" if path_case == "a name too long" else "trace.csv")
    if path_case == "a directory":
        path.mkdir()
    assert main(["traffic", "import", kind, str(path), "-o", str(tmp_path / "out.csv")]) == 2
    err = capsys.readouterr().err
    assert err == f"tuner: error: {path}: {expected}\n"
    assert not (tmp_path / "out.csv").exists()


@pytest.mark.parametrize("kind,extra,rows", [
    ("poisson", ["--rate", "1e12", "--duration", "7d"], "605,000,000,000,000,000"),
    ("diurnal", ["--rate", "1e6", "--duration", "1d", "--amplitude", "0.5"], "130,000,000,000"),
    ("bursty", ["--rate", "1e6", "--duration", "1d"], "86,400,000,000"),
    ("flash-crowd", ["--rate", "1e5", "--duration", "1d"], "86,400,000,000"),
])
def test_synth_refuses_a_table_that_cannot_fit_before_making_it(kind, extra, rows, tmp_path, capsys):
    out = tmp_path / "huge.csv"
    start = time.perf_counter()
    assert main(["traffic", "synth", kind, *extra, "-o", str(out)]) == 2
    assert time.perf_counter() - start < 5  # refused from the arithmetic, not after trying
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"tuner: error: {kind.replace('-', ' ')}: "), err
    assert f"would make about {rows} rows, above the limit of 100,000,000 rows" in err, err
    assert not out.exists()


# --- an input the OS refuses: every traffic command that reads one says so in one line --------------

def _bad_input(case: str, tmp_path: Path, suffix: str) -> tuple[Path, str]:
    if case == "a name too long":
        return tmp_path / ("t" * 300 + suffix), "cannot read (File name too long)"
    if case == "a symbolic-link loop":
        (tmp_path / f"a{suffix}").symlink_to(tmp_path / f"b{suffix}")
        (tmp_path / f"b{suffix}").symlink_to(tmp_path / f"a{suffix}")
        return tmp_path / f"a{suffix}", "cannot read (Too many levels of symbolic links)"
    if case == "a file in the way":
        (tmp_path / "f").write_text("x")
        return tmp_path / "f" / f"t{suffix}", "cannot read (Not a directory)"
    if case == "a FIFO":  # opening it would wait for a writer forever
        os.mkfifo(tmp_path / f"pipe{suffix}")
        return tmp_path / f"pipe{suffix}", "not a regular file"
    # a write-only sysfs attribute: no process can open it for reading, root included
    (tmp_path / f"t{suffix}").symlink_to(sorted(Path("/sys/bus").glob("*/drivers_probe"))[0])
    return tmp_path / f"t{suffix}", "cannot read (Permission denied)"


INPUT_CASES = ["a name too long", "a symbolic-link loop", "a file in the way", "a FIFO", "unreadable"]


@pytest.mark.parametrize("case", INPUT_CASES)
@pytest.mark.parametrize("command,suffix", [
    (["stats", "IN"], ".csv"), (["convert", "IN", "-o", "OUT"], ".parquet"),
    (["scale", "IN", "--speed", "2", "-o", "OUT"], ".csv"), (["window", "IN", "--start", "0", "-o", "OUT"], ".csv"),
    (["import", "csv", "IN", "-o", "OUT"], ".parquet"), (["import", "azure", "IN", "-o", "OUT"], ".csv"),
    (["import", "triton", "IN", "-o", "OUT"], ".json"),
])
def test_every_traffic_input_the_os_refuses_is_one_line(command, suffix, case, tmp_path, capsys):
    path, expected = _bad_input(case, tmp_path, suffix)
    out = tmp_path / "out.csv"
    argv = ["traffic", *[{"IN": str(path), "OUT": str(out)}.get(a, a) for a in command]]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"tuner: error: {path}: {expected}\n", captured.err
    assert not out.exists()


def test_window_since_until_reads_dates_as_utc(tmp_path):
    # 2026-01-01 00:00:00 UTC, then one request a minute for an hour
    t0 = 1_767_225_600.0
    df = pd.DataFrame({"timestamp": t0 + 60.0 * np.arange(60), "seq_len": np.arange(60) + 1})
    path = write_traffic(df, tmp_path / "hour.parquet")
    out = tmp_path / "w.csv"
    assert main(["traffic", "window", str(path), "--since", "2026-01-01T00:10", "--until", "2026-01-01 00:20:00Z",
                 "-o", str(out)]) == 0
    assert read_traffic(out)["timestamp"].tolist() == (t0 + 60.0 * np.arange(10, 20)).tolist()
    assert main(["traffic", "window", str(path), "--since", "2026-01-01T01:00+02:00", "-o", str(out),
                 "--force"]) == 0
    assert read_traffic(out)["timestamp"].tolist() == (t0 + 60.0 * np.arange(60)).tolist()  # 23:00 UTC the day before


@pytest.mark.parametrize("args,expected", [
    (["--since", "2026-01-02"], "2026-01-02 00:00:00 UTC to the end holds no requests (the traffic spans 2026-01-01"),
    (["--since", "tomorrow"], "--since: cannot read 'tomorrow'"),
    (["--start", "5", "--until", "2026-01-02"], "--until goes with --since"),
    (["--since", "2026-01-01", "--duration", "5"], "with --since, give --until"),
    (["--since", "2026-01-01T00:30", "--until", "2026-01-01T00:10"], "must come after its start"),
])
def test_window_range_errors_are_one_line_exit_2(tmp_path, capsys, args, expected):
    df = pd.DataFrame({"timestamp": 1_767_225_600.0 + 60.0 * np.arange(60)})
    path = write_traffic(df, tmp_path / "hour.parquet")
    assert main(["traffic", "window", str(path), *args, "-o", str(tmp_path / "x.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert not (tmp_path / "x.csv").exists()


# --- an output that already exists: the user's own file is replaced only with --force --------------

WRITERS = [
    ["convert", "IN"], ["scale", "IN", "--speed", "2"], ["window", "IN", "--start", "0"], ["fit", "GEN", "--context", "99"],
    ["import", "csv", "IN"], ["synth", "poisson", "--rate", "5", "--duration", "10"],
]


def _writer_argv(command: list[str], profile: Path, out: Path) -> list[str]:
    generative = profile.with_name("gen.csv")
    generative.write_text("timestamp,prompt_tokens,output_tokens\n0,10,5\n1,20,5\n")
    return ["traffic", *[{"IN": str(profile), "GEN": str(generative)}.get(a, a) for a in command], "-o", str(out)]


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
@pytest.mark.parametrize("command", WRITERS, ids=lambda c: c[0])
def test_an_existing_output_is_kept_unless_force(command, suffix, profile, tmp_path, capsys):
    out = tmp_path / f"recording{suffix}"
    out.write_bytes(b"the user's own recording\n")
    argv = _writer_argv(command, profile, out)
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"tuner: error: {out}: already exists; give --force to replace it, or write to another " \
                           "file\n", captured.err
    assert out.read_bytes() == b"the user's own recording\n"
    assert main([*argv, "--force"]) == 0
    assert len(read_traffic(out)) > 0


def test_an_existing_symbolic_link_is_an_existing_output(profile, tmp_path, capsys):
    out = tmp_path / "link.csv"
    out.symlink_to(tmp_path / "elsewhere.csv")  # dangling: writing through it would make a file there
    assert main(["traffic", "convert", str(profile), "-o", str(out)]) == 2
    assert "already exists; give --force" in capsys.readouterr().err
    assert not (tmp_path / "elsewhere.csv").exists()


def test_an_existing_plot_is_kept_unless_force(profile, tmp_path, capsys):
    plot = tmp_path / "rate.png"
    plot.write_bytes(b"my own picture")
    assert main(["traffic", "stats", str(profile), "--plot", str(plot)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (f"tuner: error: {plot}: already exists; give --force to replace "
                                                   "it, or write to another file\n"), captured.err
    assert plot.read_bytes() == b"my own picture"
    assert main(["traffic", "stats", str(profile), "--plot", str(plot), "--force"]) == 0
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_force_never_writes_over_the_input(profile, tmp_path, capsys):
    before = profile.read_bytes()
    assert main(["traffic", "convert", str(profile), "-o", str(profile), "--force"]) == 2
    assert "the same file as the input" in capsys.readouterr().err
    # a file of a directory read as one recording, through another spelling of its path
    logs = tmp_path / "logs"
    logs.mkdir()
    hour = write_traffic(read_traffic(profile), logs / "hour.parquet")
    kept = hour.read_bytes()
    out = str(logs / ".." / "logs" / "hour.parquet")
    assert main(["traffic", "window", str(logs), "--start", "0", "-o", out, "--force"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"tuner: error: {out}: refusing to overwrite the input file; choose another output"], err
    assert hour.read_bytes() == kept and profile.read_bytes() == before


def test_scale_refuses_a_speed_that_stretches_past_a_timestamp_in_one_line(profile, tmp_path, capsys):
    out = tmp_path / "a.csv"
    assert main(["traffic", "scale", str(profile), "--speed", "1e-300", "-o", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("tuner: error: speed 1e-300: the traffic's 39 s would last 3.9e+301 s")
    assert not out.exists()


@pytest.mark.parametrize("kind,option,suffix", [
    ("azure", ["--map", "seq_len=GeneratedTokens"], ".csv"),
    ("azure", ["--time-unit", "ms"], ".csv"),
    ("azure", ["--time-unit", "ms"], ".parquet"),  # streamed, a chunk at a time
    ("azure", ["--include-children"], ".csv"),
    ("triton", ["--map", "timestamp=ts"], ".csv"),
    ("triton", ["--time-unit", "s"], ".csv"),
    ("csv", ["--include-children"], ".parquet"),
])
def test_import_refuses_an_option_of_another_kind_in_one_line(kind, option, suffix, tmp_path, capsys):
    src = tmp_path / "az2.csv"
    src.write_text("TIMESTAMP,ContextTokens,GeneratedTokens,timestamp\n1,10,5,1\n2,20,6,2\n")
    out = tmp_path / f"out{suffix}"
    assert main(["traffic", "import", kind, str(src), "-o", str(out), *option]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tuner: error: {option[0]} ") and err.count("\n") == 1, err
    assert f"not to 'traffic import {kind}'" in err
    assert not out.exists()
