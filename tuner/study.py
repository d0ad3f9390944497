"""The study's inputs, read from its settings: the traffic it replays and the model's current config.

    study_traffic(settings)   the profile the study replays (the file, directory or glob of files, cut to
                              the study's window: only that window is read, tuner.traffic.recording)
    base_config(settings)     the model's config.pbtxt in the study's repository: the incumbent, and
                              the base every trial's configuration changes only the tuned fields of
    base_engine(settings, base)   a vLLM-backend model's engine arguments (its model.json): the same, for
                              the engine knobs; None for a model vLLM does not serve
    is_vllm_study(settings)   whether vLLM serves the study's model (its batching is the engine's):
                              the one test every command that treats such a study apart asks
    check_batcher_study(settings, command)   refuse, in one line, a vLLM-backend model's study in a
                              command that measures Triton's dynamic batcher only
    model_files(settings)     a digest of each file of the model's version directories (its code,
                              its weights): what a resumed study's trials must have measured too
    config_file(path), engine_file(path)   a configuration the user names (`--config`: a config.pbtxt, or a
                              vLLM-served model's model.json) in place of the repository's
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from tuner import modelconfig
from tuner.errors import ConfigError, OutputError, TrafficError, TunerError
from tuner.files import os_reason
from tuner.instants import parse_instant
from tuner.modelconfig import ModelConfig
from tuner.paths import same_file
from tuner.settings import StudySettings, read_study
from tuner.traffic.recording import joins_recording, open_recording, recording_files
from tuner.traffic.scan import busiest_in, read_all, read_range, read_window

__all__ = ["base_config", "base_engine", "check_batcher_study", "check_not_in_model", "check_not_input", "checked_base", "config_file",
           "recorded_study",
           "engine_file", "is_vllm_study", "model_digest", "model_files",
           "stale_profile", "study_traffic"]

_WHOLE_FILE_BYTES = 64 * 2**20  # a larger file (weights) is known by its size, first and last MiB


def study_traffic(settings: StudySettings) -> pd.DataFrame:
    """The profile the study replays: the recording, cut to the study's window if it names one.

    The busiest window is found by a scan of the timestamp column, and only the row groups of the
    window are read, so a week of hourly Parquet files replays without being loaded."""
    rec = open_recording(settings.traffic.path).of_model(settings.model)
    for note in rec.notes:
        print(f"traffic: {note}", file=sys.stderr)
    try:
        table = _traffic_window(rec, settings.traffic)
    except TrafficError:
        if rec.model is None or rec.names_model():
            raise
        table = pd.DataFrame()
    if table.empty:  # a window is refused with its span; no request of the model at all, here
        raise TrafficError(f"{rec.source}: no requests for model {settings.model} in its 'model' column "
                           "(the study replays only its model's requests)")
    if rec.left_out:  # a recording of several models: the others' requests would load this one
        others = ", ".join(f"{name} ({count:,})" for name, count in sorted(rec.left_out.items(), key=lambda kv: -kv[1]))
        print(f"traffic: only model {settings.model}'s requests are replayed (the 'model' column); "
              f"left out: {others}", file=sys.stderr)
    return table


def _traffic_window(rec, t) -> pd.DataFrame:
    """The requests of the study's traffic window (`traffic.busiest_s`, since/until, start/duration)."""
    if t.busiest_s is not None:
        if t.busiest_s > rec.end - rec.start:
            print(f"traffic: busiest_s {t.busiest_s:g} s is longer than the recording ({rec.end - rec.start:,.1f} s "
                  "from its first request to its last): the whole recording is replayed", file=sys.stderr)
        start, _ = busiest_in(rec, t.busiest_s)
        return read_window(rec, start, t.busiest_s)
    if t.since is not None or t.until is not None:
        return read_range(rec, *(None if v is None else parse_instant(v, f"traffic.{k}")
                                 for k, v in (("since", t.since), ("until", t.until))))
    if t.start_s is not None or t.duration_s is not None:
        return read_window(rec, t.start_s, t.duration_s)
    return read_all(rec)


def base_config(settings: StudySettings) -> ModelConfig:
    """The model's current config.pbtxt in the study's repository (the incumbent)."""
    return modelconfig.load(Path(settings.model_repository) / settings.model / "config.pbtxt")


