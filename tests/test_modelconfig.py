"""config.pbtxt via Triton's schema: parse/print, Triton's scheduling rules, --set, apply, diff.

The corpus is 262 real config.pbtxt files from Triton's repositories; directories with an `expected`
file hold Triton's own expected error message for that config (a regular expression, as Triton's
QA greps for it).
"""

from __future__ import annotations

import json
import re
import urllib.request

import pytest
from google.protobuf import text_format
from triton_corpus import (
    CORPUS,
    FILES,
    IO_MESSAGE,
    MISSING,
    SCHEDULING_MESSAGE,
    corpus_file,
    expected_message,
    ids,
)

from tuner import modelconfig, space
from tuner.errors import ConfigError, ServerSetupError
from tuner.server.local import LocalLauncher

SCHEDULING_CASES = [p for p in FILES if SCHEDULING_MESSAGE.search(expected_message(p) or "")] or [MISSING]
IO_CASES = [p for p in FILES if IO_MESSAGE.search(expected_message(p) or "")] or [MISSING]
VALID_CASES = [p for p in FILES if expected_message(p) is None] or [MISSING]


def test_corpus_is_there_and_big_enough():
    corpus_file(FILES[0] if FILES else MISSING)
    assert len(FILES) >= 250, f"{CORPUS} holds only {len(FILES)} config.pbtxt"
    assert len(SCHEDULING_CASES) >= 15, SCHEDULING_CASES


# --- parse / print ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", FILES or [MISSING], ids=ids(FILES or [MISSING]))
def test_parse_print_parse_is_identical(path):
    config = modelconfig.load(corpus_file(path))
    text = modelconfig.to_text(config)
    again = modelconfig.parse(text, "printed")
    assert again == config
    assert modelconfig.diff_fields(config, again) == []
    assert modelconfig.to_text(again) == text
    assert modelconfig.from_json(modelconfig.to_json(config)) == config


@pytest.mark.parametrize("path", FILES or [MISSING], ids=ids(FILES or [MISSING]))
def test_printing_with_the_original_keeps_every_comment(path):
    original = corpus_file(path).read_text()
    config = modelconfig.parse(original, str(path))
    text = modelconfig.to_text(config, comments_from=original)
    assert modelconfig.parse(text, "printed") == config
    assert comments(text) == comments(original)


def comments(text: str) -> list[str]:
    """Every comment of a config.pbtxt (sorted: a nested one moves above its block), as the
    tokenizer of protobuf's text format sees them."""
    tokenizer = text_format.Tokenizer(text.splitlines(), skip_comments=False)
    found = []
    while not tokenizer.AtEnd():
        if tokenizer.token.startswith("#"):
            found.append(tokenizer.token.rstrip())
        tokenizer.NextToken()
    return sorted(found)


def test_syntax_error_names_line_and_column():
    with pytest.raises(ConfigError) as exc:
        modelconfig.parse(
            'name: "m"\nmax_batch_size: 8\ndynamic_batching { max_queue_delay: 3 }\n', "m/config.pbtxt"
        )
    assert str(exc.value).startswith("m/config.pbtxt:3:20: ")
    assert "max_queue_delay" in str(exc.value)


@pytest.mark.parametrize(
    "content,message",
    [
        (None, "no such file"),
        (b"\x89PNG\r\n\x1a\n\x00\xff\xfe", "not a text file"),
        (b"\x00\x01\x02 binary", ":1:1: "),
        (b"max_batch_size: 99999999999999", "out of range"),
    ],
    ids=["missing", "not-utf8", "nul-bytes", "int32-overflow"],
)
def test_load_bad_files_is_one_config_error(tmp_path, content, message):
    path = tmp_path / "config.pbtxt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError) as exc:
        modelconfig.load(path)
    text = str(exc.value)
    assert text.startswith(str(path)) and message in text and "\n" not in text


def test_load_a_directory_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="is a directory"):
        modelconfig.load(tmp_path)


# --- Triton's rules ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", SCHEDULING_CASES, ids=ids(SCHEDULING_CASES))
def test_scheduling_cases_are_rejected_with_tritons_message(path):
    config = modelconfig.load(corpus_file(path))
    with pytest.raises(ConfigError) as exc:
        modelconfig.validate(config, str(path))
    message = str(exc.value)
    assert message.startswith(f"{path}: ")
    assert re.search(expected_message(path), message), (expected_message(path), message)


