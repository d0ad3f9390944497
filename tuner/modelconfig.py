"""config.pbtxt through Triton's own protobuf schema (of tuner's modules it imports only errors and files).

Parsing and printing use `tritonclient.grpc.model_config_pb2.ModelConfig` with
`google.protobuf.text_format`; the JSON form is what Triton's repository load API takes as a
config override. The file is read through `tuner.files.read_text`, as the study, the profile and the
traffic are; nothing here writes it. Which fields a trial tunes, and how they are changed, is
`tuner.space`'s business.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from pathlib import Path

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from tuner.errors import ConfigError
from tuner.files import read_text

ModelConfig = model_config_pb2.ModelConfig


def parse(text: str, source: str = "<config>") -> ModelConfig:
    """Parse config.pbtxt text; a syntax error becomes `SOURCE:LINE:COL: message`."""
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        line, col = exc.GetLine(), exc.GetColumn()
        message = str(exc)
        # ParseError's str starts with "LINE:COL : "; keep only the message after it.
        if line is not None and message.startswith(f"{line}:{col} : "):
            message = message[len(f"{line}:{col} : ") :]
        where = f"{source}:{line}:{col}" if line is not None else source
        message = " ".join(message.split())  # always one line
        raise ConfigError(f"{where}: {message}") from None
    return config


def load(path: str | Path) -> ModelConfig:
    """The config.pbtxt at `path`, parsed; ConfigError when it cannot be read (tuner.files.read_text)
    or parsed."""
    return parse(read_text(path, what="a config.pbtxt", error=ConfigError), str(path))


def check_model_dir(model_dir: str | Path, config: ModelConfig | None = None) -> None:
    """ConfigError, in one line, for what Triton refuses to load a model for and says only in its log:
    a config.pbtxt `name` other than its directory's, and no version directory (a numbered
    subdirectory holding the model's files). `config`: the directory's config.pbtxt, parsed."""
    model_dir = Path(model_dir)
    path = model_dir / "config.pbtxt"
    if config is None and path.is_file():
        config = load(path)
    if config is not None:
        check_name(config, path)
    try:
        versions = [p for p in model_dir.iterdir() if p.name.isdigit() and p.is_dir()]
    except OSError:
        return  # the reading of config.pbtxt or the repository's own check says why
    if not versions:
        raise ConfigError(f"{model_dir}: no version directory (a numbered subdirectory such as 1/ holding the "
                          "model's files): Triton has no version of the model to load")


def check_name(config: ModelConfig, path: str | Path) -> None:
    """ConfigError, in one line, when the config.pbtxt at `path` names a model other than its directory:
    Triton loads a model only from a directory of its name. A file under another name (`cfg.pbtxt`) is
    no model directory's config: its directory says nothing."""
    directory = directory_name(path)
    if directory is not None and config.name and config.name != directory:
        raise ConfigError(f"{path}: name {config.name!r} is not its directory's ({directory!r}): Triton "
                          "loads a model only from a directory of its name")


def directory_name(path: str | Path) -> str | None:
    """The name of the model directory a config.pbtxt at `path` is in, which Triton loads the model under
    (and names it by when the config sets no name); None for a file of another name (`cfg.pbtxt`)."""
    path = Path(path)
    if path.name != "config.pbtxt":
        return None
    return Path(os.path.abspath(path)).parent.name or None  # `./config.pbtxt` too; a link keeps its own name, as Triton reads it


# The first line of a config.pbtxt `tuner export` writes (the rest of the line: version, date, study), and
# of one `tuner config set -o` writes (the rest: the file it changed and how)
EXPORT_HEADER = "# Recommended by tuner "
SET_HEADER = "# Written by tuner config set "


def written_by_tuner(path: str | Path, *, text: str) -> bool:
    """Whether the file at `path` is tuner's to replace with `text` (tuner.files.check_replaceable's
    `ours`): one tuner wrote (it begins with EXPORT_HEADER or SET_HEADER), or the same text already.
    Only as many bytes as that takes are read."""
    new, headers = text.encode(), (EXPORT_HEADER.encode(), SET_HEADER.encode())
    with open(path, "rb") as fh:
        old = fh.read(max(len(new), *map(len, headers)) + 1)
    return old == new or old.startswith(headers)