def checked_base(settings: StudySettings) -> ModelConfig:
    """The base config once Triton would load it: its scheduling rules, and (a server of ours loads it
    from the repository) the model directory it sits in. What tune, simulate and profile check first."""
    path = Path(settings.model_repository) / settings.model / "config.pbtxt"
    base = base_config(settings)
    modelconfig.validate(base, str(path))
    if settings.server.launcher != "remote":  # a remote server loads its own copy, not this directory
        modelconfig.check_model_dir(path.parent, base)
    return base


def model_files(settings: StudySettings) -> dict[str, str]:
    """{path in the model's directory: a short digest} for each file of its version directories (`1/`,
    ...: what Triton loads, the model's code and weights), but model.json (the study's engine arguments,
    compared by their values) and Python's caches. A file over 64 MiB is digested by its size, first and
    last MiB: a tune start reads no gigabytes. Empty for a remote server, whose files are its own."""
    if settings.server.launcher == "remote":
        return {}
    model_dir = Path(settings.model_repository) / settings.model
    found = {}
    for version in sorted(p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()):
        for root, dirs, names in os.walk(version):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
            for name in sorted(names):
                if name.startswith(".") or name.endswith(".pyc") or name == "model.json":
                    continue
                path = Path(root) / name
                try:
                    found[path.relative_to(model_dir).as_posix()] = _digest(path)
                except OSError as exc:  # Triton could not load it either
                    raise ConfigError(f"{path}: cannot read ({os_reason(exc)})") from None
    return found