@pytest.mark.parametrize("path", IO_CASES, ids=ids(IO_CASES))
def test_io_cases_are_rejected_with_tritons_message(path):
    config = modelconfig.load(corpus_file(path))
    with pytest.raises(ConfigError) as exc:
        modelconfig.validate(config, str(path))
    assert re.search(expected_message(path), str(exc.value)), (expected_message(path), str(exc.value))


def test_corpus_holds_tritons_io_cases():
    assert len(IO_CASES) >= 25, IO_CASES


@pytest.mark.parametrize("path", VALID_CASES, ids=ids(VALID_CASES))
def test_configs_without_an_expected_error_are_accepted(path):
    modelconfig.validate(modelconfig.load(corpus_file(path)), str(path))


BASE = """
name: "m"
backend: "python"
max_batch_size: 8
dynamic_batching { }
"""


def with_base(extra: str) -> modelconfig.ModelConfig:
    """BASE with `extra` merged over it (later fields win, as Merge has them)."""
    config = modelconfig.parse(BASE, "base")
    text_format.Merge(extra, config)
    return config


@pytest.mark.parametrize(
    "extra,message",
    [
        ("max_batch_size: -1", "'max_batch_size' must be non-negative value for m"),
        (
            "dynamic_batching { preferred_batch_size: [0] }",
            "dynamic batching preferred size must be positive for m",
        ),
        (
            "dynamic_batching { preferred_batch_size: [4, 16] }",
            "dynamic batching preferred size must be <= max batch size for m",
        ),
        (
            "max_batch_size: 0 dynamic_batching { preferred_batch_size: [1] }",
            "dynamic batching preferred size must be <= max batch size for m",
        ),
        (
            "dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
            "default priority level must be in range [1, 2] for m",
        ),
        (
            "dynamic_batching { priority_levels: 2 default_priority_level: 1 priority_queue_policy { key: 3 value { } } }",
            "priority queue policy must have priority level in range [1, 2] for m",
        ),
        (
            "dynamic_batching { preserve_ordering: true default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5 } }",
            "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for m",
        ),
        (
            "sequence_batching { oldest { preferred_batch_size: [9] } }",
            "sequence batching preferred batch size must be <= max batch size for m",
        ),
        (
            "sequence_batching { direct { minimum_slot_utilization: 1.5 } }",
            "sequence batching minimum slot utilization must be in range (0.0, 1.0] for m",
        ),
        (
            "instance_group [ { kind: KIND_MODEL gpus: [ 1 ] } ]",
            "instance group m_0 of model m has kind KIND_MODEL but specifies one or more GPUs",
        ),
        ('platform: "ensemble"', "ensemble scheduling must be set for ensemble m whose platform is ensemble"),
        (
            'sequence_batching { control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] } ] }, '
            '{ name: "S" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1] } ] } ] }',
            "sequence batching control tensor 'S' is specified for multiple control kinds for m",
        ),
        (
            'sequence_batching { control_input [ { name: "E" control [ { kind: CONTROL_SEQUENCE_END '
            "int32_false_true: [0, 1] fp32_false_true: [0, 1] } ] } ] }",
            "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and "
            "'bool_false_true' for CONTROL_SEQUENCE_END for m",
        ),
        (
            'sequence_batching { control_input [ { name: "R" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [true] } ] } ] }',
            "sequence batching control 'bool_false_true' must have exactly 2 entries for CONTROL_SEQUENCE_READY for m",
        ),
        (
            'sequence_batching { control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] } ] }',
            "unexpected data type for control CONTROL_SEQUENCE_CORRID for m. Allowed data types are "
            "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING",
        ),
        (
            "sequence_batching { } response_cache { enable: true }",
            "Response Cache does not currently support model m with sequence batching scheduler. "
            "Please disable the response cache.",
        ),
    ],
)
def test_each_rule_with_tritons_wording(extra, message):
    config = with_base(extra)
    with pytest.raises(ConfigError) as exc:
        modelconfig.validate(config, "x/config.pbtxt")
    assert str(exc.value) == f"x/config.pbtxt: {message}"


