"""A study YAML file as validated, frozen dataclasses.

Every section is a dataclass; the loader walks the YAML against the dataclass fields, so an unknown
or misspelt key is rejected by name (`study.yaml: sla.latncy_ms: unknown key (expected one of ...)`)
and a value of the wrong type names its key. Relative paths are resolved against the YAML's folder.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tuner.errors import InputError, SettingsError, did_you_mean
from tuner.files import read_text
from tuner.instants import parse_instant
from tuner.paths import nameable

LAUNCHERS = ("local", "docker", "remote")
NETWORKS = ("host", "published")
PROTOCOLS = ("http", "grpc")
SAMPLERS = ("tpe", "gp", "random", "grid")
STRATEGIES = ("measure", "model")  # measure every trial the sampler draws | rank in simulation, measure the top
SCORINGS = ("capacity", "utilization")
PREFERRED_STRATEGIES = ("none", "max", "powers_of_two", "search")  # search: a tuned choice of the three
# ... or a list of strategies: a tuned choice among those (e.g. [none, powers_of_two])


_RULE = "tuner.rule"  # a field's metadata: the bound its number keeps when set, or its choices


def positive(default: float | int | None) -> typing.Any:
    """A field whose value, when set, must be > 0 (checked as the study loads)."""
    return field(default=default, metadata={_RULE: "> 0"})


def at_least_zero(default: float | int | None) -> typing.Any:
    """A field whose value, when set, must be >= 0 (checked as the study loads)."""
    return field(default=default, metadata={_RULE: ">= 0"})


def one_of(choices: tuple[str, ...], default: str) -> typing.Any:
    """A field whose value must be one of `choices` (checked as the study loads)."""
    return field(default=default, metadata={_RULE: choices})


@dataclass(frozen=True)
class Between:
    """The rule of a field whose value must lie in low..high, both included."""

    low: int
    high: int

    def __str__(self) -> str:
        return f"in {self.low}..{self.high}"


def between(low: int, high: int, default: int) -> typing.Any:
    """A field whose value must be in low..high (checked as the study loads)."""
    return field(default=default, metadata={_RULE: Between(low, high)})


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """Which Triton serves the trials (`server:`): a container, a local process or one already running."""

    launcher: str = one_of(LAUNCHERS, "local")
    # remote: the running server's HTTP address (host:port) and optional gRPC address
    url: str | None = None
    grpc_url: str | None = None
    # and its Prometheus endpoint when it is not the HTTP port + 2 (Triton's 8000 / 8002), e.g.
    # http://127.0.0.1:9002/metrics: where a vLLM model's engine series are read
    metrics_url: str | None = None
    # docker: image, GPUs ("all", a count, or a list of device ids), shared memory, networking
    image: str = "nvcr.io/nvidia/tritonserver:25.10-py3"
    gpus: str | int | list[int] | None = None
    shm_size: str = "256m"
    network: str = one_of(NETWORKS, "host")  # host (server bound to 127.0.0.1) | published (ports on 127.0.0.1)
    environment: dict[str, str] = field(default_factory=dict)
    extra_args: list[str] = field(default_factory=list)
    startup_timeout_s: float = positive(120.0)
    # local: where the tritonserver from the nvidia-pytriton wheel lives (default: a user cache)
    install_dir: str | None = None


@dataclass(frozen=True, kw_only=True)
class TrafficSettings:
    """The recorded traffic (`traffic:`): its file, the part of it to use and the speed of its real load."""

    path: str = ""
    # optional window of the profile: start/duration in seconds from its first request, or the
    # busiest window of this many seconds
    start_s: float | None = at_least_zero(None)
    duration_s: float | None = positive(None)
    busiest_s: float | None = positive(None)
    # or a date range: the requests from `since` until `until` (either open), each an ISO-8601 date
    # and time (naive: UTC) or a number of seconds on the recording's own clock
    since: float | str | None = None
    until: float | str | None = None
    # the speed that stands for "the load the traffic really has" (utilization scoring)
    speed: float = positive(1.0)


@dataclass(frozen=True)
class ReplaySettings:
    """How the load generator replays the traffic (`replay:`)."""

    warmup_s: float = at_least_zero(2.0)
    # send lag p99 above this makes a replay invalid (the load generator was the bottleneck)
    lag_budget_ms: float = positive(5.0)
    # Locust worker processes: 0 = decide from the offered rate
    workers: int = at_least_zero(0)
    max_in_flight: int = positive(1000)
    request_timeout_s: float = positive(30.0)
    protocol: str = one_of(PROTOCOLS, "http")  # tritonclient's HTTP or gRPC


@dataclass(frozen=True, kw_only=True)
class MeasurementSettings:
    """How a configuration is measured once loaded (`measurement:`): warm-up and repeats."""

    # after every load: one request of each (rows, padded length) the traffic forms, rows 1 up to
    # max_batch_size, then the traffic at its load, read every `window_s`, in windows of at least 12
    # executions, until `stable_windows` in a row agree on Triton's compute time per execution within
    # their noise (3 standard errors) or `stability_pct` (perf_analyzer's rule), or `warmup_max_s` of
    # windows passes and the configuration is `unstable` (tuner/trial/warmup.py)
    warmup: bool = True
    shape_sweep: bool = True
    window_s: float = positive(1.0)
    stable_windows: int = positive(3)
    stability_pct: float = positive(10.0)
    warmup_max_s: float = positive(30.0)
    # a measurement whose SLA percentile is within this share of the limit decides a close call: it is
    # repeated until two in a row agree within stability_pct (at most max_repeats), the median counts
    repeat_near_sla: float = at_least_zero(0.15)
    max_repeats: int = positive(3)


class _Unwritten(float):
    """A default the study file did not write: a number like any other, that `check_generative` can
    tell from the same number written (a generative study refuses an encoder's `latency_ms`)."""


@dataclass(frozen=True)
class SlaSettings:
    """The SLA (`sla:`): a percentile's limit and the share of errors allowed. An encoder study limits
    the request's latency (`latency_ms`); a generative one (a vLLM-backend model replaying token
    traffic) limits the time to first token (`ttft_ms`: first streamed token minus the request's due
    time) and/or the time per output token (`tpot_ms`: (last token - first token) / (output tokens -
    1)) and/or the end-to-end time (`e2e_ms`: last token minus due time, the limit vLLM's auto-tune
    script uses), each at the same percentile (`check_generative` holds a study to its kind)."""

    latency_ms: float = positive(_Unwritten(100.0))
    percentile: float = 99.0
    max_error_rate: float = at_least_zero(0.001)
    ttft_ms: float | None = positive(None)
    tpot_ms: float | None = positive(None)
    e2e_ms: float | None = positive(None)


@dataclass(frozen=True)
class CostSettings:
    """What a server costs (`cost:`): the GPU and cloud of the price table, or a price per hour."""

    gpu: str = "cpu"
    cloud: str | None = None
    price_per_hour: float | None = positive(None)  # overrides the price table
    gpus_per_server: int = positive(1)


@dataclass(frozen=True)
class IntRange:
    """An integer range of the search space: low and high, on a log scale or in steps."""

    low: int
    high: int
    log: bool = False
    step: int = 1


@dataclass(frozen=True)
class FloatRange:
    """A range of numbers of the search space: low and high, on a log scale, or in steps (`step`;
    the grid walks it, or takes `GRID_POINTS` points across the range without one)."""

    low: float
    high: float
    log: bool = False
    step: float | None = None


@dataclass(frozen=True)
class CapacitySettings:
    """The capacity search (`search.capacity:`): where it starts, how far it goes, when it stops."""

    tolerance: float = positive(0.1)  # relative width of the final bracket
    start_speed: float = positive(1.0)
    max_speed: float = positive(1000.0)
    step_duration_s: float = positive(10.0)  # length of each bisection replay (a window of the profile)
    max_steps: int = positive(8)  # steps after the load's (0: every capacity would read the load)


@dataclass(frozen=True, kw_only=True)
class SearchSettings:
    """The search (`search:`): the sampler, the budget and the space of each tuned parameter."""

    sampler: str = one_of(SAMPLERS, "tpe")
    trials: int = positive(20)
    timeout_s: float | None = positive(None)
    seed: int = between(0, 2**32 - 1, 0)  # what Optuna's samplers (numpy's RandomState) take
    # the dynamic batcher's knobs (config.pbtxt); None: not tuned (a vLLM-backend model's study,
    # `tuner.space.study_space`)
    max_batch_size: IntRange | None = field(default_factory=lambda: IntRange(1, 64, log=True))
    max_queue_delay_microseconds: IntRange | None = field(default_factory=lambda: IntRange(0, 20000, step=500))
    preferred_batch_size: str | list[str] = one_of(PREFERRED_STRATEGIES, "none")
    instance_count: IntRange | None = None
    # a bounded queue (dynamic_batching.default_queue_policy.max_queue_size; 0 = unbounded) rejects
    # requests instead of letting latency grow: tuned only when given a range
    max_queue_size: IntRange | None = None
    # vLLM's continuous batching (engine arguments in the model's model.json), tuned when given a range
    # (a vLLM-backend model only): sequences per step, tokens per step, chunked prefill, and the KV
    # cache: its share of GPU memory, or its size in GiB (a CPU; kv_cache_memory_bytes)
    max_num_seqs: IntRange | None = None
    max_num_batched_tokens: IntRange | None = None
    enable_chunked_prefill: list[bool] | None = None
    gpu_memory_utilization: FloatRange | None = None
    kv_cache_gib: IntRange | None = None
    capacity: CapacitySettings = field(default_factory=CapacitySettings)
    top_k: int = positive(3)
    remeasure_repeats: int = positive(3)
    grid_per_octave: int = positive(1)  # grid sampler: points per doubling on a log-scale range (1: powers of two)
    # model: profile the model (or read `profile`), simulate the whole space, measure the incumbent and
    # the simulation's `model_top`; past a median error of `model_error` the sampler searches on
    strategy: str = one_of(STRATEGIES, "measure")
    profile: str | None = None
    model_top: int = positive(3)
    model_error: float = positive(0.2)
    # a worker's trial is alive while its heartbeat reaches the storage every heartbeat_s; one silent
    # for grace_period_s (its host died) is failed and run again by another worker
    heartbeat_s: int = positive(10)
    grace_period_s: int = positive(60)
    # hosts sharing the study (--storage) must have the first one's GPU type, unless this allows others
    mixed_gpus: bool = False


@dataclass(frozen=True, kw_only=True)
class StudySettings:
    """A study as its YAML file says it: the model, its traffic, the SLA, the cost, the search."""

    name: str
    model_repository: str
    model: str
    traffic: TrafficSettings
    server: ServerSettings = field(default_factory=ServerSettings)
    replay: ReplaySettings = field(default_factory=ReplaySettings)
    measurement: MeasurementSettings = field(default_factory=MeasurementSettings)
    sla: SlaSettings = field(default_factory=SlaSettings)
    cost: CostSettings = field(default_factory=CostSettings)
    scoring: str = one_of(SCORINGS, "capacity")
    search: SearchSettings = field(default_factory=SearchSettings)
    output: str = ""  # "": runs/<name> (beside the study file, once its paths are resolved)
    storage: str | None = None
    source: str = ""  # the YAML file this came from (set by the loader)

    def __post_init__(self) -> None:
        if not self.output:  # two studies without an output of their own must not share one
            object.__setattr__(self, "output", f"runs/{_folder_name(self.name)}")


def _folder_name(name: str) -> str:
    """A study's name as one folder name (`runs/<it>`): a character a path gives a meaning to becomes `_`."""
    text = re.sub(r"[/\\\x00]", "_", name.strip())
    return text if text not in ("", ".", "..") else "study"


# --- server addresses ----------------------------------------------------------------------------

# a host name or IPv4 address, or an IPv6 address in brackets (kept so that host:port stays valid)
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]")


