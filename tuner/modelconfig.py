"""config.pbtxt through Triton's own protobuf schema (a leaf: imports nothing else of tuner's).

Parsing and printing use `tritonclient.grpc.model_config_pb2.ModelConfig` with
`google.protobuf.text_format`; the JSON form is what Triton's repository load API takes as a
config override. Nothing here writes the user's file: changes return a new message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from tuner.errors import ConfigError

ModelConfig = model_config_pb2.ModelConfig


@dataclass(frozen=True)
class SchedulingParams:
    """The fields a trial tunes. None leaves the field as the base config has it."""

    max_batch_size: int | None = None
    max_queue_delay_microseconds: int | None = None
    preferred_batch_size: tuple[int, ...] | None = None
    instance_count: int | None = None

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}


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
        raise ConfigError(f"{where}: {message}") from None
    return config


def load(path: str | Path) -> ModelConfig:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (IsADirectoryError, UnicodeDecodeError, PermissionError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return parse(text, str(path))


def to_text(config: ModelConfig) -> str:
    return text_format.MessageToString(config)


def to_json(config: ModelConfig) -> str:
    """The JSON form the repository load API takes as `config` (field names as in config.pbtxt)."""
    return json.dumps(json_format.MessageToDict(config, preserving_proto_field_name=True))


def from_json(data: str | dict) -> ModelConfig:
    """A config as Triton reports it (`v2/models/<m>/config`) back into the schema."""
    if isinstance(data, str):
        data = json.loads(data)
    config = ModelConfig()
    json_format.ParseDict(data, config, ignore_unknown_fields=True)
    return config