@pytest.mark.parametrize(
    "extra",
    [
        "",
        "max_batch_size: 0",  # Triton accepts a batcher that never batches
        "dynamic_batching { preferred_batch_size: [2, 8] max_queue_delay_microseconds: 100 }",
        "dynamic_batching { priority_levels: 3 default_priority_level: 3 priority_queue_policy { key: 1 value { } } }",
        "dynamic_batching { preserve_ordering: true priority_levels: 1 default_priority_level: 1 }",
        "dynamic_batching { preserve_ordering: true default_queue_policy { timeout_action: DELAY } }",
        "instance_group [ { kind: KIND_GPU gpus: [ 0 ] count: 3 } ]",
        'sequence_batching { control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [0, 1] } ] }, '
        '{ name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] } ] }',
    ],
)
def test_valid_scheduling_settings_pass(extra):
    modelconfig.validate(with_base(extra), "x")


@pytest.mark.parametrize(
    "extra,message",
    [
        ('input [ { name: "X" dims: [ 4 ] } ]', "model input 'X' must specify 'data_type' for m"),
        ('output [ { name: "OUT" dims: [ 2 ] } ]', "model output 'OUT' must specify 'data_type' for m"),
        ('input [ { data_type: TYPE_FP32 dims: [ 4 ] } ]', "model input must specify 'name' for m"),
        ('input [ { name: "X" data_type: TYPE_FP32 } ]', "model input 'X' must specify 'dims' for m"),
        ('input [ { name: "X" data_type: TYPE_FP32 dims: [ -2 ] } ]',
         "model input 'X' dimension must be integer >= 1, or -1 to indicate a variable-size dimension for m"),
        ('output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 0 ] } ]',
         "model output 'OUT' dimension must be integer >= 1, or -1 to indicate a variable-size dimension for m"),
        ('input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 3 ] } } ]',
         "model input 'X' has different size for dims and reshape for m"),
        ('output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 3 ] } } ]',
         "model output 'OUT' has different size for dims and reshape for m"),
        ('input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 0 ] } } ]',
         "model input 'X' reshape dimensions must be integer >= 1, or -1 to indicate a variable-size dimension for m"),
        ('input [ { name: "X" data_type: TYPE_FP32 dims: [ 2, -1 ] reshape: { shape: [ 2, -1, -1 ] } } ]',
         "model input 'X' has different number of variable-size dimensions for dims and reshape for m"),
        ('input [ { name: "X" data_type: TYPE_FP32 dims: [ 2, -1, 3 ] reshape: { shape: [ 3, -1, 2 ] } } ]',
         "model input 'X' has different size for dims and reshape for m"),
        ('max_batch_size: 0 input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] reshape: { } } ]',
         "model input 'X' cannot have empty reshape for non-batching model as scalar tensors are not supported for m"),
        # inputs come first, as Triton checks them
        ('input [ { name: "X" data_type: TYPE_FP32 dims: [ -3 ] } ] output [ { name: "OUT" dims: [ 2 ] } ]',
         "model input 'X' dimension must be"),
    ],
)
def test_each_input_and_output_rule_with_tritons_wording(extra, message):
    with pytest.raises(ConfigError) as exc:
        modelconfig.validate(with_base(extra), "x/config.pbtxt")
    assert str(exc.value).startswith(f"x/config.pbtxt: {message}")


@pytest.mark.parametrize(
    "extra",
    [
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 2, 2 ] reshape: { shape: [ 4 ] } } ]',
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] reshape: { } } ]',  # a scalar, batched
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 2, 4, -1, 6 ] reshape: { shape: [ 8, -1, 1, 6 ] } } ]',
        'input [ { name: "X" data_type: TYPE_STRING dims: [ -1 ] optional: true } ] '
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1, 2 ] } ]',
    ],
)
def test_inputs_and_outputs_triton_takes_pass(extra):
    modelconfig.validate(with_base(extra), "x")


def test_unnamed_config_is_named_after_its_directory():
    config = modelconfig.parse("max_batch_size: -1", "x")
    with pytest.raises(ConfigError, match="for resnet$"):
        modelconfig.validate(config, "repo/resnet/config.pbtxt")


# --- diff_fields ------------------------------------------------------------------------------------


def test_diff_fields_covers_maps_enums_and_lists():
    a = modelconfig.parse(
        'parameters { key: "a" value { string_value: "1" } } instance_group [ { kind: KIND_CPU } ]', "a"
    )
    b = modelconfig.parse(
        'parameters { key: "a" value { string_value: "2" } } instance_group [ { kind: KIND_GPU } ]', "b"
    )
    assert modelconfig.diff_fields(a, b) == [
        ("instance_group[0].kind", "KIND_CPU", "KIND_GPU"),
        ("parameters[a].string_value", "1", "2"),
    ]