def parse_host_port(text: str, *, where: str, schemes: tuple[str, ...] = ("http",),
                    error: type[Exception] = SettingsError) -> tuple[str, int]:
    """The (host, port) of `host:port`, with or without `scheme://` and a trailing slash.

    Raises `error` naming `where` (a key or a flag), the rule and the value: the one parser of server
    addresses, here so that both the study check and tuner.server use it without a layer breach.
    """
    def fail(why: str) -> Exception:
        return error(f"{where}: expected host:port (e.g. 127.0.0.1:8000) with a port in 1..65535, "
                     f"but got {text!r} ({why})")

    if not isinstance(text, str):
        raise fail("not a string")
    address = text.strip()
    scheme, sep, rest = address.partition("://")
    if sep:
        if scheme.lower() not in schemes:
            raise fail(f"scheme {scheme + '://'!r} is not {' or '.join(s + '://' for s in schemes)}")
        address = rest
    address = address[:-1] if address.endswith("/") else address
    if any(c in address for c in "/?#@"):
        raise fail("no path, query or user: only a host and a port")
    host, colon, port = address.rpartition(":")
    if not colon or not port:
        raise fail("no port")
    if not host:
        raise fail("no host")
    if not _HOST.fullmatch(host):
        if ":" in host and not host.startswith("["):
            raise fail("an IPv6 address goes in brackets, e.g. [::1]:8000")
        raise fail(f"host {host!r} is not a host name or an IP address")
    if not (port.isascii() and port.isdigit()):
        raise fail(f"port {port!r} is not a number")
    if not 1 <= int(port) <= 65535:
        raise fail(f"port {int(port)} is out of range")
    return host, int(port)