def to_text(config: ModelConfig, comments_from: str | None = None) -> str:
    """The config as text. With `comments_from` (the original file's text), that text with only the
    top-level fields whose values differ rewritten (`_edited`): the rest of the file, its comments,
    order and layout, stay as the user wrote them, so a proposed change diffs as the change alone.
    Where that cannot be done (text the scanner does not follow), protobuf's printer writes the whole
    config (it drops comments) and each comment is put back above the top-level field it belonged to
    (a comment inside a block, or at the end of a line, goes above that block's field)."""
    text = text_format.MessageToString(config)
    if not comments_from:
        return text
    edited = _edited(comments_from, config)
    return edited if edited is not None else _reprinted(text, comments_from)


def _reprinted(text: str, comments_from: str) -> str:
    """The printer's `text` of a config with the comments of `comments_from` put back, each above the
    top-level field it belonged to."""
    attached, tail = _comments_by_field(comments_from)
    out: list[str] = []
    seen: Counter = Counter()
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        match = _FIELD_START.match(line)
        if match and not line[0].isspace():  # a top-level field (the printer indents nested ones)
            if match[1] in _MAP_FIELDS:  # printed sorted by key: its comments follow the key
                key = (match[1], _map_key("".join(lines[i:i + 2])))
            else:
                key = (match[1], seen[match[1]])
                seen[match[1]] += 1
            out.extend(_block(attached.pop(key, [])))
        out.append(line)
    left = [c for comments in attached.values() for c in comments] + tail  # fields no longer printed
    return "".join(out) + "".join(_block(left))


def _edited(original: str, config: ModelConfig) -> str | None:
    """`original` with each field whose value differs from `config`'s rewritten (`_edit_fields`); None
    where the result would not read back as `config` (then the caller prints the whole config)."""
    try:
        text = _edit_fields(original, text_format.Parse(original, ModelConfig()), config, indent="")
    except (text_format.ParseError, ValueError):
        return None
    try:
        same = text_format.Parse(text, ModelConfig()) == config
    except text_format.ParseError:
        same = False
    return text if same else None


def _edit_fields(text: str, old, new, *, indent: str) -> str:
    """The fields of one message's text (`old` as read from it) rewritten to `new`'s values: a message
    field written once as a block and set in both is edited inside its block, the same way (its other
    fields, explicit defaults and layout kept); any other changed field is replaced by the printer's
    text of its new value, a field gone removed with its line, a new one added at the end (`indent`:
    the block's own indentation plus two spaces; "" at the top)."""
    if old == new:
        return text
    spans = _top_level_spans(text)
    edits: list[tuple[int, int, str]] = []  # (start, end, new text) in `text`
    added: list[str] = []
    for field in new.DESCRIPTOR.fields:
        if _field_value(old, field) == _field_value(new, field):
            continue
        places = [(start, end) for name, start, end in spans if name == field.name]
        block = _block_inside(text, places) if (
            field.message_type is not None and not _repeated(field)
            and old.HasField(field.name) and new.HasField(field.name)) else None
        if block is not None:
            inner = _edit_fields(text[slice(*block)], getattr(old, field.name), getattr(new, field.name),
                                 indent=indent + "  ")
            edits.append((*block, inner))
            continue
        printed = _printed(new, field).replace("\n", "\n" + indent)
        if not places:
            added += [printed] if printed else []
            continue
        if printed:
            edits.append((places[0][0], places[0][1], _inner_comments(text[slice(*places[0])], indent) + printed))
            places = places[1:]
        edits += [(start, _line_end(text, end), _inner_comments(text[start:end], indent)) for start, end in places]
    out, at = [], 0
    for start, end, piece in sorted(edits):
        out += [text[at:start], piece]
        at = end
    text = "".join(out) + text[at:]
    if added and not indent:
        text = text.rstrip("\n") + "\n" + "".join(f"{a}\n" for a in added)
    elif added:  # inside a block: on lines of their own before its close
        text = text.rstrip() + "\n" + "".join(f"{indent}{a}\n" for a in added) + indent[:-2]
    return text