def test_a_number_one_side_leaves_unset_reads_as_the_value_triton_takes():
    a = modelconfig.parse("max_batch_size: 8 dynamic_batching { }", "a")
    b = modelconfig.parse("max_batch_size: 16 dynamic_batching { max_queue_delay_microseconds: 6000 }", "b")
    assert modelconfig.changed_fields(a, b) == ["dynamic_batching.max_queue_delay_microseconds: 0 -> 6000",
                                                "max_batch_size: 8 -> 16"]
    assert modelconfig.changed_fields(b, a)[0] == "dynamic_batching.max_queue_delay_microseconds: 6000 -> 0"


# --- JSON from Triton ----------------------------------------------------------------------------


def test_from_json_takes_int64_as_numbers_or_strings():
    as_numbers = {
        "name": "m",
        "max_batch_size": 8,
        "dynamic_batching": {
            "preferred_batch_size": [4, 8],
            "max_queue_delay_microseconds": 2000,
            "priority_levels": 2,
            "default_priority_level": 1,
            "priority_queue_policy": {"2": {"default_timeout_microseconds": 10, "timeout_action": "REJECT"}},
        },
        "instance_group": [{"name": "m_0", "kind": "KIND_CPU", "count": 2, "gpus": []}],
        "a_field_from_a_newer_server": {"x": 1},
    }
    as_strings = json.loads(
        json.dumps(as_numbers)
        .replace('"max_queue_delay_microseconds": 2000', '"max_queue_delay_microseconds": "2000"')
        .replace('"priority_levels": 2', '"priority_levels": "2"')
        .replace('"default_timeout_microseconds": 10', '"default_timeout_microseconds": "10"')
    )
    a, b = modelconfig.from_json(as_numbers), modelconfig.from_json(json.dumps(as_strings))
    assert a == b
    assert a.dynamic_batching.max_queue_delay_microseconds == 2000
    assert a.dynamic_batching.priority_queue_policy[2].default_timeout_microseconds == 10


@pytest.mark.parametrize("bad", ["{not json", '{"max_batch_size": "eight"}', "[1, 2]"])
def test_from_json_bad_input_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="model config JSON"):
        modelconfig.from_json(bad)


def test_scheduling_table_lists_the_tuned_fields():
    config = with_base(
        "dynamic_batching { preferred_batch_size: [4] max_queue_delay_microseconds: 300 } "
        "instance_group [ { count: 2 kind: KIND_CPU } ]"
    )
    table = dict(modelconfig.scheduling_table(config))
    assert table["max_batch_size"] == "8"
    assert table["scheduler"] == "dynamic_batching"
    assert table["dynamic_batching.max_queue_delay_microseconds"] == "300"
    assert table["dynamic_batching.preferred_batch_size"] == "[4]"
    assert table["instance_group[0]"] == "count=2 kind=KIND_CPU"


# --- agreement with a real Triton ----------------------------------------------------------------
# The rules above are Triton's own wording; here a real tritonserver (2.51, the nvidia-pytriton
# wheel) refuses each broken config with the same message, and accepts what tuner.space.apply makes of
# the config it reports back (auto-completed preferred_batch_size included).

IDENTITY_MODEL = """
import os
import sys

sys.path[:0] = [p for p in os.environ.get("TUNER_MODEL_PYTHONPATH", "").split(os.pathsep) if p]
import triton_python_backend_utils as pb_utils  # noqa: E402 (needs numpy from the path above)


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy())])
            for r in requests
        ]
"""
IDENTITY_CONFIG = """
name: "ident"
backend: "python"
max_batch_size: 32
input [ { name: "INPUT", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "OUTPUT", data_type: TYPE_FP32, dims: [ 4 ] } ]
dynamic_batching { }
instance_group [ { count: 1, kind: KIND_CPU } ]
"""


@pytest.fixture(scope="module")
def triton(tmp_path_factory, triton_install):
    # A server of this module's own, so refused and changed configs never touch the shared one.
    repo = tmp_path_factory.mktemp("repo")
    (repo / "ident" / "1").mkdir(parents=True)
    (repo / "ident" / "1" / "model.py").write_text(IDENTITY_MODEL)
    (repo / "ident" / "config.pbtxt").write_text(IDENTITY_CONFIG)
    with LocalLauncher(repo, models=["ident"], install=triton_install) as server:
        yield server