# --- loading -------------------------------------------------------------------------------------

_S = typing.TypeVar("_S")  # a settings dataclass
_PATH_KEYS = ("model_repository", "traffic.path", "output", "server.install_dir", "search.profile")


def read_study(path: str | Path) -> StudySettings:
    """The study YAML at `path`, validated, its relative paths resolved against its folder."""
    return read_settings(path, StudySettings, resolve=_resolve_paths, check=_check)


def read_settings(path: str | Path, cls: type[_S], *, resolve: Callable[[_S, Path, str], _S],
                  check: Callable[[_S, str], None]) -> _S:
    """The settings dataclass `cls` (with a `source` field) of the YAML at `path`: an unknown key or
    a value of the wrong type named, its relative paths resolved against its folder (`resolve`), its
    values checked (`check`), its `source` the path. The study's and the nightly job's loader."""
    path = Path(path)
    settings = resolve(_build(cls, _read_yaml(path), str(path), prefix=""), path.parent, str(path))
    check(settings, str(path))
    return dataclasses.replace(settings, source=str(path))


def study_from_dict(data: dict, base_dir: str | Path = ".", source: str = "<study>") -> StudySettings:
    """The study of already-parsed YAML `data`, validated, its relative paths resolved against `base_dir`."""
    settings = _resolve_paths(_build(StudySettings, data, source, prefix=""), Path(base_dir), source)
    _check(settings, source)
    return settings


