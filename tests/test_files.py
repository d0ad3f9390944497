"""tuner.files: the values JSON outputs hold, and reading a JSON file a person gives."""

from __future__ import annotations

import json
import math
import os
import re

import numpy as np
import pytest

from tuner.errors import InputError, OutputError, SettingsError
from tuner.files import (
    check_output_dir,
    check_replaceable,
    json_safe,
    open_input,
    read_json_object,
    read_text,
)


def test_json_safe_turns_unmeasured_figures_into_null_and_numpy_into_plain_numbers():
    data = {"capacity": math.nan, "peak": math.inf, 4: np.float64(1.5), "sizes": (np.int64(3), -math.inf),
            "nested": [{"p99": np.float32(2.0)}]}
    safe = json_safe(data)
    assert safe == {"capacity": None, "peak": None, "4": 1.5, "sizes": [3, None], "nested": [{"p99": 2.0}]}
    assert json.loads(json.dumps(safe, allow_nan=False)) == safe  # strict JSON: no NaN token


@pytest.mark.parametrize("content, message", [
    (None, "x.json: not found (give a study's output)"),
    ("{nope", "x.json: not valid JSON (Expecting property name"),
    (b"\xff\xfe", "x.json: not valid JSON ('utf-8' codec"),
    ("[1, 2]", "x.json: expected a JSON object at the top level"),
    ("directory", "x.json: not valid JSON (Is a directory)"),
])
def test_a_json_file_that_is_not_an_object_is_one_line_naming_it(tmp_path, content, message):
    path = tmp_path / "x.json"
    if content == "directory":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(SettingsError) as raised:
        read_json_object(path, label="x.json", missing="not found (give a study's output)", error=SettingsError)
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def test_a_json_object_is_read_and_the_label_defaults_to_the_path(tmp_path):
    path = tmp_path / "s.json"
    path.write_text('{"best": null}')
    assert read_json_object(path) == {"best": None}
    with pytest.raises(InputError, match=f"^{tmp_path / 'missing.json'}: not found$"):
        read_json_object(tmp_path / "missing.json")


@pytest.mark.parametrize("case, reason", [
    ("loop", "Too many levels of symbolic links"),
    ("long", "File name too long"),
    ("under a file", "Not a directory"),
])
def test_read_text_of_a_name_the_os_refuses_is_one_line(tmp_path, case, reason):
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "f").write_text("x")
    path = {"loop": tmp_path / "loop", "long": tmp_path / ("y" * 300), "under a file": tmp_path / "f" / "x"}[case]
    with pytest.raises(SettingsError, match=rf"^{re.escape(str(path))}: cannot read \({reason}\)$"):
        read_text(path, error=SettingsError)


@pytest.mark.parametrize("case, message", [
    ("missing", "no such file"),
    ("directory", "is a directory, not a config.pbtxt"),
    ("fifo", "not a regular file"),
    ("not utf-8", "not a text file (byte 2 is not UTF-8)"),
])
def test_read_text_of_what_is_not_a_text_file_is_one_line_starting_with_the_label(tmp_path, case, message):
    path = tmp_path / "c.pbtxt"
    if case == "directory":
        path.mkdir()
    elif case == "fifo":
        os.mkfifo(path)  # read, it would block: refused before it is opened
    elif case == "not utf-8":
        path.write_bytes(b"ab\xff")
    with pytest.raises(SettingsError) as raised:
        read_text(path, label=f"--config {path}", what="a config.pbtxt", error=SettingsError)
    assert str(raised.value) == f"--config {path}: {message}"


def test_read_text_ends_every_line_in_a_newline_and_open_input_reads_the_bytes_as_they_are(tmp_path):
    path = tmp_path / "t.json"
    path.write_bytes(b"\xef\xbb\xbf[1,\r\n2,\r3]\n")
    assert read_text(path, error=InputError) == "\ufeff[1,\n2,\n3]\n"
    assert read_text(path, error=InputError, encoding="utf-8-sig") == "[1,\n2,\n3]\n"
    with open_input(path, error=InputError) as fh:
        assert fh.read() == path.read_bytes()