def model_digest(settings: StudySettings, base: ModelConfig) -> str:
    """A short digest of what the model computes with: its config less what a trial or the profile sets
    (batching, instances), and its files (`model_files`). A profile keeps it, so one measured on another
    version of the model (a changed parameter, model.py or weights) is known for what it is."""
    config = ModelConfig()
    config.CopyFrom(base)
    for name in ("max_batch_size", "dynamic_batching", "instance_group"):
        config.ClearField(name)
    text = modelconfig.to_text(config) + "".join(f"{k} {v}\n" for k, v in sorted(model_files(settings).items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def stale_profile(digest: str, settings: StudySettings, base: ModelConfig, *, where: str) -> str | None:
    """What to say of a profile (`where`) whose model digest (`digest`, from its header) is not this
    model's (`model_digest`): its times are another version's. None where they agree, or where the
    profile names no digest (written by hand, or by a tuner before it kept one)."""
    if not digest or digest == model_digest(settings, base):
        return None
    return (f"{where} was measured on another version of {settings.model} (its config's parameters or its "
            f"files changed since): its times may not be this model's")


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size <= _WHOLE_FILE_BYTES:
            digest.update(fh.read())
        else:
            digest.update(f"{size}:".encode() + fh.read(2**20))
            fh.seek(size - 2**20)
            digest.update(fh.read())
    return digest.hexdigest()[:16]


def base_engine(settings: StudySettings, base: ModelConfig) -> dict | None:
    """The engine arguments of the study's model when vLLM serves it (`tuner.llm.engineargs`), else None."""
    from tuner.llm import engineargs

    model_dir = Path(settings.model_repository) / settings.model
    return engineargs.read(model_dir) if engineargs.is_vllm_model(model_dir, base) else None


def config_file(path: str | Path, *, flag: str = "--config", like: ModelConfig | None = None) -> ModelConfig:
    """A config.pbtxt the user names (`flag`) instead of the repository's, parsed by Triton's schema; a file
    that is missing or not a config is one line naming `flag` and the path. With `like` (the study model's
    own config), a config of another model, or one that does not batch where the model does (an empty or
    partial file parses as max_batch_size 0: every request would fail), is refused too."""
    from tuner.errors import SettingsError
    from tuner.files import read_text

    text = read_text(Path(path), label=f"{flag} {path}", what="a config.pbtxt", error=SettingsError)
    config = modelconfig.parse(text, str(path))
    if like is not None and config.name and like.name and config.name != like.name:
        raise SettingsError(f"{flag} {path}: names model {config.name!r}, not the study's {like.name!r}")
    if like is not None and like.max_batch_size > 0 and config.max_batch_size <= 0:
        raise SettingsError(f"{flag} {path}: max_batch_size is {config.max_batch_size} (an empty or partial "
                            f"config?), where the study's model batches (max_batch_size {like.max_batch_size})")
    return config


def engine_file(path: str | Path, *, flag: str = "--config") -> dict:
    """A vLLM-served model's engine arguments (a model.json) the user names (`flag`) instead of the
    repository's, checked as vLLM's backend reads them."""
    from tuner.errors import SettingsError
    from tuner.files import read_json_object
    from tuner.llm import engineargs

    args = read_json_object(Path(path), label=f"{flag} {path}", missing="no such file (a vLLM-served model's "
                            f"{flag} is a model.json)", error=SettingsError)
    engineargs.check(args, source=str(path))
    if not args.get("model"):  # the whole file replaces the repository's: vLLM's backend needs the model
        raise SettingsError(f"{flag} {path}: no \"model\": a model.json names the model vLLM loads (start from "
                            "the repository's, or OUTPUT/recommended/model.json)")
    return args


def is_vllm_study(settings: StudySettings) -> bool:
    """Whether vLLM serves the study's model as its repository holds it (`engineargs.is_vllm_model`:
    `backend: "vllm"`, or a Python-backend model with a model.json); False without a config.pbtxt."""
    from tuner.llm import engineargs

    if not settings.model_repository:
        return False
    model_dir = Path(settings.model_repository) / settings.model
    return (model_dir / "config.pbtxt").is_file() and engineargs.is_vllm_model(model_dir)


def check_batcher_study(settings: StudySettings, command: str) -> None:
    """SettingsError in one line when the study's model is served by vLLM: `command` (audit, nightly, soak,
    simulate, profile, exporter) reads Triton's dynamic batcher and its statistics, which such a model,
    batched inside its engine, does not have; `tuner tune` and `tuner replay` take it."""
    from tuner.errors import SettingsError

    if is_vllm_study(settings):
        raise SettingsError(f"{settings.source or '<study>'}: {settings.model} is served by vLLM (its batching is the "
                            f"engine's): tuner {command} does not take a generative study yet; tuner tune and "
                            f"tuner replay do")


def check_not_in_model(path: str | Path, settings: StudySettings, *, label: str,
                       but: Iterable[str | Path] = ()) -> None:
    """Refuse (OutputError, one line starting with `label`) a file or directory to write inside the
    study's model directory, resolved (a write through a link lands where it points): a new file there
    too, as the model's directory is what the server loads (and what a resumed study digests,
    `model_files`). `but`: files there that may be written (export's live config, with --force)."""
    if not settings.model_repository:
        return
    model_dir = Path(os.path.realpath(Path(settings.model_repository) / settings.model))
    target = Path(os.path.realpath(path))
    if target.is_relative_to(model_dir) and target not in {Path(os.path.realpath(p)) for p in but}:
        raise OutputError(f"{label}: in the model's directory {model_dir}, which the server loads; refusing "
                          "to write there")


def recorded_study(study_file: str | None) -> StudySettings | None:
    """The study file a storage names (tune records it), read on this host; None where it is not here
    or no longer reads: what is checked against it is then left unchecked (a storage is read anywhere)."""
    if not study_file or not Path(study_file).is_file():
        return None
    try:
        return read_study(study_file)
    except TunerError:
        return None


def check_not_input(path: str | Path, *, label: str, study_file: str | None, traffic: str | None,
                    inputs: Iterable[tuple[str, str]] = ()) -> None:
    """Refuse (OutputError, one line starting with `label`) to write `path` over one of a study's inputs
    (its study file, one of its traffic files, or `inputs`: (path, what)), or where the study's traffic
    (a directory, a glob) would take it for one more traffic file: whatever --force says, as what a study
    reads is never what a command of it writes. Reads no file."""
    named = [(study_file, "the study file"), *inputs]
    if traffic:
        try:
            named += [(str(p), "the study's traffic") for p in recording_files(traffic)]
        except TrafficError:
            pass  # reading the traffic says why, in its own line
    for given, what in named:
        if given and same_file(path, given):
            raise OutputError(f"{label}: the same file as {what} {given}; refusing to write over it")
    if traffic and joins_recording(path, traffic):
        raise OutputError(f"{label}: among the study's traffic files ({traffic}): the study would "
                          f"replay it as traffic; refusing to write it there")