def _block_inside(text: str, places: list[tuple[int, int]]) -> tuple[int, int] | None:
    """The (start, end) of what lies between the braces of a field written once as a block
    (`name { ... }`, `name: { ... }`, `name < ... >`); None for anything else."""
    if len(places) != 1:
        return None
    start, end = places[0]
    name = re.compile(r"[A-Za-z_][A-Za-z0-9_]*").match(text, start)
    i = _skip_blank(text, name.end())
    if i < end and text[i] == ":":
        i = _skip_blank(text, i + 1)
    if i >= end or text[i] not in "{<" or text[end - 1] not in "}>":
        return None
    return i + 1, end - 1


def _is_map(field) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _field_value(config, field) -> object:
    """What one field of a message holds, comparable with ==: a dict, a list, a message or None (unset),
    a scalar."""
    if _is_map(field):
        return dict(getattr(config, field.name).items())
    if _repeated(field):
        return list(getattr(config, field.name))
    if field.message_type is not None:
        return getattr(config, field.name) if config.HasField(field.name) else None
    return getattr(config, field.name)


def _repeated(field) -> bool:
    # protobuf 6 deprecates FieldDescriptor.label for is_repeated, which older releases lack
    return field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED


def _printed(config, field) -> str:
    """The printer's text of one field of the message `config` ("" where it is unset)."""
    only = type(config)()
    if _is_map(field):
        for key, value in getattr(config, field.name).items():
            getattr(only, field.name)[key].CopyFrom(value)
    elif _repeated(field):
        getattr(only, field.name).extend(getattr(config, field.name))
    elif field.message_type is not None:
        if config.HasField(field.name):
            getattr(only, field.name).CopyFrom(getattr(config, field.name))
    else:
        setattr(only, field.name, getattr(config, field.name))
    return text_format.MessageToString(only).rstrip("\n")


def _inner_comments(code: str, indent: str = "") -> str:
    """The comments inside a field's text, as lines to keep above what replaces it (at `indent`)."""
    comments = [c for c in (_split_comment(line)[1] for line in code.splitlines()) if c]
    return "".join(f"{c}\n{indent}" for c in comments)


def _line_end(text: str, end: int) -> int:
    """`end`, moved past the rest of its line when nothing but blanks follow (a removed field takes its
    line with it)."""
    newline = text.find("\n", end)
    rest = text[end:] if newline < 0 else text[end:newline]
    return (len(text) if newline < 0 else newline + 1) if not rest.strip() else end


def _top_level_spans(text: str) -> list[tuple[str, int, int]]:
    """(field name, start, end) of each top-level field of a protobuf text: from its name to the end
    of its value (a scalar, a quoted string, or a block or list with what it nests). Comments and
    separators between fields belong to no span. ValueError where the text is not of that shape."""
    spans, i, n = [], 0, len(text)
    while True:
        i = _skip_blank(text, i)
        if i >= n:
            return spans
        match = re.compile(r"[A-Za-z_][A-Za-z0-9_]*").match(text, i)
        if not match:
            raise ValueError(f"no field name at {i}")
        name, start = match[0], i
        i = _skip_blank(text, match.end())
        if i < n and text[i] == ":":
            i = _skip_blank(text, i + 1)
        if i < n and text[i] in "{[<":
            i = _close(text, i)
        elif i < n and text[i] in "\"'":
            while i < n and text[i] in "\"'":  # adjacent strings are one value
                i = _skip_blank(text, _string_end(text, i))
            i = len(text[:i].rstrip())
        else:
            token = re.compile(r"[A-Za-z0-9_.+-]+").match(text, i)
            if not token:
                raise ValueError(f"no value for {name} at {i}")
            i = token.end()
        spans.append((name, start, i))


def _skip_blank(text: str, i: int) -> int:
    """Past whitespace, comments and field separators (, ;) from `i`."""
    while i < len(text):
        if text[i] in " \t\r\n,;":
            i += 1
        elif text[i] == "#":
            newline = text.find("\n", i)
            i = len(text) if newline < 0 else newline + 1
        else:
            break
    return i


def _string_end(text: str, i: int) -> int:
    """The index after the quoted string that starts at `i`."""
    quote, i = text[i], i + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
        elif text[i] == quote:
            return i + 1
        else:
            i += 1
    raise ValueError("an unterminated string")