def with_overrides(settings: StudySettings, overrides: dict[str, object]) -> StudySettings:
    """Replace dotted keys (e.g. {"sla.latency_ms": 50}) and validate again."""
    data = dataclasses.asdict(settings)
    data.pop("source")  # the loader's, not a key: given back below
    source = settings.source or "<study>"
    for key, value in overrides.items():
        node = data
        *parents, last = key.split(".")
        for part in parents:
            _check_key(node, part, key=key, source=source)
            node = node[part]
        _check_key(node, last, key=key, source=source)
        node[last] = value
    built = dataclasses.replace(_build(StudySettings, data, settings.source or "<study>", prefix=""),
                                source=settings.source)
    _check(built, settings.source or "<study>")
    return built


def _check_key(node, part: str, *, key: str, source: str) -> None:
    """SettingsError for the dotted `key` whose `part` is not a key of `node`, with a `did you mean` as the
    file's own misspelt key gets (`_build`); a value is no section: it has no keys."""
    if isinstance(node, dict) and part in node:
        return
    if not isinstance(node, dict):
        raise SettingsError(f"{source}: {key}: unknown key")
    hint = did_you_mean(part, node)
    raise SettingsError(f"{source}: {key}: unknown key ({hint + ' ' if hint else ''}"
                        f"expected one of: {', '.join(node)})")


# A study or nightly file is a page of settings; past this it is not one, and is refused unparsed.
MAX_YAML_BYTES = 2**20

