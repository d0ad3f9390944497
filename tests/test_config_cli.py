"""`tuner config check|set|show` over the real corpus of Triton config.pbtxt files.

Every file either passes (exit 0) or fails with exactly one line (exit 2), never a traceback; the
corpus cases with a scheduling error are refused with Triton's own expected message; `set` changes
only the fields it names and never touches its input.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from triton_corpus import FILES, IO_MESSAGE, MISSING, SCHEDULING_MESSAGE, corpus_file, expected_message, ids

from tuner import modelconfig
from tuner.cli import main

ALL = FILES or [MISSING]
ROOT_CONFIG = Path(__file__).resolve().parents[1] / "model_repository_templates" / "encoder_sim" / "config.pbtxt"
SCHEDULING_CASES = [p for p in FILES if SCHEDULING_MESSAGE.search(expected_message(p) or "")] or [MISSING]
# the cases validate refuses: broken scheduling fields, then broken inputs and outputs
REFUSED_CASES = SCHEDULING_CASES + [p for p in FILES if IO_MESSAGE.search(expected_message(p) or "")]


def _named_elsewhere(path: Path) -> bool:
    """Whether a config.pbtxt names a model other than its directory (Triton's QA copies such a file into
    a directory of its name before loading it)."""
    match = re.search(r'^name:\s*"([^"]*)"', path.read_text(errors="replace"), re.M)
    return bool(match and match[1] and match[1] != path.parent.name)


NAME_CASES = [p for p in FILES if _named_elsewhere(p)]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- check ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_check_each_file_is_ok_or_one_line(capsys, path):
    path = str(corpus_file(path))
    code, out, err = run(capsys, "config", "check", path)
    assert code in (0, 2)
    if code == 0:
        assert (out, err) == (f"{path}: ok\n", "")
    else:
        assert out == ""
        assert err.count("\n") == 1 and err.startswith(f"{path}:"), err
        assert "Traceback" not in err


@pytest.mark.parametrize("path", REFUSED_CASES, ids=ids(REFUSED_CASES))
def test_check_refuses_scheduling_and_io_cases_with_tritons_message(capsys, path):
    code, _, err = run(capsys, "config", "check", str(corpus_file(path)))
    assert code == 2
    assert re.search(expected_message(path), err), (expected_message(path), err)


REVIEWED = 'name: "m"\nbackend: "python"\nmax_batch_size: 8\ndynamic_batching { }\n'


@pytest.mark.parametrize("tensors, says", [
    ('input [ { name: "X", dims: [ 4 ] } ] output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 2 ] } ]',
     "model input 'X' must specify 'data_type' for m"),
    ('input [ { name: "X", data_type: TYPE_FP32, dims: [ 4 ], reshape: { shape: [ 3 ] } } ]',
     "model input 'X' has different size for dims and reshape for m"),
    ('input [ { name: "X", data_type: TYPE_FP32, dims: [ -2 ] } ]',
     "model input 'X' dimension must be integer >= 1, or -1 to indicate a variable-size dimension for m"),
    ('output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 4 ], reshape: { shape: [ 3 ] } } ]',
     "model output 'OUT' has different size for dims and reshape for m"),
])
def test_check_refuses_inputs_and_outputs_triton_refuses_in_one_line(capsys, tmp_path, tensors, says):
    model = tmp_path / "m"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(REVIEWED + tensors + "\n")
    assert run(capsys, "config", "check", str(model)) == (2, "", f"{model / 'config.pbtxt'}: {says}\n")


def test_check_all_files_in_one_process_without_a_traceback():
    corpus_file(FILES[0] if FILES else MISSING)
    done = subprocess.run(
        [sys.executable, "-m", "tuner", "config", "check", *map(str, FILES)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in done.stderr
    bad = done.stderr.splitlines()
    assert done.returncode == 2
    invalid = sorted(map(str, set(REFUSED_CASES) | set(NAME_CASES)))  # a file named elsewhere: as tune says
    assert NAME_CASES and sorted(line.split(":", 1)[0] for line in bad) == invalid
    assert done.stdout == f"{len(FILES)} configs checked, {len(invalid)} invalid\n"


def test_check_unreadable_inputs_are_one_line_each(tmp_path):
    (tmp_path / "binary").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "nul").write_bytes(b"\x00" * 64)
    (tmp_path / "syntax").write_text('name: "m"\nmax_batch_size: 8\ndynamic_batching {\n')
    (tmp_path / "empty").write_text("")
    paths = [
        tmp_path / "missing",
        tmp_path,
        tmp_path / "binary",
        tmp_path / "nul",
        tmp_path / "syntax",
        tmp_path / "empty",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "tuner", "config", "check", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert [line.split(":", 1)[0] for line in lines] == list(map(str, paths[:5]))
    assert lines[0].endswith("no such file") and "directory" in lines[1] and "not a text file" in lines[2]
    assert re.match(re.escape(f"{tmp_path / 'syntax'}") + r":3:\d+: Expected \"}\"", lines[4]), lines[4]
    assert done.stdout == "6 configs checked, 5 invalid\n"


def test_check_names_each_path_the_os_refuses_and_goes_on(tmp_path, capsys):
    good = ROOT_CONFIG
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "f").write_text("x")
    bad = [tmp_path / "loop", tmp_path / ("c" * 300), tmp_path / "f" / "config.pbtxt"]
    code, out, err = run(capsys, "config", "check", str(good), *map(str, bad))
    assert code == 2 and out == "4 configs checked, 3 invalid\n"
    reasons = ["Too many levels of symbolic links", "File name too long", "Not a directory"]
    assert err.splitlines() == [f"{path}: cannot read ({why})" for path, why in zip(bad, reasons, strict=True)]


@pytest.mark.parametrize("argv", [["set", "{loop}", "--set", "max_batch_size=8"], ["show", "{loop}"],
                                  ["set", "{good}", "--set", "max_batch_size=8", "-o", "{loop}"]])
def test_set_and_show_refuse_a_path_the_os_refuses_in_one_line(tmp_path, capsys, argv):
    (tmp_path / "loop").symlink_to("loop")
    argv = [a.format(loop=tmp_path / "loop", good=ROOT_CONFIG) for a in argv]
    code, out, err = run(capsys, "config", *argv)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"{tmp_path / 'loop'}: cannot " in err and "Too many levels of symbolic links" in err, err


def test_check_reads_a_vllm_models_engine_arguments_beside_its_config_or_alone(capsys, tmp_path):
    model = tmp_path / "llm_vllm"
    shutil.copytree(ROOT_CONFIG.parents[1] / "llm_vllm", model)
    engine = model / "1" / "model.json"
    assert main(["config", "check", str(model / "config.pbtxt"), str(engine)]) == 0
    args = json.loads(engine.read_text())
    engine.write_text(json.dumps({**args, "max_num_seqz": 4}))  # the config.pbtxt is fine: the model.json is not
    for path in (model / "config.pbtxt", engine):
        assert main(["config", "check", str(path)]) == 2
        err = capsys.readouterr().err
        assert err == f"{engine}: max_num_seqz: not an engine argument vLLM takes (did you mean max_num_seqs?)\n"


def test_config_without_subcommand_names_them_in_one_line_and_exit_2(capsys):
    # as every command group (tests/test_cli_usage.py)
    with pytest.raises(SystemExit) as exc:
        main(["config"])
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and out == ""
    assert err == "tuner: error: tuner config needs a subcommand: check, set, show (see `tuner config --help`)\n"


# --- set -----------------------------------------------------------------------------------------


def expected_changes(config, max_batch_size: int, delay: int | None, count: int | None) -> dict[str, object]:
    """What `set` must change and to what, field by field, by the rules apply_params documents."""
    changes: dict[str, object] = {"max_batch_size": max_batch_size}
    if delay is not None:
        changes["dynamic_batching.max_queue_delay_microseconds"] = delay
    if config.HasField("dynamic_batching"):
        sizes = list(config.dynamic_batching.preferred_batch_size)
        changes["dynamic_batching.preferred_batch_size"] = [s for s in sizes if s <= max_batch_size] or None
    if config.sequence_batching.HasField("oldest"):
        sizes = list(config.sequence_batching.oldest.preferred_batch_size)
        changes["sequence_batching.oldest.preferred_batch_size"] = [
            s for s in sizes if s <= max_batch_size
        ] or None
    if count is not None:
        for index in range(max(1, len(config.instance_group))):
            changes[f"instance_group[{index}].count"] = count
    return changes


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_set_changes_only_the_named_fields(capsys, tmp_path, path):
    path = corpus_file(path)
    original = modelconfig.load(path)
    before = sha256(path)
    scheduler = original.WhichOneof("scheduling_choice")
    delay = 700 if scheduler in (None, "dynamic_batching") else None
    count = None if scheduler == "ensemble_scheduling" else 3
    sets = ["--set", "max_batch_size=2"]
    sets += ["--set", f"max_queue_delay_microseconds={delay}"] if delay is not None else []
    sets += ["--set", f"instance_group.count={count}"] if count is not None else []
    out = tmp_path / "out.pbtxt"

    code, stdout, err = run(capsys, "config", "set", str(path), *sets, "-o", str(out))

    assert sha256(path) == before
    if path in REFUSED_CASES:  # already broken: refused, in one line
        assert code == 2 and not out.exists()
        assert err.count("\n") == 1 and err.startswith(f"tuner: error: {path}: ")
        return
    if count is not None and len(original.instance_group) > 1:  # one count would undo the groups' split
        assert code == 2 and not out.exists()
        assert err.count("\n") == 1 and err.startswith(f"tuner: error: {path}: --set instance_count: the config "
                                                     f"has {len(original.instance_group)} instance groups"), err
        return
    assert (code, stdout) == (0, ""), err
    new = modelconfig.load(out)
    modelconfig.validate(new, str(out))
    expected = expected_changes(original, 2, delay, count)
    for field, old, value in modelconfig.diff_fields(original, new):
        assert field in expected, f"{field} changed: {old!r} -> {value!r}"
        assert value == expected[field], field


def test_set_prints_to_stdout_and_needs_in_place_to_overwrite(capsys, tmp_path):
    source = next(
        (p for p in FILES if p not in REFUSED_CASES and "dynamic_batching" in p.read_text()), None
    )
    source = corpus_file(source or MISSING)
    path = tmp_path / "config.pbtxt"
    shutil.copy(source, path)
    before = sha256(path)

    code, out, _ = run(capsys, "config", "set", str(path), "--set", "max_queue_delay_microseconds=1234")
    assert code == 0
    if source.read_text().startswith("#"):  # the opening comment block is kept
        assert out.splitlines()[0] == source.read_text().splitlines()[0]
    assert modelconfig.parse(out, "stdout").dynamic_batching.max_queue_delay_microseconds == 1234

    code, _, err = run(capsys, "config", "set", str(path), "--set", "max_batch_size=4", "-o", str(path))
    assert code == 2 and "--in-place" in err and err.count("\n") == 1
    assert sha256(path) == before

    code, _, err = run(capsys, "config", "set", str(path), "--set", "max_batch_size=4", "--in-place")
    assert code == 0 and f"wrote {path}" in err
    assert modelconfig.load(path).max_batch_size == 4


@pytest.mark.parametrize(
    "argv,says",
    [
        (["--set", "no_such_key=1"], "unknown key 'no_such_key'"),
        (["--set", "max_batch_size=-3"], "max_batch_size=-3"),
        (
            ["--set", "max_batch_size=4", "--set", "preferred_batch_size=8"],
            "preferred size must be <= max batch size",
        ),
        (["--set", "max_batch_size=4", "-o", "/no/such/dir/config.pbtxt"], "does not exist"),
    ],
)
def test_set_bad_input_is_one_line(capsys, tmp_path, argv, says):
    path = tmp_path / "config.pbtxt"
    path.write_text('name: "m"\nmax_batch_size: 8\ndynamic_batching { }\n')
    code, out, err = run(capsys, "config", "set", str(path), *argv)
    assert code == 2 and out == ""
    assert err.startswith("tuner: error: ") and err.count("\n") == 1 and says in err, err


# --- show ----------------------------------------------------------------------------------------


def test_show_prints_an_aligned_table(capsys, tmp_path):
    path = tmp_path / "config.pbtxt"
    path.write_text(
        'name: "m"\nmax_batch_size: 16\ndynamic_batching { max_queue_delay_microseconds: 300 '
        "preferred_batch_size: [8, 16] }\ninstance_group [ { count: 2 kind: KIND_CPU } ]\n"
    )
    code, out, _ = run(capsys, "config", "show", str(path))
    assert code == 0
    lines = out.splitlines()
    rows = {line.split()[0]: line.split(None, 1)[1] for line in lines}
    assert rows["max_batch_size"] == "16"
    assert rows["dynamic_batching.max_queue_delay_microseconds"] == "300"
    assert rows["dynamic_batching.preferred_batch_size"] == "[8, 16]"
    assert rows["instance_group[0]"] == "count=2 kind=KIND_CPU"
    value_columns = {len(line) - len(rows[line.split()[0]]) for line in lines}
    assert len(value_columns) == 1, out  # aligned


def test_show_of_an_ensemble_says_it_has_no_instances_of_its_own(capsys, tmp_path):
    path = tmp_path / "config.pbtxt"
    path.write_text('name: "ens"\nplatform: "ensemble"\nmax_batch_size: 8\nensemble_scheduling { step [ { '
                    'model_name: "m" model_version: -1 input_map { key: "IN" value: "X" } '
                    'output_map { key: "OUT" value: "Y" } } ] }\n')
    code, out, _ = run(capsys, "config", "show", str(path))
    rows = {line.split()[0]: line.split(None, 1)[1] for line in out.splitlines()}
    assert code == 0 and rows["instance_group"] == "none (an ensemble runs its steps' models' instances)", out


def test_show_of_an_unnamed_config_gives_the_name_triton_loads_it_under(capsys, tmp_path, monkeypatch):
    model = tmp_path / "resnet"
    model.mkdir()
    (model / "config.pbtxt").write_text('backend: "python"\nmax_batch_size: 8\n')
    name = "resnet (its directory's: config.pbtxt sets no name)"
    for path in (model, model / "config.pbtxt"):
        code, out, _ = run(capsys, "config", "show", str(path))
        assert code == 0 and out.splitlines()[0].split(None, 1) == ["name", name], out
    monkeypatch.chdir(model)  # ./config.pbtxt: its directory is still the model's
    assert run(capsys, "config", "show", "config.pbtxt")[1].splitlines()[0].split(None, 1) == ["name", name]
    other = tmp_path / "cfg.pbtxt"  # not a model directory's config.pbtxt: no name to give
    other.write_text('backend: "python"\n')
    assert run(capsys, "config", "show", str(other))[1].splitlines()[0].split() == ["name", "-"]


def test_show_missing_file_is_one_line(capsys, tmp_path):
    code, out, err = run(capsys, "config", "show", str(tmp_path / "nope.pbtxt"))
    assert code == 2 and out == "" and err == f"tuner: error: {tmp_path / 'nope.pbtxt'}: no such file\n"


# --- what set writes over, and what it says it changed ----------------------------------------------


def test_set_replaces_an_out_only_when_tuner_wrote_it_or_it_holds_the_same_text(capsys, tmp_path):
    out = tmp_path / "out.pbtxt"
    out.write_text("# my own config\nname: \"mine\"\n")
    argv = ["config", "set", str(ROOT_CONFIG), "--set", "max_batch_size=8", "-o", str(out)]
    code, stdout, err = run(capsys, *argv)
    assert (code, stdout) == (2, "") and err == (f"tuner: error: {out}: exists and tuner did not write it: give "
                                                 "--force to replace it, or write to another file\n")
    assert out.read_text() == "# my own config\nname: \"mine\"\n"
    code, _, err = run(capsys, *argv, "--force")
    assert code == 0 and modelconfig.load(out).max_batch_size == 8
    written = out.read_text()
    code, _, err = run(capsys, *argv)  # the same text again: nothing is lost
    assert code == 0 and out.read_text() == written
    out.write_text(f"{modelconfig.EXPORT_HEADER}0.1 on 2024-01-01 (study 'x')\n\nname: \"encoder_sim\"\n")  # an export
    code, _, err = run(capsys, *argv[:-2], "-o", str(out))
    assert code == 0 and modelconfig.load(out).max_batch_size == 8


def test_a_file_set_wrote_says_so_and_the_next_set_replaces_it_without_force(capsys, tmp_path):
    out = tmp_path / "out.pbtxt"
    assert run(capsys, "config", "set", str(ROOT_CONFIG), "--set", "max_batch_size=8", "-o", str(out))[0] == 0
    first = out.read_text()
    assert first.startswith(f"{modelconfig.SET_HEADER}from {ROOT_CONFIG} (--set max_batch_size=8)\n")
    # another value into the same file: tuner wrote it, nothing of the user's is lost
    code, _, err = run(capsys, "config", "set", str(ROOT_CONFIG), "--set", "max_batch_size=16", "-o", str(out))
    assert code == 0, err
    assert modelconfig.load(out).max_batch_size == 16 and out.read_text().count(modelconfig.SET_HEADER) == 1
    # a set of a set: one header, the latest
    again = tmp_path / "again.pbtxt"
    assert run(capsys, "config", "set", str(out), "--set", "max_batch_size=4", "-o", str(again))[0] == 0
    text = again.read_text()
    assert text.startswith(f"{modelconfig.SET_HEADER}from {out} (--set max_batch_size=4)\n")
    assert text.count(modelconfig.SET_HEADER) == 1 and modelconfig.load(again).max_batch_size == 4
    # --in-place changes only what was asked: no header in the user's own file
    assert run(capsys, "config", "set", str(again), "--set", "max_batch_size=2", "--in-place")[0] == 0
    assert again.read_text() == text.replace("max_batch_size: 4", "max_batch_size: 2")


def test_set_says_a_field_set_to_zero_is_zero(capsys, tmp_path):
    out = tmp_path / "out.pbtxt"
    code, _, err = run(capsys, "config", "set", str(ROOT_CONFIG), "--set", "max_batch_size=0", "-o", str(out))
    assert code == 0 and modelconfig.load(out).max_batch_size == 0
    assert err == f"wrote {out} (max_batch_size: 64 -> 0)\n"  # not "unset (0)": the user wrote 0


@pytest.mark.parametrize("key", ["instance_count", "instance_group.count"])
def test_set_refuses_one_instance_count_for_several_instance_groups(capsys, tmp_path, key):
    path = tmp_path / "config.pbtxt"
    path.write_text('name: "m"\nmax_batch_size: 8\ndynamic_batching { }\n'
                    "instance_group [ { count: 1 kind: KIND_CPU }, { count: 3 kind: KIND_CPU } ]\n")
    before = sha256(path)
    code, out, err = run(capsys, "config", "set", str(path), "--set", f"{key}=2", "-o", str(tmp_path / "new.pbtxt"))
    assert (code, out) == (2, "") and err == (
        f"tuner: error: {path}: --set instance_count: the config has 2 instance groups (counts 1, 3), and "
        "instance_count would set each to the same count: change each group's count in the file instead\n")
    assert sha256(path) == before and not (tmp_path / "new.pbtxt").exists()
    path.write_text('name: "m"\nmax_batch_size: 8\ndynamic_batching { }\ninstance_group [ { count: 1 kind: KIND_CPU } ]\n')
    code, out, _ = run(capsys, "config", "set", str(path), "--set", f"{key}=2")  # one group: its count
    assert code == 0 and [g.count for g in modelconfig.parse(out).instance_group] == [2]


# --- a model directory ------------------------------------------------------------------------------


def test_check_and_show_take_a_model_directory_as_tune_check_reads_it(capsys, tmp_path):
    model = tmp_path / "encoder_sim"
    shutil.copytree(ROOT_CONFIG.parent, model)
    config = model / "config.pbtxt"
    assert run(capsys, "config", "check", str(model)) == (0, f"{model}: ok\n", "")
    assert run(capsys, "config", "show", str(model)) == run(capsys, "config", "show", str(config))

    config.write_text(config.read_text().replace('name: "encoder_sim"', 'name: "other"'))
    named = (f"{config}: name 'other' is not its directory's ('encoder_sim'): Triton loads a model only from a "
             "directory of its name\n")
    assert run(capsys, "config", "check", str(model)) == (2, "", named)
    assert run(capsys, "config", "check", str(config)) == (2, "", named)  # the file alone: its directory too
    other = tmp_path / "cfg.pbtxt"  # not a model directory's config.pbtxt: no directory to match
    shutil.copy(config, other)
    assert run(capsys, "config", "check", str(other)) == (0, f"{other}: ok\n", "")

    config.write_text(config.read_text().replace('name: "other"', 'name: "encoder_sim"'))
    shutil.rmtree(model / "1")
    code, out, err = run(capsys, "config", "check", str(model))
    assert (code, out) == (2, "") and err.startswith(f"{model}: no version directory")

    code, out, err = run(capsys, "config", "check", str(tmp_path))  # a repository, not a model directory
    assert (code, out, err) == (2, "", f"{tmp_path}: a directory without a config.pbtxt (a model directory holds "
                                       "one)\n")
    code, out, err = run(capsys, "config", "show", str(tmp_path))
    assert (code, out) == (2, "") and err == (f"tuner: error: {tmp_path}: a directory without a config.pbtxt (a "
                                              "model directory holds one)\n")