BROKEN = [
    "max_batch_size: -1",
    "dynamic_batching { preferred_batch_size: [0] }",
    "dynamic_batching { preferred_batch_size: [64] }",
    "dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
    "dynamic_batching { priority_levels: 2 default_priority_level: 1 priority_queue_policy { key: 3 value { } } }",
    "dynamic_batching { preserve_ordering: true priority_levels: 2 default_priority_level: 1 }",
    "dynamic_batching { preserve_ordering: true default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5 } }",
    "sequence_batching { oldest { preferred_batch_size: [64] } }",
    "sequence_batching { direct { minimum_slot_utilization: 1.5 } }",
    "instance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]",
    'sequence_batching { control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START } ] } ] }',
    'sequence_batching { control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] } ] }',
]


@pytest.mark.slow
@pytest.mark.parametrize("extra", BROKEN)
def test_triton_refuses_what_validate_rejects_in_the_same_words(triton, extra):
    config = modelconfig.parse(IDENTITY_CONFIG, "ident")
    text_format.Merge(extra, config)
    with pytest.raises(ConfigError) as ours:
        modelconfig.validate(config, "ident/config.pbtxt")
    message = str(ours.value).removeprefix("ident/config.pbtxt: ")
    with pytest.raises(ServerSetupError) as theirs:
        triton.apply_config("ident", config)
    assert message in str(theirs.value)


@pytest.mark.slow
@pytest.mark.parametrize(
    "params",
    [
        {"max_batch_size": 8},  # below the auto-completed preferred size [32]
        {"max_batch_size": 16, "max_queue_delay_microseconds": 1500, "instance_count": 2},
        {"max_batch_size": 64, "preferred_batch_size": (16, 64)},
        {"max_batch_size": 16, "max_queue_size": 40},
    ],
    ids=["smaller-max", "max-delay-count", "larger-max-preferred", "bounded-queue"],
)
def test_triton_accepts_what_the_space_writes_over_its_own_read_back(triton, params):
    running = triton.model_config("ident")
    assert list(running.dynamic_batching.preferred_batch_size) == [running.max_batch_size]  # auto-complete
    wanted = space.apply(running, params)
    modelconfig.validate(wanted, "wanted")
    got = triton.apply_config("ident", wanted)
    # Triton's own JSON (64-bit fields as numbers) through from_json gives the same config.
    with urllib.request.urlopen(
        f"http://{triton.endpoints.http}/v2/models/ident/config", timeout=10
    ) as answer:
        raw = answer.read()
    assert re.search(rb'"max_queue_delay_microseconds":\d', raw), raw  # a number, not a string
    assert modelconfig.from_json(raw) == got
    changed = {path for path, _, _ in modelconfig.diff_fields(wanted, got)}
    # The only field Triton adds back is the preferred size it auto-completes from max_batch_size.
    assert changed <= {"dynamic_batching.preferred_batch_size"}, changed
    assert {k: v for k, v in space.deployed(got).items() if k in params and k != "preferred_batch_size"} == \
        {k: v for k, v in params.items() if k != "preferred_batch_size"}
    triton.apply_config("ident", modelconfig.parse(IDENTITY_CONFIG, "ident"))  # back to the base


def test_a_comment_stays_above_its_parameter_when_the_printer_sorts_them_by_key():
    # protobuf's printer writes a map's entries sorted by key: each comment follows its key, not its place
    text = '''name: "m"
# the zebra's own
parameters { key: "zebra" value { string_value: "1" } }
# alpha, said over
# two lines
parameters {
  key: "alpha"  # and at the end of its key
  value { string_value: "2" }
}
parameters { key: "mid" value { string_value: "3" } }
'''
    # the whole config printed again (where the file's text cannot be edited in place: to_text's fallback)
    out = modelconfig._reprinted(modelconfig.to_text(modelconfig.parse(text)), text)
    lines = out.splitlines()
    assert lines.index('  key: "alpha"') < lines.index('  key: "mid"') < lines.index('  key: "zebra"')
    assert lines[lines.index('  key: "zebra"') - 2] == "# the zebra's own"
    alpha = lines.index('  key: "alpha"')
    assert lines[alpha - 4:alpha - 1] == ["# alpha, said over", "# two lines", "# and at the end of its key"]
    assert lines[lines.index('  key: "mid"') - 2] == "}"  # no comment of its own