_MERGE = "tag:yaml.org,2002:merge"


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that gives a key twice (where the last would silently
    win) with the key and the lines of both. A merge (`<<: *base`) may still override a key."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        """The mapping of `node`, once no key is given twice in it."""
        first: dict = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE:
                continue
            key = self.construct_object(key_node, deep=True)
            if key in first:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {first[key].start_mark.line + 1})",
                    key_node.start_mark)
            first[key] = key_node
        return super().construct_mapping(node, deep=deep)


# PyYAML follows YAML 1.1, where a float needs a dot and a signed exponent: `1e3`, `2.5e3` and `1e-3`
# were read as strings and refused as "expected a number". YAML 1.2 (and a person) reads them as numbers.
UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def parse_yaml(text: str, source: str):
    """The data of YAML `text` (the safe loader, no key given twice); SettingsError
    `<source>:<line>:<column>: invalid YAML: <problem>` otherwise."""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise SettingsError(f"{where}: invalid YAML: {problem}") from None


def _read_yaml(path: Path) -> dict:
    data = parse_yaml(read_text(path, error=SettingsError, max_bytes=MAX_YAML_BYTES), str(path))
    if not isinstance(data, dict):
        raise SettingsError(f"{path}: expected a mapping of settings at the top level")
    return data


def _build(cls, data, source: str, *, prefix: str):
    if not isinstance(data, dict):
        raise SettingsError(f"{source}: {prefix.rstrip('.') or 'top level'}: expected a mapping")
    hints = typing.get_type_hints(cls)
    # `source` (the file's own path) is set by the loader, never by the file
    fields = {f.name: f for f in dataclasses.fields(cls) if not (prefix == "" and f.name == "source")}
    unknown = sorted(set(data) - set(fields), key=str)
    if unknown:
        hint = did_you_mean(str(unknown[0]), fields)
        raise SettingsError(f"{source}: {prefix}{unknown[0]}: unknown key ({hint + ' ' if hint else ''}"
                            f"expected one of: {', '.join(fields)})")
    values = {}
    for name, f in fields.items():
        key = prefix + name
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise SettingsError(f"{source}: {key}: required key missing")
            continue
        values[name] = _convert(hints[name], data[name], source, key=key)
    return cls(**values)


def _convert(hint, value, source: str, *, key: str):
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(option, value, source, key=key)
            except SettingsError as exc:
                errors.append(exc)
        raise errors[-1]
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, source, prefix=key + ".")
    if origin is list:
        if not isinstance(value, list):
            raise SettingsError(f"{source}: {key}: expected a list, got {value!r}")
        (item,) = typing.get_args(hint)
        return [_convert(item, v, source, key=f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise SettingsError(f"{source}: {key}: expected a mapping, got {value!r}")
        # a mapping to `object` (the nightly's study_overrides) keeps YAML's values: null, numbers, lists
        keep = typing.get_args(hint)[1:] == (object,)
        return {str(k): v if keep else str(v) for k, v in value.items()}
    if hint is bool:
        if not isinstance(value, bool):
            raise SettingsError(f"{source}: {key}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SettingsError(f"{source}: {key}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, _Unwritten):  # a default carried through with_overrides stays one
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SettingsError(f"{source}: {key}: expected a number, got {value!r}")
        try:
            number = float(value)
        except OverflowError:  # an integer past any float
            number = math.inf
        if not math.isfinite(number):  # NaN passes every range check; no setting means infinity
            raise SettingsError(f"{source}: {key}: expected a finite number, got {value!r}")
        return number
    if hint is str:
        if isinstance(value, datetime.date):  # YAML reads an unquoted 2026-11-25T06:00 as a datetime
            return value.isoformat()
        if not isinstance(value, str):
            raise SettingsError(f"{source}: {key}: expected a string, got {value!r}")
        return value
    raise SettingsError(f"{source}: {key}: unsupported value {value!r}")


def _get(settings, dotted: str):
    node = settings
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def resolve_path(value: str | None, base: Path, *, key: str, source: str) -> str | None:
    """`value` (a path a settings file gives) made absolute against the file's folder `base`; a
    SettingsError naming `key` when no file could ever have that name (tuner.paths.nameable)."""
    if value in (None, ""):
        return value
    try:
        given = Path(value).expanduser()
    except RuntimeError as exc:  # ~user of no such user
        raise SettingsError(f"{source}: {key}: {value}: {exc}") from None
    if given.is_absolute():
        return str(nameable(given, label=f"{source}: {key}: {given}", error=SettingsError))
    joined = base / given
    nameable(joined, label=f"{source}: {key}: {joined}", error=SettingsError)  # before resolve() meets a loop
    return str(joined.resolve())


def _resolve_paths(settings: StudySettings, base: Path, source: str) -> StudySettings:
    for key in _PATH_KEYS:
        settings = _replace(settings, key, resolve_path(_get(settings, key), base, key=key, source=source))
    return dataclasses.replace(settings, storage=_resolve_storage(settings.storage, base, source=source))


def _resolve_storage(storage: str | None, base: Path, *, source: str) -> str | None:
    """The study's `storage` with a file it names relative to the study's folder, as its other paths: an
    SQLite URL's (`sqlite:///study.db`, three slashes and a relative path) or a journal file's; a
    database server's URL as it is."""
    if not storage:
        return storage
    if storage.startswith("sqlite:///"):
        path = storage.removeprefix("sqlite:///")
        if path and not path.startswith("/") and path != ":memory:":
            return "sqlite:///" + resolve_path(path, base, key="storage", source=source)
        return storage
    if "://" in storage:
        return storage
    return resolve_path(storage, base, key="storage", source=source)