def test_read_text_refuses_a_file_past_its_limit_by_size_and_a_stream_past_it_by_what_it_read(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("a: 1\n" * 1000)
    assert read_text(path, error=SettingsError, max_bytes=5000) == "a: 1\n" * 1000
    with pytest.raises(SettingsError, match=r"big.yaml: too large \(5,000 bytes; at most 4,999 bytes is read\)$"):
        read_text(path, error=SettingsError, max_bytes=4999)
    with pytest.raises(SettingsError, match=r"/proc/self/status: too large \(over 10 bytes; at most 10 bytes is read\)$"):
        read_text("/proc/self/status", error=SettingsError, max_bytes=10)  # stat says 0 bytes


def test_an_output_directory_check_refuses_a_symbolic_link_loop_and_makes_nothing(tmp_path):
    (tmp_path / "loop").symlink_to("loop")
    for create in (False, True):
        with pytest.raises(OutputError, match=r"^output directory .*/loop: cannot write there \(Too many levels"):
            check_output_dir(tmp_path / "loop", "output directory", create=create)
    check_output_dir(tmp_path / "new" / "out", "output directory", create=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop"]


def test_check_replaceable_lets_through_nothing_there_force_or_a_file_tuner_wrote_and_refuses_the_rest(tmp_path):
    from tuner.modelconfig import EXPORT_HEADER, written_by_tuner

    new, mine, theirs = tmp_path / "new", tmp_path / "mine.pbtxt", tmp_path / "theirs.pbtxt"
    mine.write_text(f"{EXPORT_HEADER}0.1\nname: \"m\"\n")
    theirs.write_text("name: \"m\"\n")
    ours = lambda p: written_by_tuner(p, text="max_batch_size: 8\n")  # noqa: E731
    assert check_replaceable(new, force=False, ours=ours) == new
    assert check_replaceable(mine, force=False, ours=ours) == mine
    assert check_replaceable(theirs, force=True, ours=ours) == theirs
    with pytest.raises(OutputError, match=f"^{re.escape(str(theirs))}: exists and tuner did not write it: give "
                                          "--force to replace it, or write to another file$"):
        check_replaceable(theirs, force=False, ours=ours)
    # the same text already is nothing lost; without `ours` any file there is refused, under its label
    theirs.write_text("max_batch_size: 8\n")
    assert check_replaceable(theirs, force=False, ours=ours) == theirs
    with pytest.raises(SettingsError, match="^-o x: already exists; give --force"):
        check_replaceable(mine, force=False, label="-o x", error=SettingsError)
    # a dangling link (a write would follow it) and a FIFO (not to be read) are there, and not tuner's
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    os.mkfifo(tmp_path / "fifo")
    for path in (tmp_path / "link", tmp_path / "fifo"):
        with pytest.raises(OutputError, match="exists and tuner did not write it"):
            check_replaceable(path, force=False, ours=ours)


def test_a_cache_directory_that_cannot_be_made_or_written_is_one_line_naming_its_variable(tmp_path, monkeypatch):
    # TUNER_TRAFFIC_CACHE naming a file gave FileExistsError's traceback where a CSV was converted
    from tuner.files import user_cache

    monkeypatch.setenv("TUNER_X_CACHE", str(tmp_path / "made" / "here"))
    assert user_cache("TUNER_X_CACHE", "x") == tmp_path / "made" / "here" and (tmp_path / "made" / "here").is_dir()
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("TUNER_X_CACHE", str(tmp_path / "afile"))
    with pytest.raises(OutputError, match=rf"^TUNER_X_CACHE={tmp_path / 'afile'}: exists and is not a directory$"):
        user_cache("TUNER_X_CACHE", "x")
    monkeypatch.setenv("TUNER_X_CACHE", "/proc/nonexist")
    with pytest.raises(OutputError, match=r"^TUNER_X_CACHE=/proc/nonexist: cannot write there"):
        user_cache("TUNER_X_CACHE", "x")
    monkeypatch.delenv("TUNER_X_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "afile"))
    with pytest.raises(OutputError, match=r"the cache directory .* \(set TUNER_X_CACHE for another\)"):
        user_cache("TUNER_X_CACHE", "x")


def test_a_traffic_cache_that_cannot_be_written_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    from tuner.cli import main

    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("TUNER_TRAFFIC_CACHE", str(tmp_path / "afile"))
    csv = tmp_path / "t.csv"
    csv.write_text("timestamp\n0.0\n1.0\n")
    assert main(["traffic", "stats", str(csv)]) == 2
    assert capsys.readouterr().err == f"tuner: error: TUNER_TRAFFIC_CACHE={tmp_path / 'afile'}: exists and is not a directory\n"


def test_cache_path_is_the_rule_alone_and_makes_nothing(tmp_path, monkeypatch):
    from tuner.files import cache_path, user_cache

    monkeypatch.delenv("TUNER_X_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_path("TUNER_X_CACHE", "x/1.0") == tmp_path / "xdg" / "tuner" / "x" / "1.0"
    assert not (tmp_path / "xdg").exists()
    assert user_cache("TUNER_X_CACHE", "x") == tmp_path / "xdg" / "tuner" / "x" and (tmp_path / "xdg" / "tuner" / "x").is_dir()
    monkeypatch.setenv("TUNER_X_CACHE", str(tmp_path / "mine"))
    assert cache_path("TUNER_X_CACHE", "x") == tmp_path / "mine" and not (tmp_path / "mine").exists()