def test_the_name_is_checked_against_the_directory_a_config_pbtxt_is_in(tmp_path, monkeypatch):
    (tmp_path / "bert").mkdir()
    config = modelconfig.parse('name: "bert"\nmax_batch_size: 8\n')
    modelconfig.check_name(config, tmp_path / "bert" / "config.pbtxt")
    monkeypatch.chdir(tmp_path / "bert")
    modelconfig.check_name(config, "config.pbtxt")  # `tuner config check .` in the model's directory
    modelconfig.check_name(config, tmp_path / "elsewhere.pbtxt")  # no model directory's config: nothing to match
    with pytest.raises(ConfigError, match=r"^config.pbtxt: name 'gpt' is not its directory's \('bert'\)"):
        modelconfig.check_name(modelconfig.parse('name: "gpt"\n'), "config.pbtxt")


HAND_WRITTEN = """# my model, tuned by hand
name: "m"
backend: "python"
max_batch_size: 64   # from training
input [ { name: "X", data_type: TYPE_INT32, dims: [ -1 ] } ]
dynamic_batching {
  # none yet
  max_queue_delay_microseconds: 100
}
parameters { key: "zebra" value { string_value: "1" } }
parameters { key: "alpha" value { string_value: "2" } }
instance_group [ { count: 1, kind: KIND_CPU } ]
"""


def test_a_changed_config_is_the_users_text_with_only_the_changed_fields_rewritten():
    config = modelconfig.parse(HAND_WRITTEN)
    config.max_batch_size = 16
    config.dynamic_batching.max_queue_delay_microseconds = 2000
    out = modelconfig.to_text(config, comments_from=HAND_WRITTEN)
    assert modelconfig.parse(out) == config
    # every line as the user wrote it, in the user's order, but the two changed values (a block's field
    # edited inside the block: its comment stays where it was; a line's own comment stays on it)
    assert out.splitlines() == [line.replace("max_batch_size: 64", "max_batch_size: 16")
                                .replace("max_queue_delay_microseconds: 100", "max_queue_delay_microseconds: 2000")
                                for line in HAND_WRITTEN.splitlines()]
    assert modelconfig.to_text(modelconfig.parse(HAND_WRITTEN), comments_from=HAND_WRITTEN) == HAND_WRITTEN


def test_a_changed_block_keeps_its_other_fields_as_written_explicit_defaults_included():
    # preserve_ordering: false and default_timeout_microseconds: 0 are protobuf's defaults, which its
    # printer leaves out: a block rewritten whole lost them, and re-spread the one-line blocks
    text = """name: "m"
dynamic_batching {
  max_queue_delay_microseconds: 0
  preserve_ordering: false
  priority_levels: 2
  default_queue_policy { timeout_action: DELAY, default_timeout_microseconds: 0 }
  priority_queue_policy { key: 1 value: { max_queue_size: 3 } }
}
"""
    config = modelconfig.parse(text)
    config.dynamic_batching.max_queue_delay_microseconds = 300
    config.dynamic_batching.preferred_batch_size.extend([2, 4])  # a field the block did not have
    out = modelconfig.to_text(config, comments_from=text)
    assert modelconfig.parse(out) == config
    kept = [line for line in text.splitlines() if "max_queue_delay" not in line and line != "}"]
    assert [line for line in out.splitlines() if line in kept] == kept
    assert "  max_queue_delay_microseconds: 300" in out.splitlines()
    assert out.endswith("  preferred_batch_size: 2\n  preferred_batch_size: 4\n}\n")


def test_a_field_removed_takes_its_line_and_a_field_added_goes_at_the_end():
    config = modelconfig.parse(HAND_WRITTEN)
    config.ClearField("instance_group")
    config.response_cache.enable = True
    out = modelconfig.to_text(config, comments_from=HAND_WRITTEN)
    assert modelconfig.parse(out) == config
    assert "instance_group" not in out and out.startswith(HAND_WRITTEN.split("instance_group")[0])
    assert out.endswith("response_cache {\n  enable: true\n}\n")


@pytest.mark.parametrize("path", FILES or [MISSING], ids=ids(FILES or [MISSING]))
def test_every_config_of_the_corpus_is_edited_in_place(path):
    # Triton's own configs: the tuned fields change and the rest of each file stays as written
    original = corpus_file(path).read_text()
    config = modelconfig.parse(original, str(path))
    if config.max_batch_size > 0:
        config.max_batch_size += 1
        config.dynamic_batching.max_queue_delay_microseconds += 100
    else:
        config.instance_group.add(count=2)
    out = modelconfig._edited(original, config)
    assert out is not None and modelconfig.parse(out, "edited") == config
    assert comments(out) == comments(original)