def _replace(node, dotted: str, value):
    """`node` with the field at the dotted key replaced by `value`."""
    name, _, rest = dotted.partition(".")
    if rest:
        value = _replace(getattr(node, name), rest, value)
    return dataclasses.replace(node, **{name: value})


def _ruled(node, prefix: str = ""):
    """(dotted key, rule, value) of every field with a rule (a bound or its choices), the sections
    walked in their order."""
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if _RULE in f.metadata:
            yield prefix + f.name, f.metadata[_RULE], value
        elif dataclasses.is_dataclass(value):
            yield from _ruled(value, f"{prefix}{f.name}.")


def _check_range(t: TrafficSettings, source: str) -> None:
    """traffic.since / until: times that read, in order, and not beside another way to cut a window."""
    if t.since is None and t.until is None:
        return
    if t.busiest_s is not None or t.start_s is not None or t.duration_s is not None:
        raise SettingsError(f"{source}: traffic: give since/until or busiest_s or start_s/duration_s, "
                            "one way to choose the window")
    try:
        since, until = (None if v is None else parse_instant(v, f"traffic.{k}")
                        for k, v in (("since", t.since), ("until", t.until)))
    except InputError as exc:
        raise SettingsError(f"{source}: {exc}") from None
    if since is not None and until is not None and not since < until:
        raise SettingsError(f"{source}: traffic.until must come after traffic.since "
                            f"(got {t.since!r} to {t.until!r})")