def _close(text: str, i: int) -> int:
    """The index after the bracket that closes the one at `i`, past nested ones, strings and comments."""
    depth = 0
    while i < len(text):
        ch = text[i]
        if ch in "\"'":
            i = _string_end(text, i)
            continue
        if ch == "#":
            newline = text.find("\n", i)
            i = len(text) if newline < 0 else newline + 1
            continue
        if ch in "{[<":
            depth += 1
        elif ch in "}]>":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError("an unclosed block")


_FIELD_START = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*[:{\[<]")
_MAP_KEY = re.compile(r"\bkey\s*:\s*(\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*')")
# top-level map fields (`parameters`): protobuf's printer sorts their entries by key, so a comment
# goes with its entry's key, not with the entry's place in the file
_MAP_FIELDS = frozenset(f.name for f in ModelConfig.DESCRIPTOR.fields
                        if f.message_type is not None and f.message_type.GetOptions().map_entry)


def _map_key(code: str) -> str | None:
    """The key of a map entry whose text starts `code` (its first key: line), unquoted."""
    match = _MAP_KEY.search(code)
    return match[1][1:-1] if match else None


def _comments_by_field(text: str) -> tuple[dict[tuple, list[str]], list[str]]:
    """The comments of a config.pbtxt keyed by (top-level field, occurrence), or (map field, entry
    key), and those after the last field. A blank line between full-line comments is kept as an empty entry."""
    attached: dict[tuple, list[str]] = {}
    pending: list[str] = []
    current: tuple | None = None
    seen: Counter = Counter()
    depth = 0
    lines = text.splitlines()
    for i, line in enumerate(lines):
        code, comment = _split_comment(line)
        if depth == 0 and code.strip() and (match := _FIELD_START.match(code)):
            if match[1] in _MAP_FIELDS:  # keyed by its entry's key (the printer sorts them by it)
                current = (match[1], _map_key(" ".join(_split_comment(x)[0] for x in lines[i:i + 3])))
            else:
                current = (match[1], seen[match[1]])
                seen[match[1]] += 1
            attached.setdefault(current, []).extend(pending)
            pending = []
        if comment is not None:
            if depth == 0 and not code.strip():
                pending.append(comment)  # a full-line comment at the top: it goes with the next field
            elif current is not None:
                attached[current].append(comment)
            else:
                pending.append(comment)
        elif not line.strip() and pending and pending[-1]:
            pending.append("")
        depth += _nesting(code)
    return attached, pending


def _split_comment(line: str) -> tuple[str, str | None]:
    """(code, comment) of one line; a '#' inside a quoted string is not a comment."""
    quote = None
    escaped = False
    for i, ch in enumerate(line):
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            return line[:i], line[i:].rstrip()
    return line, None


def _nesting(code: str) -> int:
    """How much a line of code opens ({ [ <) minus closes, outside quoted strings."""
    unquoted = re.sub(r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'", "", code)
    return sum(unquoted.count(c) for c in "{[<") - sum(unquoted.count(c) for c in "}]>")


def _block(comments: list[str]) -> list[str]:
    while comments and not comments[-1]:
        comments = comments[:-1]
    return [f"{c}\n" for c in comments]


def to_json(config: ModelConfig) -> str:
    """The JSON form the repository load API takes as `config` (field names as in config.pbtxt)."""
    return json.dumps(json_format.MessageToDict(config, preserving_proto_field_name=True))


def from_json(data: str | bytes | dict) -> ModelConfig:
    """A config as Triton reports it (`v2/models/<m>/config`) back into the schema.

    Triton prints 64-bit fields as JSON numbers, protobuf's own JSON as strings; both parse.
    Fields this schema does not know (a newer server) are ignored.
    """
    try:
        if isinstance(data, (str, bytes)):
            data = json.loads(data)
        config = ModelConfig()
        json_format.ParseDict(data, config, ignore_unknown_fields=True)
    except (ValueError, json_format.ParseError) as exc:
        raise ConfigError(f"model config JSON does not fit Triton's schema: {exc}") from None
    return config


# --- Triton's rules on the scheduling fields ------------------------------------------------------


def validate(config: ModelConfig, source: str = "<config>") -> None:
    """Raise ConfigError(`SOURCE: message`) for the first scheduling rule the config breaks.

    The rules and their wording are Triton's own (core `src/model_config_utils.cc`,
    `ValidateModelConfig`, `ValidateEnsembleSchedulingConfig` and `ValidateInstanceGroup`), in the
    order Triton checks them, limited to the scheduling fields: max_batch_size; dynamic_batching
    (preferred sizes, priority levels, queue policies, preserve_ordering); sequence_batching
    (control tensors, preferred sizes, slot utilization, no response cache); which platform may use
    the ensemble scheduler; instance groups (none in an ensemble; no GPUs for KIND_CPU /
    KIND_MODEL). Then, as Triton's `ValidateModelIOConfig` does, each input's and output's name,
    data_type, dims and reshape (`ValidateIOShape`). Rules that depend on the server (GPU ids,
    backends) or on batch inputs are left to the server.
    Triton accepts `dynamic_batching` with `max_batch_size: 0` (it then never batches), so this does
    too.
    """
    name = _model_name(config, source)
    message = _first_broken_rule(config, name) or _first_broken_io_rule(config, name)
    if message is not None:
        raise ConfigError(f"{source}: {message}")


def _model_name(config: ModelConfig, source: str) -> str:
    # Triton names a model after its directory when the config does not.
    return config.name or directory_name(source) or "<unnamed>"


def _first_broken_rule(config: ModelConfig, name: str) -> str | None:
    if config.max_batch_size < 0:
        return f"'max_batch_size' must be non-negative value for {name}"

    if config.HasField("dynamic_batching"):
        batching = config.dynamic_batching
        for size in batching.preferred_batch_size:
            if size <= 0:
                return f"dynamic batching preferred size must be positive for {name}"
            if size > config.max_batch_size:
                return f"dynamic batching preferred size must be <= max batch size for {name}"

        levels = batching.priority_levels
        if levels != 0:
            if batching.default_priority_level == 0 or batching.default_priority_level > levels:
                return f"default priority level must be in range [1, {levels}] for {name}"
            for level in batching.priority_queue_policy:
                if level == 0 or level > levels:
                    return f"priority queue policy must have priority level in range [1, {levels}] for {name}"

        # preserve_ordering conflicts with priorities and with delaying timed-out requests.
        if batching.preserve_ordering:
            if levels > 1:
                return f"Only one priority level is allowed when 'preserve_ordering' is true for {name}"
            policies = [batching.default_queue_policy, *batching.priority_queue_policy.values()]
            for policy in policies:
                if policy.default_timeout_microseconds != 0 and policy.timeout_action == _DELAY:
                    return (
                        "Queue policy can not have DELAY as timeout action when "
                        f"'preserve_ordering' is true for {name}"
                    )

    if config.HasField("sequence_batching"):
        sequence = config.sequence_batching
        if config.response_cache.enable:
            return (
                f"Response Cache does not currently support model {name} with sequence batching "
                "scheduler. Please disable the response cache."
            )
        for kind in (
            _Control.CONTROL_SEQUENCE_START,
            _Control.CONTROL_SEQUENCE_END,
            _Control.CONTROL_SEQUENCE_READY,
        ):
            message = _sequence_control_problem(sequence, name, kind, boolean=True)
            if message is not None:
                return message
        message = _sequence_control_problem(sequence, name, _Control.CONTROL_SEQUENCE_CORRID, boolean=False)
        if message is not None:
            return message
        if sequence.HasField("oldest"):
            for size in sequence.oldest.preferred_batch_size:
                if size <= 0:
                    return f"sequence batching preferred batch size must be positive for {name}"
                if size > config.max_batch_size:
                    return f"sequence batching preferred batch size must be <= max batch size for {name}"
        if sequence.HasField("direct"):
            utilization = sequence.direct.minimum_slot_utilization
            if utilization < 0.0 or utilization > 1.0:
                return f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {name}"

    # The ensemble choice of the scheduler oneof goes with the "ensemble" platform only.
    if config.HasField("ensemble_scheduling"):
        if config.platform != "ensemble":
            return f"ensemble scheduling cannot be set for model '{name}' whose platform is not ensemble"
        if config.instance_group:
            return f"instance group should not be specified for ensemble '{name}'"
    elif config.platform == "ensemble":
        return f"ensemble scheduling must be set for ensemble {name} whose platform is ensemble"

    # Instance groups (Triton names an unnamed group `<model>_<index>` before checking).
    else:
        for index, group in enumerate(config.instance_group):
            group_name = group.name or f"{name}_{index}"
            kind = model_config_pb2.ModelInstanceGroup.Kind.Name(group.kind)
            if group.kind in (_KIND_CPU, _KIND_MODEL) and group.gpus:
                return f"instance group {group_name} of model {name} has kind {kind} but specifies one or more GPUs"
    return None


def _sequence_control_problem(sequence, name: str, kind: int, *, boolean: bool) -> str | None:
    """Triton's check of one control kind: named tensors, each used once, the kind given once,
    with exactly one pair of false/true values for a boolean control and none for CORRID (whose
    data type must be an integer or a string)."""
    kind_name = _Control.Kind.Name(kind)
    seen_tensors: set[str] = set()
    found = None
    for control_input in sequence.control_input:
        if not control_input.name:
            return f"sequence batching control tensor must have a name for {name}"
        if control_input.name in seen_tensors:
            return (
                f"sequence batching control tensor '{control_input.name}' is specified for multiple "
                f"control kinds for {name}"
            )
        seen_tensors.add(control_input.name)
        for control in control_input.control:
            if control.kind != kind:
                continue
            if found is not None:
                return f"sequence batching specifies multiple {kind_name} tensors for {name}"
            found = control
            pairs = {
                field: len(getattr(control, field))
                for field in ("int32_false_true", "fp32_false_true", "bool_false_true")
            }
            given = [field for field, size in pairs.items() if size]
            if not boolean:
                if given:
                    return (
                        "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' "
                        f"or 'bool_false_true' for {kind_name} for {name}"
                    )
                continue
            if not given:
                return (
                    "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
                    f"'bool_false_true' for {kind_name} for {name}"
                )
            if len(given) > 1:
                return (
                    "sequence batching specifies more than one from 'int32_false_true', "
                    f"'fp32_false_true' and 'bool_false_true' for {kind_name} for {name}"
                )
            if pairs[given[0]] != 2:
                return (
                    f"sequence batching control '{given[0]}' must have exactly 2 entries for "
                    f"{kind_name} for {name}"
                )
    if not boolean and found is not None and found.data_type not in _CORRID_TYPES:
        return (
            f"unexpected data type for control {kind_name} for {name}. Allowed data types are "
            "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"
        )
    return None


def _first_broken_io_rule(config: ModelConfig, name: str) -> str | None:
    """Triton's check of the model's inputs, then outputs, each message ending `for MODEL`."""
    for prefix, tensors in (("model input", config.input), ("model output", config.output)):
        for io in tensors:
            message = _io_shape_problem(io, config.max_batch_size, prefix)
            if message is not None:
                return f"{message} for {name}"
    return None


def _io_shape_problem(io, max_batch_size: int, prefix: str) -> str | None:
    """Triton's `ValidateIOShape` on one input or output, in its order and words."""
    if not io.name:
        return f"{prefix} must specify 'name'"
    prefix = f"{prefix} '{io.name}'"
    if io.data_type == model_config_pb2.TYPE_INVALID:  # an unset data_type reads as TYPE_INVALID
        return f"{prefix} must specify 'data_type'"
    if not io.dims:
        return f"{prefix} must specify 'dims'"
    reshape = list(io.reshape.shape) if io.HasField("reshape") else None
    if reshape == [] and max_batch_size == 0:
        return f"{prefix} cannot have empty reshape for non-batching model as scalar tensors are not supported"
    if any(d < 1 and d != -1 for d in io.dims):
        return f"{prefix} dimension must be integer >= 1, or -1 to indicate a variable-size dimension"
    if reshape is None:
        return None
    if any(d < 1 and d != -1 for d in reshape):
        return f"{prefix} reshape dimensions must be integer >= 1, or -1 to indicate a variable-size dimension"
    dims_size, reshape_size = _element_count(io.dims), _element_count(reshape)
    # equal counts, or both variable; an empty reshape (a scalar) takes dims of one element
    if dims_size != reshape_size and (reshape_size != 0 or dims_size != 1):
        return f"{prefix} has different size for dims and reshape"
    if dims_size == -1:  # each run of fixed dims between variable ones must hold as many elements
        dims_runs, reshape_runs = _fixed_runs(io.dims), _fixed_runs(reshape)
        if len(dims_runs) != len(reshape_runs):
            return f"{prefix} has different number of variable-size dimensions for dims and reshape"
        if dims_runs != reshape_runs:
            return f"{prefix} has different size for dims and reshape"
    return None


def _element_count(dims) -> int:
    """Triton's GetElementCount: -1 with any variable dim, 0 for no dims, else the product."""
    if -1 in dims:
        return -1
    return math.prod(dims) if len(dims) else 0


def _fixed_runs(dims) -> list[int]:
    """The element count of each run of fixed dims, the runs split at the variable (-1) ones."""
    runs, count = [], 1
    for d in dims:
        if d == -1:
            runs.append(count)
            count = 1
        else:
            count *= d
    return [*runs, count]


_Control = model_config_pb2.ModelSequenceBatching.Control
_CORRID_TYPES = {
    model_config_pb2.TYPE_UINT64,
    model_config_pb2.TYPE_INT64,
    model_config_pb2.TYPE_UINT32,
    model_config_pb2.TYPE_INT32,
    model_config_pb2.TYPE_STRING,
}
_DELAY = model_config_pb2.ModelQueuePolicy.DELAY
_KIND_CPU = model_config_pb2.ModelInstanceGroup.KIND_CPU
_KIND_MODEL = model_config_pb2.ModelInstanceGroup.KIND_MODEL


# --- reading configs: the scheduling table and field-by-field differences ----------------------


def scheduling_table(config: ModelConfig, *, path: str | Path | None = None) -> list[tuple[str, str]]:
    """The scheduling fields as (field, value) rows, in the order config.pbtxt usually has them; the
    name is the one Triton loads the model under: an unnamed config.pbtxt at `path` takes its directory's."""
    directory = directory_name(path) if path is not None and not config.name else None
    rows: list[tuple[str, str]] = [
        ("name", config.name or (f"{directory} (its directory's: config.pbtxt sets no name)" if directory else "-")),
        ("max_batch_size", str(config.max_batch_size)),
    ]
    choice = config.WhichOneof("scheduling_choice")
    rows.append(("scheduler", choice or "default (no batching)"))
    if choice == "dynamic_batching":
        batching = config.dynamic_batching
        rows += [
            ("dynamic_batching.max_queue_delay_microseconds", str(batching.max_queue_delay_microseconds)),
            ("dynamic_batching.preferred_batch_size", _sizes(batching.preferred_batch_size)),
            ("dynamic_batching.preserve_ordering", str(batching.preserve_ordering).lower()),
            ("dynamic_batching.priority_levels", str(batching.priority_levels)),
        ]
        if batching.priority_levels:
            rows.append(("dynamic_batching.default_priority_level", str(batching.default_priority_level)))
        if batching.HasField("default_queue_policy"):
            rows.append(("dynamic_batching.default_queue_policy", _policy(batching.default_queue_policy)))
        for level in sorted(batching.priority_queue_policy):
            rows.append(
                (
                    f"dynamic_batching.priority_queue_policy[{level}]",
                    _policy(batching.priority_queue_policy[level]),
                )
            )
    elif choice == "sequence_batching":
        sequence = config.sequence_batching
        strategy = sequence.WhichOneof("strategy_choice") or "direct"
        rows.append(("sequence_batching.strategy", strategy))
        if sequence.HasField("oldest"):
            oldest = sequence.oldest
            rows += [
                ("sequence_batching.oldest.max_candidate_sequences", str(oldest.max_candidate_sequences)),
                (
                    "sequence_batching.oldest.max_queue_delay_microseconds",
                    str(oldest.max_queue_delay_microseconds),
                ),
                ("sequence_batching.oldest.preferred_batch_size", _sizes(oldest.preferred_batch_size)),
            ]
        elif sequence.HasField("direct"):
            direct = sequence.direct
            rows.append(
                (
                    "sequence_batching.direct.max_queue_delay_microseconds",
                    str(direct.max_queue_delay_microseconds),
                )
            )
        rows.append(
            ("sequence_batching.max_sequence_idle_microseconds", str(sequence.max_sequence_idle_microseconds))
        )
    if config.platform == "ensemble":  # its steps' models run; an ensemble has no instances of its own
        rows.append(("instance_group", "none (an ensemble runs its steps' models' instances)"))
    elif not config.instance_group:
        rows.append(("instance_group", "none (Triton's default: one per GPU, or one on CPU)"))
    for index, group in enumerate(config.instance_group):
        kind = model_config_pb2.ModelInstanceGroup.Kind.Name(group.kind)
        value = f"count={group.count or 1} kind={kind}"
        if group.gpus:
            value += f" gpus={_sizes(group.gpus)}"
        rows.append((f"instance_group[{index}]" + (f" ({group.name})" if group.name else ""), value))
    return rows


def _sizes(values) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]" if len(values) else "[]"


def _policy(policy) -> str:
    action = model_config_pb2.ModelQueuePolicy.TimeoutAction.Name(policy.timeout_action)
    return (
        f"timeout_action={action} default_timeout_microseconds={policy.default_timeout_microseconds} "
        f"allow_timeout_override={str(policy.allow_timeout_override).lower()} max_queue_size={policy.max_queue_size}"
    )


def flatten(config: ModelConfig) -> dict[str, object]:
    """Every set field as `path -> value` (`instance_group[0].count`, `parameters[KEY].string_value`).

    Scalar lists stay one value (`dynamic_batching.preferred_batch_size: [4, 8]`); enums are names;
    a message that is present but empty (`dynamic_batching {}`) is `{}`, because its presence alone
    switches a feature on. Fields at their default value are absent, as protobuf has them.
    """
    out: dict[str, object] = {}
    _flatten(config, "", out)
    return out


def _flatten(message, prefix: str, out: dict[str, object]) -> None:
    fields = message.ListFields()
    if not fields and prefix:
        out[prefix.rstrip(".")] = {}
        return
    for field, value in fields:
        path = prefix + field.name
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            for key in sorted(value):
                if value_field.message_type is not None:
                    _flatten(value[key], f"{path}[{key}].", out)
                else:
                    out[f"{path}[{key}]"] = _scalar(value_field, value[key])
        elif field.is_repeated:
            if field.message_type is not None:
                for index, item in enumerate(value):
                    _flatten(item, f"{path}[{index}].", out)
            else:
                out[path] = [_scalar(field, v) for v in value]
        elif field.message_type is not None:
            _flatten(value, path + ".", out)
        else:
            out[path] = _scalar(field, value)


def _scalar(field, value):
    if field.enum_type is not None:
        enum_value = field.enum_type.values_by_number.get(value)
        return enum_value.name if enum_value is not None else value
    return value


def changed_fields(a: ModelConfig, b: ModelConfig) -> list[str]:
    """`field: old -> new` for every field that differs (`diff_fields`), as people read it: a number or
    a flag one side does not hold reads as the value Triton takes for it (0, false): proto3 keeps no
    trace of a 0 written out, so `unset (0)` would have been said of a `max_batch_size: 0` the user
    wrote; any other field one side lacks is `unset`."""
    def shown(value, other) -> str:
        if value is not None:
            return str(value)
        if isinstance(other, bool):
            return "false"
        return "0" if isinstance(other, (int, float)) else "unset"

    return [f"{path}: {shown(old, new)} -> {shown(new, old)}" for path, old, new in diff_fields(a, b)]


def diff_fields(a: ModelConfig, b: ModelConfig) -> list[tuple[str, object, object]]:
    """`(field_path, a_value, b_value)` for every field that differs; None where a side lacks it.

    An empty block on one side (`dynamic_batching {}`) against the same block with fields on the
    other is not reported itself: the fields inside it are.
    """
    flat_a, flat_b = flatten(a), flatten(b)
    diffs = []
    for path in sorted(flat_a.keys() | flat_b.keys()):
        value_a, value_b = flat_a.get(path), flat_b.get(path)
        if value_a == value_b:
            continue
        if {} in (value_a, value_b) and None in (value_a, value_b):
            other = flat_b if value_a == {} else flat_a
            if any(key.startswith((path + ".", path + "[")) for key in other):
                continue
        diffs.append((path, value_a, value_b))
    return diffs
