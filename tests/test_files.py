"""tuner.files: the values JSON outputs hold, and reading a JSON file a person gives."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tuner.errors import InputError, SettingsError
from tuner.files import json_safe, read_json_object


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