def _check(s: StudySettings, source: str) -> None:
    for key, rule, value in _ruled(s):
        if isinstance(rule, tuple) and isinstance(value, list):  # a choice among the rule's (not its "search")
            if not value or len(set(value)) != len(value) or not set(value) <= set(rule) - {"search"}:
                raise SettingsError(f"{source}: {key}: a list must name distinct choices among "
                                    f"{', '.join(c for c in rule if c != 'search')}, got {value!r}")
        elif isinstance(rule, tuple):
            if value not in rule:
                raise SettingsError(f"{source}: {key}: must be one of {', '.join(rule)}, got {value!r}")
        elif isinstance(rule, Between):
            if not rule.low <= value <= rule.high:
                raise SettingsError(f"{source}: {key}: must be {rule}, got {value!r}")
        elif value is not None and (value < 0 or (value == 0 and rule == "> 0")):
            raise SettingsError(f"{source}: {key}: must be {rule}, got {value!r}")
    if not 0 < s.sla.percentile <= 100:
        raise SettingsError(f"{source}: sla.percentile: must be in (0, 100], got {s.sla.percentile}")
    if s.sla.max_error_rate > 1:
        raise SettingsError(f"{source}: sla.max_error_rate: must be <= 1, got {s.sla.max_error_rate}")
    if s.traffic.busiest_s is not None and s.traffic.start_s is not None:
        raise SettingsError(f"{source}: traffic: give either busiest_s or start_s, not both")
    _check_range(s.traffic, source)
    if s.search.max_batch_size is None:  # not tuned is a vLLM study's (tuner.space.study_space); a batcher's sizes its batches
        raise SettingsError(f"{source}: search.max_batch_size: null: give a range (e.g. {{low: 1, high: 64, log: true}}; "
                            f"low = high holds it), or leave the key out for that default")
    for key, minimum in (("search.max_batch_size", 1), ("search.max_queue_delay_microseconds", 0),
                         ("search.instance_count", 1), ("search.max_queue_size", 0), ("search.max_num_seqs", 1),
                         ("search.max_num_batched_tokens", 1), ("search.kv_cache_gib", 1)):
        r = _get(s, key)
        if r is None:
            continue
        if not minimum <= r.low <= r.high:
            raise SettingsError(f"{source}: {key}: {minimum} <= low <= high must hold, "
                                f"but got (low={r.low}, high={r.high})")
        if r.step < 1:
            raise SettingsError(f"{source}: {key}.step: must be >= 1, got {r.step}")
        if r.log and r.low < 1:
            raise SettingsError(f"{source}: {key}: a log range needs low >= 1, got low={r.low}")
        if r.log and r.step != 1:
            raise _log_and_step(source, key, r.step)
        if not r.log and r.step > 1 and (r.high - r.low) % r.step:
            raise SettingsError(f"{source}: {key}: high={r.high} is not low + a whole number of steps of "
                                f"{r.step} (the search would never try it): e.g. high "
                                f"{r.low + (r.high - r.low) // r.step * r.step} or step "
                                f"{_even_step(r.low, r.high, r.step)}")
    _check_engine_ranges(s, source)
    cap = s.search.capacity
    if not cap.tolerance <= 1:  # 1: a bracket whose upper edge is twice its lower (as tuner simulate --tolerance)
        raise SettingsError(f"{source}: search.capacity.tolerance: the bracket's relative width, a fraction in "
                            f"(0, 1], got {cap.tolerance:g}")
    if cap.start_speed > cap.max_speed:
        raise SettingsError(f"{source}: search.capacity.start_speed {cap.start_speed:g} is above max_speed "
                            f"{cap.max_speed:g}")
    if s.search.grace_period_s <= s.search.heartbeat_s:
        raise SettingsError(f"{source}: search.grace_period_s: must be > search.heartbeat_s "
                            f"({s.search.heartbeat_s}), got {s.search.grace_period_s}")
    if s.server.launcher == "remote" and not s.server.url:
        raise SettingsError(f"{source}: server.url: required when server.launcher is remote")
    if s.server.url:
        parse_host_port(s.server.url, where=f"{source}: server.url")
    if s.server.grpc_url:
        parse_host_port(s.server.grpc_url, where=f"{source}: server.grpc_url", schemes=("grpc",))
    if s.server.metrics_url:  # http://host:port/metrics
        address = s.server.metrics_url.strip()
        if not address.startswith("http://") or not address.rstrip("/").endswith("/metrics"):
            raise SettingsError(f"{source}: server.metrics_url: expected http://host:port/metrics, "
                                f"got {s.server.metrics_url!r}")
        parse_host_port(address.rstrip("/")[: -len("/metrics")], where=f"{source}: server.metrics_url")
    _check_docker_fields(s.server, source)
    if not s.name or not s.model:
        raise SettingsError(f"{source}: name and model must not be empty")


