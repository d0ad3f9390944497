"""`tuner config check|set|show`: config.pbtxt through Triton's schema and scheduling rules."""

from __future__ import annotations

import argparse
import functools
import os
import stat
import sys
from pathlib import Path

from tuner import modelconfig, space
from tuner.cli._args import add_assignments, add_command, add_flag, add_group, add_input, add_output_file
from tuner.errors import ConfigError, InputError
from tuner.files import check_replaceable, write_atomic
from tuner.paths import readable_file, same_file


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `tuner config check|set|show` to `subparsers`."""
    sub = add_group(
        subparsers, "config", help="check, change or show a model's config.pbtxt",
        description="Read a Triton config.pbtxt with Triton's own schema, check the scheduling and tensor rules "
        "Triton enforces, change the tuned fields, or show them.",
    )

    check = add_command(
        sub, "check", run=_check, help="check config.pbtxt files (exit 2 if any is invalid)",
        description="Parse each config.pbtxt and check Triton's rules on its scheduling fields and on its inputs' "
        "and outputs' data types, dims and reshapes, and that a "
        "config.pbtxt names the model its directory does; a model directory has its config.pbtxt checked, and "
        "the directory as Triton loads it (a version directory), as `tuner tune --check` does; a model "
        "vLLM serves has the model.json beside it checked as vLLM's backend reads it, and a model.json "
        "named itself is checked alone. Prints one line per invalid file (PATH:LINE:COL: message for a syntax error, "
        "PATH: message for a broken rule) and exits 2 if any is invalid.",
    )
    # each path is checked as it comes, so that every bad one has its line
    add_input(check, "paths", nargs="+", metavar="PATH",
              help="config.pbtxt files or model directories (or a vLLM model's model.json)", each=True)

    set_ = add_command(
        sub, "set", run=_set, help="change the tuned fields of a config.pbtxt",
        description="Change only the named scheduling fields and print the new config (or write it "
        f"to -o OUT). Keys: {', '.join(space.NAMES)} (or their config.pbtxt paths, e.g. "
        "instance_group.count); preferred_batch_size takes a comma list, e.g. 4,8. Preferred batch sizes "
        "above a new max_batch_size are dropped. instance_count sets the count of the one instance group, and "
        "is refused for a config with several (their split is the user's). The input file is never changed "
        "without --in-place. OUT begins with a comment line saying what wrote it; an existing OUT is replaced "
        "only when tuner wrote it (`tuner export` or `config set -o`) or it holds the same text, else with --force.",
    )
    add_input(set_, "path", metavar="PATH", what="a config.pbtxt", help="the config.pbtxt to start from")
    add_assignments(set_, "a field to change; repeat for several", required=True)
    add_output_file(set_, metavar="OUT", help="write the new config here instead of stdout")
    add_flag(set_, "--in-place", "overwrite PATH with the new config")
    add_flag(set_, "--force", "replace an OUT that tuner did not write (your own config)")

    show = add_command(
        sub, "show", run=_show, help="show the scheduling fields of a config.pbtxt",
        description="Print the scheduling fields of a config.pbtxt (max_batch_size, the batcher and "
        "its settings, instance groups) as an aligned table; a model directory: those of its config.pbtxt. "
        "The name is the one Triton loads the model under: its directory's where config.pbtxt sets none.",
    )
    add_input(show, "path", metavar="PATH", help="a config.pbtxt or a model directory", each=True)  # _config_of checks it


def _check(args: argparse.Namespace) -> int:
    # Invalid files: one line each on stderr. Valid ones are quiet but for a count (or "PATH: ok"
    # for a single file), so a single bad file is exactly one line of output.
    invalid = 0
    from tuner.files import read_json_object
    from tuner.llm import engineargs

    for path in args.paths:
        try:
            if Path(path).suffix == ".json":  # a vLLM-served model's engine arguments, as vLLM's backend reads them
                engineargs.check(read_json_object(Path(path), label=path, error=ConfigError), source=path)
                continue
            file = _config_of(path)
            config = modelconfig.load(file)
            modelconfig.validate(config, str(file))
            if file != Path(path):  # a model directory, as Triton loads it and `tuner tune --check` checks it
                modelconfig.check_model_dir(path, config)
            else:
                modelconfig.check_name(config, file)
            model_dir = file.parent
            if (engineargs.is_vllm_model(model_dir, config)  # and the model.json beside it, where there is one
                    and (engineargs.version_dir(model_dir) / engineargs.ENGINE_FILE).is_file()):
                engineargs.read(model_dir)
        except ConfigError as exc:
            invalid += 1
            print(exc, file=sys.stderr)
    total = len(args.paths)
    if total > 1:
        print(f"{total} configs checked, {invalid} invalid")
    elif not invalid:
        print(f"{args.paths[0]}: ok")
    return 2 if invalid else 0


def _config_of(path: str) -> Path:
    """The config.pbtxt `path` names: itself, or a model directory's; ConfigError in one line when there
    is none to read."""
    try:
        is_dir = stat.S_ISDIR(os.stat(path).st_mode)
    except OSError:  # missing, a name too long, a loop of links: readable_file says which
        is_dir = False
    if is_dir:
        file = Path(path) / "config.pbtxt"
        if not file.exists():
            raise ConfigError(f"{path}: a directory without a config.pbtxt (a model directory holds one)")
        return readable_file(file, what="a config.pbtxt", error=ConfigError)
    return readable_file(path, what="a config.pbtxt", error=ConfigError)


def _set(args: argparse.Namespace) -> int:
    path = Path(args.path)
    params = space.parse_assignments(args.assignments)
    config = modelconfig.load(path)
    modelconfig.validate(config, str(path))
    _check_instance_groups(config, path, params)
    try:
        new = space.apply(config, params)
        modelconfig.validate(new, str(path))
    except ConfigError as exc:
        message = str(exc)
        if not message.startswith(f"{path}: "):
            message = f"{path}: {message}"
        raise ConfigError(f"{message} (after --set {' '.join(args.assignments)})") from None
    text = modelconfig.to_text(new, comments_from=path.read_text())  # the file's comments go on

    target = _target(path, args.output, args.in_place)
    if target is None:
        sys.stdout.write(text)
        return 0
    if not args.in_place:  # a new file says tuner wrote it, so that the next `-o` there may replace it
        text = _with_set_header(text, path, args.assignments)
        check_replaceable(target, force=args.force, ours=functools.partial(modelconfig.written_by_tuner, text=text))
    _write(target, text)
    changed = ", ".join(modelconfig.changed_fields(config, new))
    print(f"wrote {target} ({changed or 'no change'})", file=sys.stderr)
    return 0


def _with_set_header(text: str, source: Path, assignments: list[str]) -> str:
    """`text` under one SET_HEADER line naming `source` and the assignments (a source that `config set`
    wrote itself loses its own header line: the new one says what this file is)."""
    if text.startswith(modelconfig.SET_HEADER):
        text = text.split("\n", 1)[1] if "\n" in text else ""
    return f"{modelconfig.SET_HEADER}from {source} (--set {' '.join(assignments)})\n{text}"


def _check_instance_groups(config: modelconfig.ModelConfig, path: Path, params: dict) -> None:
    """Refuse instance_count on a config of several instance groups (the rule tune's space follows)."""
    groups = space.several_instance_groups(config)
    if space.INSTANCES in params and groups:
        raise ConfigError(f"{path}: --set {space.INSTANCES}: {groups}: change each group's count in the "
                          f"file instead")


def _target(path: Path, output: str | None, in_place: bool) -> Path | None:
    if in_place:
        if output is not None and not same_file(Path(output), path):
            raise InputError(f"--in-place writes {path}; it cannot be combined with -o {output}")
        return path
    if output is None:
        return None
    if same_file(Path(output), path):
        raise InputError(f"refusing to write over {path}: pass --in-place to change it")
    return Path(output)


def _write(target: Path, text: str) -> None:
    if not target.parent.is_dir():
        raise InputError(f"{target}: directory {target.parent} does not exist")
    write_atomic(target, text)  # a failure never leaves half a config behind


def _show(args: argparse.Namespace) -> int:
    file = _config_of(args.path)
    rows = modelconfig.scheduling_table(modelconfig.load(file), path=file)
    width = max(len(field) for field, _ in rows)
    for field, value in rows:
        print(f"{field:<{width}}  {value}")
    return 0