def _check_docker_fields(server: ServerSettings, source: str) -> None:
    """server.shm_size as Docker reads a size (a number, then b, k, m or g) and server.gpus as the docker
    launcher reads GPUs ('all', a count, device ids): refused here, where a run would fail at its
    container's start (or hand a typo to the GPU runtime as a device id)."""
    if not re.fullmatch(r"\d+(\.\d+)?([kmg]b?|b)?", str(server.shm_size).strip().lower()):
        raise SettingsError(f"{source}: server.shm_size: expected a size such as 256m or 1g (a number, then b, "
                            f"k, m or g), got {server.shm_size!r}")
    gpus = server.gpus
    if isinstance(gpus, bool) or isinstance(gpus, int):  # a count (a bool is YAML's yes/no, not one)
        ok = not isinstance(gpus, bool) and gpus >= 0
    elif isinstance(gpus, list):  # device ids
        ok = all(str(i).isdigit() for i in gpus)
    else:  # None, "", "all", a count as text, or device ids as text ("0,1", "device=0,1")
        text = str(gpus or "").strip()
        ok = text in ("", "all") or all(p.strip().isdigit() for p in text.removeprefix("device=").split(","))
    if not ok:
        raise SettingsError(f"{source}: server.gpus: expected 'all', a count or device ids (0,1 or [0, 1]), "
                            f"got {gpus!r}")


def _log_and_step(source: str, key: str, step: float) -> SettingsError:
    """A range on a log scale given a step too: the search would drop the step (Optuna's suggest_int and
    suggest_float refuse the two together)."""
    return SettingsError(f"{source}: {key}: a log range takes no step (got log: true and step: {step:g}): "
                         f"give one of them")


def _even_step(low: int, high: int, step: int) -> int:
    """The step nearest `step` that walks from `low` to `high` in whole steps."""
    span = high - low
    return min((d for d in range(1, span + 1) if span % d == 0), key=lambda d: (abs(d - step), -d))


def _check_engine_ranges(s: StudySettings, source: str) -> None:
    """The engine knobs' ranges: the KV cache's share of GPU memory in (0, 1] and not on a CPU, one
    way of sizing the cache, chunked prefill's choices."""
    search = s.search
    r = search.gpu_memory_utilization
    if r is not None:
        if not 0 < r.low <= r.high <= 1:
            raise SettingsError(f"{source}: search.gpu_memory_utilization: 0 < low <= high <= 1 must hold, "
                                f"but got (low={r.low:g}, high={r.high:g})")
        if r.step is not None and r.step <= 0:
            raise SettingsError(f"{source}: search.gpu_memory_utilization.step: must be > 0, got {r.step:g}")
        if r.log and r.step is not None:
            raise _log_and_step(source, "search.gpu_memory_utilization", r.step)
        if s.cost.gpu.lower() == "cpu":
            raise SettingsError(f"{source}: search.gpu_memory_utilization: the server is a CPU (cost.gpu: cpu); "
                                f"size its KV cache with search.kv_cache_gib")
        if search.kv_cache_gib is not None:
            raise SettingsError(f"{source}: search: give either gpu_memory_utilization or kv_cache_gib, not both "
                                f"(vLLM sizes the cache by kv_cache_memory_bytes when it is set)")
    choices = search.enable_chunked_prefill
    if choices is not None and (not choices or len(set(choices)) != len(choices)):
        raise SettingsError(f"{source}: search.enable_chunked_prefill: a list of distinct choices, e.g. "
                            f"[true, false], got {choices}")


def check_generative(s: StudySettings, *, generative: bool) -> None:
    """Hold the study's SLA to its kind: a generative study (a vLLM-backend model, token traffic)
    needs sla.ttft_ms, sla.tpot_ms or sla.e2e_ms, and refuses sla.latency_ms (the encoder's limit) if the
    file wrote it; an encoder study refuses the token limits. SettingsError in one line."""
    source = s.source or "<study>"
    given = [key for key in ("ttft_ms", "tpot_ms", "e2e_ms") if getattr(s.sla, key) is not None]
    if generative and not given:
        raise SettingsError(f"{source}: sla: a generative study (a vLLM-backend model, token traffic) needs "
                            f"sla.ttft_ms, sla.tpot_ms and/or sla.e2e_ms (time to first token, time per output "
                            f"token, end to end, at sla.percentile)")
    if generative and given and not isinstance(s.sla.latency_ms, _Unwritten):
        raise SettingsError(f"{source}: sla.latency_ms: the encoder's limit, not used by a generative study "
                            f"(a vLLM-backend model): limit sla.e2e_ms for the end-to-end time")
    if not generative and given:
        raise SettingsError(f"{source}: sla.{given[0]}: a token limit, for a generative study (a vLLM-backend "
                            f"model); {s.model} is an encoder: limit sla.latency_ms")
