"""The tuned knobs: the one module that knows them.

Each knob is a `Knob`: its name (the trial parameter, also a `--set` key), where it lives in
config.pbtxt, how a study's `search:` section ranges it, how it is read from and written to a config.
Everything else asks this module: the search draws a trial (`suggest`) or walks the grid (`grid`), a
trial's config is the base config with the drawn values written in (`apply`), the incumbent and a
deployed server's config are read back into values (`from_config`, `deployed`, `value_in`), the
launchers compare what they asked for with what the server runs (`config_fields`), tables head their
columns with `LABELS` and read values back from their cells (`from_row`), a configuration is written
as text one way (`describe`) and two configs compared one way (`config_diff`). Code that needs one
particular knob (a map's axes, the rows a request needs) names it through the constants below
(`MAX_BATCH_SIZE`, ...), never by spelling it: tests/test_knob_names.py checks that. Adding a knob is a
`Knob` here plus its range in `tuner.settings.SearchSettings`.

A knob lives in one file (`Knob.home`): the dynamic batcher's (`KNOBS`) in config.pbtxt, read from and
written to a `ModelConfig`; vLLM's continuous-batching knobs (`ENGINE_KNOBS`: sequences and tokens per
step, chunked prefill, the KV cache's size) in a vLLM-backend model's `model.json`, read from and written
to its engine arguments (a dict; `tuner.llm.engineargs` reads, checks and writes the file, and maps
`kv_cache_gib` to vLLM's `kv_cache_memory_bytes`). A study tunes one kind or the other
(`study_space`): on a vLLM-backend model Triton's dynamic batcher does nothing, vLLM batches. A trial's
values split by file (`split`): `apply` writes the config's, `apply_engine` the engine arguments'.

Values are plain: ints, and for `preferred_batch_size` a strategy name (`none`, `max`,
`powers_of_two`: the sizes follow from the trial's `max_batch_size`) or an explicit tuple of sizes.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuner.errors import ConfigError, SettingsError, TunerError, did_you_mean
from tuner.llm import engineargs
from tuner.modelconfig import ModelConfig, parse, to_text
from tuner.settings import FloatRange, IntRange, SearchSettings

if TYPE_CHECKING:  # an annotation only: `tuner config` imports this module and must start fast
    import optuna

__all__ = [
    "ALL_KNOBS", "CHUNKED_PREFILL", "CONFIG_FILE", "ENGINE_KNOBS", "ENGINE_NAMES", "GPU_MEMORY", "GRID_POINTS",
    "INSTANCES", "KNOBS", "KV_CACHE_GIB", "LABELS", "MAX_BATCH_SIZE", "MAX_SEQS", "MAX_TOKENS", "NAMES",
    "PREFERRED", "QUEUE_DELAY", "QUEUE_SIZE", "STRATEGIES", "Knob", "Params", "apply", "apply_engine",
    "check_choices", "check_tunable", "config_diff", "config_fields", "deployed", "describe", "engine_diff", "fit_to_rows", "from_config",
    "from_row", "grid", "grid_size", "outside", "parse_assignments", "preferred_sizes", "sizes_text", "split",
    "study_space", "suggest", "tuned", "value_in",
]

Value = int | float | bool | str | tuple[int, ...]
Params = dict[str, Value]

STRATEGIES = ("none", "max", "powers_of_two")  # preferred_batch_size as a function of max_batch_size
_INT32_MAX = 2**31 - 1
_UINT64_MAX = 2**64 - 1
CONFIG_FILE = "config.pbtxt"
GRID_POINTS = 5  # a grid's points across a range of numbers given without a step


@dataclass(frozen=True, kw_only=True)
class Knob:
    """One tuned field of config.pbtxt, or one engine argument of a vLLM-backend model's model.json."""

    name: str                          # the trial parameter, a `--set` key, a summary key
    path: str                          # its place in its file (also a `--set` key)
    label: str                         # a table's column heading
    bounds: tuple[float, float]        # what the field accepts
    range_of: Callable[[SearchSettings], IntRange | FloatRange | tuple | None]  # None: not tuned
    # config.pbtxt: a ModelConfig; model.json: the engine arguments, a dict
    read: Callable[[Any], Value | None]  # None: the file does not state it
    write: Callable[[Any, Value], None]  # on a copy, after the knobs before it
    default: Value = 0                 # the server's value where the file does not state it
    sizes: bool = False                # a list of batch sizes (or a strategy naming them), not one integer
    home: str = CONFIG_FILE            # the file it lives in: config.pbtxt or model.json
    kind: type = int                   # the type of its value (int, float, bool; sizes: see `sizes`)


def _batching(config: ModelConfig, field: str):
    """The config's dynamic_batching block, made if absent; refused for another scheduler."""
    other = config.WhichOneof("scheduling_choice")
    if other not in (None, "dynamic_batching"):
        raise ConfigError(f"cannot set {field}: {config.name or 'the model'} uses {other}, not dynamic_batching")
    config.dynamic_batching.SetInParent()
    return config.dynamic_batching


def _write_max_batch_size(config: ModelConfig, value: Value) -> None:
    config.max_batch_size = int(value)
    # Triton refuses a preferred size above the maximum, and its auto-complete writes
    # `preferred_batch_size: [max_batch_size]` into configs: a smaller maximum drops those above it
    # (the preferred_batch_size knob, written after this one, may set them again)
    lists = []
    if config.HasField("dynamic_batching"):
        lists.append(config.dynamic_batching.preferred_batch_size)
    if config.HasField("sequence_batching") and config.sequence_batching.HasField("oldest"):
        lists.append(config.sequence_batching.oldest.preferred_batch_size)
    for sizes in lists:
        keep = [size for size in sizes if size <= config.max_batch_size]
        if len(keep) != len(sizes):
            del sizes[:]
            sizes.extend(keep)


def _write_delay(config: ModelConfig, value: Value) -> None:
    _batching(config, "max_queue_delay_microseconds").max_queue_delay_microseconds = int(value)


def preferred_sizes(strategy: Value, max_batch_size: int) -> tuple[int, ...] | None:
    """The preferred sizes a strategy (or an explicit tuple) means; None leaves the config's."""
    if isinstance(strategy, tuple):
        return strategy
    if strategy == "max":
        return (max_batch_size,)
    if strategy == "powers_of_two":
        sizes, p = [], 1
        while p < max_batch_size:
            sizes.append(p)
            p *= 2
        return (*sizes, max_batch_size)
    return None


def _write_preferred(config: ModelConfig, value: Value) -> None:
    sizes = preferred_sizes(value, int(config.max_batch_size))
    if sizes is None:
        return
    batching = _batching(config, "preferred_batch_size")
    del batching.preferred_batch_size[:]
    batching.preferred_batch_size.extend(sizes)


def _read_preferred(config: ModelConfig) -> Value | None:
    if not config.HasField("dynamic_batching"):
        return None
    return tuple(config.dynamic_batching.preferred_batch_size)


def _write_instances(config: ModelConfig, value: Value) -> None:
    if config.HasField("ensemble_scheduling"):
        raise ConfigError(f"cannot set instance_count: {config.name or 'the model'} is an ensemble "
                          "(no instance groups)")
    if not config.instance_group:
        config.instance_group.add()  # kind left unset: Triton picks it
    for group in config.instance_group:
        group.count = int(value)


def _read_instances(config: ModelConfig) -> Value | None:
    # what `_write_instances` sets: the count of each group (the first one's stands for all)
    return int(config.instance_group[0].count or 1) if config.instance_group else None


def _write_queue_size(config: ModelConfig, value: Value) -> None:
    if not value and not (config.HasField("dynamic_batching")
                          and config.dynamic_batching.HasField("default_queue_policy")):
        return  # 0 (unbounded) is what a config without a queue policy already means: no empty block
    batching = _batching(config, "max_queue_size")
    batching.default_queue_policy.max_queue_size = int(value)


def _read_queue_size(config: ModelConfig) -> Value | None:
    if not config.HasField("dynamic_batching"):
        return None
    return int(config.dynamic_batching.default_queue_policy.max_queue_size)


def _strategies(search: SearchSettings) -> tuple[str, ...] | None:
    """The preferred-size strategies searched: all ("search"), those listed, or none (a fixed one)."""
    chosen = search.preferred_batch_size
    if isinstance(chosen, list):
        return tuple(chosen)
    return STRATEGIES if chosen == "search" else None


# The order is the order of writing: max_batch_size first (the preferred sizes follow from it).
KNOBS: tuple[Knob, ...] = (
    Knob(name="max_batch_size", path="max_batch_size", label="batch", bounds=(0, _INT32_MAX),
         range_of=lambda s: s.max_batch_size, read=lambda c: int(c.max_batch_size), write=_write_max_batch_size),
    Knob(name="max_queue_delay_microseconds", path="dynamic_batching.max_queue_delay_microseconds", label="delay us",
         bounds=(0, _UINT64_MAX), range_of=lambda s: s.max_queue_delay_microseconds,
         read=lambda c: int(c.dynamic_batching.max_queue_delay_microseconds) if c.HasField("dynamic_batching") else None,
         write=_write_delay),
    Knob(name="preferred_batch_size", path="dynamic_batching.preferred_batch_size", label="preferred", bounds=(1, _INT32_MAX),
         range_of=_strategies, read=_read_preferred, write=_write_preferred, sizes=True),
    Knob(name="instance_count", path="instance_group.count", label="instances", bounds=(1, _INT32_MAX),
         range_of=lambda s: s.instance_count, read=_read_instances, write=_write_instances, default=1),
    Knob(name="max_queue_size", path="dynamic_batching.default_queue_policy.max_queue_size", label="queue max",
         bounds=(0, _INT32_MAX), range_of=lambda s: s.max_queue_size, read=_read_queue_size, write=_write_queue_size),
)
NAMES: tuple[str, ...] = tuple(k.name for k in KNOBS)
LABELS: dict[str, str] = {k.name: k.label for k in KNOBS}
_BY_NAME = {k.name: k for k in KNOBS}
# Each knob's name for the code that needs that one knob (a map's axes, the rows a request needs):
# they say which knob, the name itself is spelled only above.
MAX_BATCH_SIZE, QUEUE_DELAY, PREFERRED, INSTANCES, QUEUE_SIZE = NAMES


# --- vLLM's continuous batching: engine arguments in model.json -----------------------------------


def _engine_reader(key: str):
    return lambda args: args.get(key)


def _engine_writer(key: str):
    def write(args: dict, value: Value) -> None:
        args[key] = value
    return write


def _read_cache_gib(args: dict) -> Value | None:
    size = args.get("kv_cache_memory_bytes")
    if size is None:
        return None
    gib = size / engineargs.GIB
    return int(gib) if gib == int(gib) else gib


def _write_cache_gib(args: dict, value: Value) -> None:
    if not value:  # 0: vLLM sizes the cache itself (from gpu_memory_utilization)
        args.pop("kv_cache_memory_bytes", None)
    else:
        args["kv_cache_memory_bytes"] = int(value * engineargs.GIB)


def _engine_knob(key: str, label: str, *, kind: type = int, bounds=(1, _INT32_MAX), **rest) -> Knob:
    rest.setdefault("range_of", lambda s: getattr(s, key))
    return Knob(name=key, path=f"{engineargs.ENGINE_FILE}:{key}", label=label, bounds=bounds,
                home=engineargs.ENGINE_FILE, read=_engine_reader(key), write=_engine_writer(key), kind=kind,
                **rest)


# vLLM's values where model.json leaves a knob out depend on the device: `from_config` takes them
# from the incumbent's resolved engine arguments (`engineargs.resolved`), not from `default`.
ENGINE_KNOBS: tuple[Knob, ...] = (
    _engine_knob("max_num_seqs", "seqs"),
    _engine_knob("max_num_batched_tokens", "batched tokens"),
    _engine_knob("enable_chunked_prefill", "chunked prefill", kind=bool, bounds=(0, 1),
                 range_of=lambda s: tuple(s.enable_chunked_prefill) if s.enable_chunked_prefill else None),
    _engine_knob("gpu_memory_utilization", "gpu memory", kind=float, bounds=(0.0, 1.0)),
    # 0: vLLM's own size (from gpu_memory_utilization); else GiB, written as kv_cache_memory_bytes
    Knob(name="kv_cache_gib", path=f"{engineargs.ENGINE_FILE}:kv_cache_gib", label="kv cache GiB",
         bounds=(0, 1 << 20), range_of=lambda s: s.kv_cache_gib, read=_read_cache_gib, write=_write_cache_gib,
         home=engineargs.ENGINE_FILE),
)
ENGINE_NAMES: tuple[str, ...] = tuple(k.name for k in ENGINE_KNOBS)
MAX_SEQS, MAX_TOKENS, CHUNKED_PREFILL, GPU_MEMORY, KV_CACHE_GIB = ENGINE_NAMES
ALL_KNOBS: tuple[Knob, ...] = KNOBS + ENGINE_KNOBS
LABELS.update({k.name: k.label for k in ENGINE_KNOBS})
_BY_NAME.update({k.name: k for k in ENGINE_KNOBS})
_ORDER: tuple[str, ...] = NAMES + ENGINE_NAMES
_SEARCH_FIELDS = {f.name for f in dataclasses.fields(SearchSettings)}


def tuned(search: SearchSettings) -> tuple[Knob, ...]:
    """The knobs this study searches (those its `search:` section gives a range)."""
    return tuple(k for k in ALL_KNOBS if k.range_of(search) is not None)


def split(params: Params) -> tuple[Params, Params]:
    """A trial's values by the file they live in: (config.pbtxt's, model.json's)."""
    return ({k: v for k, v in params.items() if k not in ENGINE_NAMES},
            {k: v for k, v in params.items() if k in ENGINE_NAMES})


def apply_engine(base: dict, params: Params) -> dict:
    """A copy of the engine arguments `base` (the incumbent's model.json) with the engine knobs named
    in `params` written in, checked as vLLM would (`engineargs.check`: ConfigError in one line)."""
    unknown = sorted(set(params) - set(ENGINE_NAMES))
    if unknown:
        raise ConfigError(f"unknown engine knob {unknown[0]!r} (known: {', '.join(ENGINE_NAMES)})")
    args = dict(base)
    for knob in ENGINE_KNOBS:
        if knob.name in params:
            knob.write(args, params[knob.name])
    engineargs.check(args, source=f"the trial's {engineargs.ENGINE_FILE}")
    return args


def study_space(search: SearchSettings, *, vllm: bool, source: str) -> SearchSettings:
    """The search a study runs on its model: on a vLLM-backend model (`vllm`) the engine knobs only
    (the dynamic batcher's ranges dropped: Triton's dynamic batcher does nothing there, vLLM handles
    the batching), elsewhere the dynamic batcher's. SettingsError in one line for a knob of the
    other kind the study asks for (a range other than the default), or a vLLM study with no engine
    knob to tune."""
    defaults = SearchSettings()
    engine = [k.name for k in ENGINE_KNOBS if k.range_of(search) is not None]
    if not vllm:
        if engine:
            raise SettingsError(f"{source}: search.{engine[0]}: a vLLM engine argument (model.json), but the "
                                f"model is not a vLLM-backend model (config.pbtxt backend \"vllm\", or a Python "
                                f"backend with a model.json): tune the dynamic batcher's knobs")
        _check_bounds(search, source)
        return search
    asked = [k.name for k in KNOBS if getattr(search, k.name) != getattr(defaults, k.name)]
    if asked:
        raise SettingsError(f"{source}: search.{asked[0]}: Triton's dynamic batcher does nothing on a vLLM-backend "
                            f"model (vLLM handles the batching): tune {', '.join(ENGINE_NAMES[:3])} or the KV cache")
    if not engine:
        raise SettingsError(f"{source}: search: the model is a vLLM-backend model: give a range to at least one "
                            f"of {', '.join(ENGINE_NAMES)} (e.g. search.{MAX_SEQS}: {{low: 8, high: 256, log: true}})")
    _check_bounds(search, source)
    # the ranges the settings give by default, dropped (a strategy name of "none" already tunes nothing)
    return dataclasses.replace(search, **{k.name: None for k in KNOBS
                                          if k.name in _SEARCH_FIELDS and not k.sizes and k.range_of(search)})


def _check_bounds(search: SearchSettings, source: str) -> None:
    """Refuse (SettingsError, one line) a range that leaves its knob's own bounds (`Knob.bounds`, what
    `--set` takes): a trial would write a value its file refuses, mid-study."""
    for knob in tuned(search):
        r = knob.range_of(search)
        low, high = knob.bounds
        if isinstance(r, (IntRange, FloatRange)) and not low <= r.low <= r.high <= high:
            raise SettingsError(f"{source}: search.{knob.name}: {knob.path} takes {_text(low)}..{_text(high)}, "
                                f"but the range is {_text(r.low)}..{_text(r.high)}")


# --- drawing a trial, and the grid -----------------------------------------------------------------


def suggest(trial: optuna.trial.BaseTrial, search: SearchSettings) -> Params:
    """The trial's values, drawn from the study's ranges."""
    params: Params = {}
    for knob in tuned(search):
        r = knob.range_of(search)
        if isinstance(r, IntRange):
            params[knob.name] = (trial.suggest_int(knob.name, r.low, r.high, log=True) if r.log
                                 else trial.suggest_int(knob.name, r.low, r.high, step=r.step))
        elif isinstance(r, FloatRange):
            params[knob.name] = trial.suggest_float(knob.name, r.low, r.high, log=r.log,
                                                    step=None if r.log else r.step)
        else:
            params[knob.name] = trial.suggest_categorical(knob.name, list(r))
    return params


def grid(search: SearchSettings) -> dict[str, list]:
    """Every value of each tuned knob: the exhaustive search the others are measured against. A
    log-scale range is walked in powers of two (and its bounds), or with `grid_per_octave` points
    per doubling (2: 1, 2, 3, 4, 6, 8, 11, 16, ...) where the optimum needs a finer look."""

    def numbers(r: FloatRange) -> list[float]:
        if r.step and not r.log:
            return [round(r.low + i * r.step, 10) for i in range(_steps(r))]
        if r.log:
            ratio = (r.high / r.low) ** (1 / (GRID_POINTS - 1))
            return [round(r.low * ratio**i, 10) for i in range(GRID_POINTS)]
        return [round(r.low + (r.high - r.low) * i / (GRID_POINTS - 1), 10) for i in range(GRID_POINTS)]

    out = {}
    for knob in tuned(search):
        r = knob.range_of(search)
        if isinstance(r, IntRange):
            out[knob.name] = _octaves(r, search.grid_per_octave) if r.log else list(range(r.low, r.high + 1, r.step))
        else:
            out[knob.name] = numbers(r) if isinstance(r, FloatRange) else list(r)
    return out


def _octaves(r: IntRange, per_octave: int) -> list[int]:
    """A log-scale range's grid points: `per_octave` per doubling, and its bounds."""
    out, k = {r.low, r.high}, 0
    while (v := round(2 ** (k / per_octave))) <= r.high:
        if v >= r.low:
            out.add(v)
        k += 1
    return sorted(out)


def _steps(r: IntRange | FloatRange) -> int:
    """How many points a range in steps holds, low to high: counted, never listed (a wide range holds
    billions)."""
    if isinstance(r, IntRange):
        return (r.high - r.low) // r.step + 1
    return int(math.floor((r.high - r.low) / r.step + 1e-9)) + 1


def grid_size(search: SearchSettings) -> int:
    """How many configurations the grid holds (counted without listing a range in steps)."""
    def count(r) -> int:
        if isinstance(r, IntRange):
            return len(_octaves(r, search.grid_per_octave)) if r.log else _steps(r)
        if isinstance(r, FloatRange):
            return _steps(r) if r.step and not r.log else GRID_POINTS
        return len(list(r))

    return math.prod(count(k.range_of(search)) for k in tuned(search))


# --- values <-> config.pbtxt -----------------------------------------------------------------------


def apply(base: ModelConfig, params: Params, search: SearchSettings | None = None) -> ModelConfig:
    """A copy of `base` with only the knobs named in `params` changed. Given the study's `search`: a
    preferred-size strategy it fixes without searching it (`search.preferred_batch_size: max`) applies
    to every trial, and `params` that are the base's own values of the tuned knobs (`from_config`: the
    incumbent) give the base unchanged, measured exactly as its config.pbtxt is."""
    engine = sorted(set(params) & set(ENGINE_NAMES))
    if engine:
        raise ConfigError(f"{engine[0]}: a vLLM engine argument: it goes in the model's model.json, not in "
                          f"config.pbtxt")
    unknown = sorted(set(params) - set(NAMES))
    if unknown:
        raise ConfigError(f"unknown tuned field {unknown[0]!r} (known: {', '.join(NAMES)})")
    values = dict(params)
    if search is not None and values == split(from_config(base, search, engine={}))[0]:
        values = {}  # the incumbent: the study's fixed settings are its trials', the baseline is the user's
    elif search is not None and PREFERRED not in values and search.preferred_batch_size in STRATEGIES:
        values[PREFERRED] = search.preferred_batch_size
    new = ModelConfig()
    new.CopyFrom(base)
    for knob in KNOBS:
        if knob.name in values:
            knob.write(new, values[knob.name])
    return new


def from_config(config: ModelConfig, search: SearchSettings, *, engine: dict | None = None) -> Params:
    """The config's own values of the knobs the study tunes (the incumbent trial); the engine knobs'
    from `engine`, the incumbent's engine arguments with vLLM's values where its model.json leaves
    one out (`engineargs.resolved`; `kv_cache_gib` 0: vLLM sizes the cache itself)."""
    params: Params = {}
    for knob in tuned(search):
        if knob.home != CONFIG_FILE:
            if engine is None:
                raise ConfigError(f"{knob.name}: the incumbent's engine arguments (model.json) are needed")
            value = knob.read(engine)
            params[knob.name] = knob.default if value is None else value
            continue
        value = knob.read(config)
        if knob.sizes:  # a strategy is searched: name the config's
            value = "max" if value == (config.max_batch_size,) else (
                "powers_of_two" if value and value == preferred_sizes("powers_of_two", config.max_batch_size)
                else "none")
        elif value is None:  # not stated: Triton's default
            value = knob.default
        params[knob.name] = value
    return params


def value_in(config: ModelConfig, name: str) -> Value:
    """The config's value of one knob, Triton's default where it does not state it (sizes: a tuple,
    empty for none)."""
    knob = _BY_NAME[name]
    value = knob.read(config)
    if value is None:
        return () if knob.sizes else knob.default
    return value


def from_row(row, knobs: Iterable[Knob] = KNOBS) -> Params:
    """The values of `knobs` in a table's row (a simulation's, a trials table's) that has their
    columns: each of its knob's type, and the sizes knob's cell as written (a strategy name or a sizes
    label)."""
    return {k.name: (row[k.name] if k.sizes else _typed(k, row[k.name])) for k in knobs if k.name in row}


def _typed(knob: Knob, cell) -> Value:
    if knob.kind is bool:
        return cell if isinstance(cell, bool) else str(cell).strip().lower() in ("true", "1")
    return float(cell) if knob.kind is float else int(cell)


def sizes_text(sizes) -> str:
    """Preferred sizes as a table's cell: `default` for none (Triton's [max_batch_size]), else `4,8`."""
    return "default" if not sizes else ",".join(str(s) for s in sizes)


def deployed(config: ModelConfig) -> dict:
    """Every knob's value in a running server's config (lists as lists), and whether it batches."""
    out: dict = {}
    for knob in KNOBS:
        value = knob.read(config)
        out[knob.name] = list(value) if isinstance(value, tuple) else value
    groups = config.instance_group
    out[INSTANCES] = sum(int(g.count or 1) for g in groups) if groups else 1  # all groups together
    out["dynamic_batching"] = config.HasField("dynamic_batching")
    return out


def config_fields(config: ModelConfig) -> dict[str, object]:
    """The knobs a config states, by config path, as comparable values (for reading a config back)."""
    out: dict[str, object] = {}
    for knob in KNOBS:
        value = knob.read(config)
        if value is None:
            continue
        if knob.name == INSTANCES:
            value = [g.count for g in config.instance_group]  # per group: 0 asks for Triton's default
        out[knob.path] = list(value) if isinstance(value, tuple) else value
    return out


def describe(params: Params, *, as_set: bool = False, code: bool = False) -> str:
    """A configuration as text, the one way every output writes it: `batch 16, delay us 2000` for a
    line to read; `as_set`: `max_batch_size=16, max_queue_delay_microseconds=2000`, the keys `--set`
    takes (in the knobs' order); `code`: each of those a Markdown code span."""
    if not as_set:
        return ", ".join(f"{LABELS.get(k, k)} {_text(v)}" for k, v in params.items())
    order = sorted(params, key=lambda k: (_ORDER.index(k) if k in _ORDER else len(_ORDER), k))
    items = [f"{k}={_text(v)}" for k, v in ((k, params[k]) for k in order)]
    return ", ".join(f"`{item}`" if code else item for item in items)


def config_diff(old: ModelConfig | str, new: ModelConfig | str, *, old_name: str, new_name: str,
                context: int = 3, as_written: bool = False) -> list[str]:
    """The unified diff from one config.pbtxt to another, line by line (no line ends): the one way
    the outputs compare two configs (the report's incumbent -> recommended, the nightly proposal).
    Both in Triton's canonical print, so the diff shows real changes (a text that does not parse is
    compared as it is); `as_written`: two texts as they are, for a diff `patch` applies to the file
    (the nightly's proposal against production's own file, its comments and layout)."""
    if as_written and isinstance(old, str) and isinstance(new, str):
        before, after = old.splitlines(), new.splitlines()
    else:
        before, after = _canonical(old).splitlines(), _canonical(new).splitlines()
    return list(difflib.unified_diff(before, after, old_name, new_name, lineterm="", n=context))


def engine_diff(old: Mapping[str, object] | str, new: Mapping[str, object] | str, *, old_name: str, new_name: str,
                context: int = 3) -> list[str]:
    """The unified diff from one vLLM model.json (its engine arguments) to another, line by line: the
    one way the outputs compare two (the report's incumbent -> recommended, the nightly proposal). Both
    as `json.dumps(indent=2)` prints them, in their own key order (a text that is not JSON as it is)."""
    def lines(args: Mapping[str, object] | str) -> list[str]:
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                return args.splitlines()
        return json.dumps(args, indent=2).splitlines()

    return list(difflib.unified_diff(lines(old), lines(new), old_name, new_name, lineterm="", n=context))


def _canonical(config: ModelConfig | str) -> str:
    if not isinstance(config, str):
        return to_text(config)
    try:
        return to_text(parse(config))  # comments and layout dropped
    except TunerError:
        return config


def _text(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"  # as model.json and the study YAML write it
    if isinstance(value, float):
        return f"{value:g}"
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


# --- checks before a study starts ------------------------------------------------------------------


def several_instance_groups(config: ModelConfig) -> str | None:
    """What makes `instance_count` (which sets every group's count alike) the wrong knob for `config`,
    as text: its several instance groups and their counts; None for one group or none. The split
    between groups (a group per GPU, CPU beside GPU) is the user's to choose, not a trial's."""
    if len(config.instance_group) < 2:
        return None
    counts = ", ".join(str(g.count or 1) for g in config.instance_group)
    return (f"the config has {len(config.instance_group)} instance groups (counts {counts}), and "
            f"{INSTANCES} would set each to the same count")


def check_tunable(base: ModelConfig, source: str, *, search: SearchSettings | None = None) -> None:
    """Refuse a model the study cannot tune: one that cannot batch (max_batch_size 0), one whose
    scheduler is not the dynamic batcher (sequence batching, an ensemble), or (given the study's
    `search`) one of several instance groups whose instance count the search would set."""
    if base.max_batch_size <= 0 and base.model_transaction_policy.decoupled:  # how a vLLM-backend model looks
        raise ConfigError(f"{source}: max_batch_size is {base.max_batch_size} and the model streams (decoupled), "
                          f"as a vLLM-backend model does, but its version directory holds no model.json (the "
                          f"engine arguments tuner tunes): add one (e.g. {{\"model\": \"...\"}}), or give an "
                          f"encoder max_batch_size >= 1")
    if base.max_batch_size <= 0:
        raise ConfigError(f"{source}: max_batch_size is {base.max_batch_size}: this model does not batch "
                          f"(Triton sends it one request at a time), so there is no dynamic batching to "
                          f"tune; give it max_batch_size >= 1 if its inputs have a batch dimension")
    choice = base.WhichOneof("scheduling_choice")
    if choice not in (None, "dynamic_batching"):
        raise ConfigError(f"{source}: the model uses {choice}, not dynamic_batching: tuner tunes the "
                          f"dynamic batcher's fields only")
    groups = several_instance_groups(base)
    if search is not None and groups and _BY_NAME[INSTANCES].range_of(search) is not None:
        raise ConfigError(f"{source}: search.{INSTANCES}: {groups}: leave {INSTANCES} out of the search, "
                          f"or keep one instance group")


def fit_to_rows(search: SearchSettings, largest_rows: int, *, where: str, source: str) -> tuple[SearchSettings, str]:
    """The space narrowed so that every configuration can take a request of `largest_rows` rows
    (a batch never splits a request), with a line saying so; SettingsError, naming the study file
    `source` as its other errors do, when none can."""
    r = search.max_batch_size
    if largest_rows <= r.low:
        return search, ""
    if largest_rows > r.high:
        raise SettingsError(f"{source}: search.max_batch_size: the traffic has a request of {largest_rows} rows "
                            f"({where}), above every max_batch_size the search may try (high={r.high}): "
                            f"raise search.max_batch_size.high to at least {largest_rows}")
    # the first of the user's points that takes the request: the search keeps to their steps
    low = r.low + -(-(largest_rows - r.low) // r.step) * r.step
    narrowed = dataclasses.replace(search, max_batch_size=dataclasses.replace(r, low=low))
    return narrowed, (f"search.max_batch_size: low raised from {r.low} to {low}: the traffic has "
                      f"requests of {largest_rows} rows ({where}), which a smaller max_batch_size refuses")


def check_choices(params: Params, search: SearchSettings, *, whose: str) -> None:
    """Refuse (SettingsError) a configuration measured as a trial of the study (the incumbent, production's)
    whose value of a knob of choices is not one of them: a trial takes one of its knob's choices (Optuna's
    categorical distributions have no value outside them), where a number outside a range is measured
    with a note (`outside`)."""
    for knob in tuned(search):
        r = knob.range_of(search)
        if isinstance(r, (IntRange, FloatRange)) or knob.name not in params:
            continue
        value = params[knob.name]
        if value not in list(r):
            raise SettingsError(f"search.{knob.name}: {whose} {knob.name} is {_spelled(value)}, not one of the "
                                f"choices [{', '.join(map(_spelled, r))}]: it is measured as a trial of the study, "
                                f"which takes one of them; add {_spelled(value)} to search.{knob.name}")


def _spelled(value) -> str:
    """A choice as a study file spells it (YAML's `true`, not Python's `True`)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def outside(params: Params, search: SearchSettings) -> list[str]:
    """The values of `params` (say the incumbent's) that lie outside the study's ranges, as text."""
    out = []
    for knob in tuned(search):
        r, value = knob.range_of(search), params.get(knob.name)
        if isinstance(r, (IntRange, FloatRange)) and isinstance(value, (int, float)) and not isinstance(value, bool) \
                and not r.low <= value <= r.high:
            out.append(f"{knob.name} {value} (search.{knob.name}: {r.low}..{r.high})")
    return out


# --- `--set KEY=VALUE` -----------------------------------------------------------------------------


def parse_assignments(assignments: Iterable[str]) -> Params:
    """`["max_batch_size=8", "preferred_batch_size=4,8", ...]` (from `--set`) as values; the keys are
    the knobs' names or their config.pbtxt paths."""
    keys = {key: knob for knob in ALL_KNOBS for key in (knob.name, knob.path)}
    values: Params = {}
    for item in assignments:
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. max_batch_size=8")
        knob = keys.get(key)
        if knob is None:
            hint = did_you_mean(key, keys)
            raise ConfigError(f"--set {item!r}: unknown key {key!r}; {hint + ' ' if hint else ''}known keys: "
                              f"{', '.join(keys)}")
        if knob.name in values:
            raise ConfigError(f"--set {item!r}: {knob.name} is set more than once")
        low, high = knob.bounds
        if knob.sizes:
            parts = [p.strip() for p in raw.split(",") if p.strip()]
            if not parts:
                raise ConfigError(f"--set {item!r}: expected a comma list of batch sizes, e.g. 4,8")
            values[knob.name] = tuple(_int_in_range(item, p, low, high=high) for p in parts)
        elif knob.kind is bool:
            if raw.lower() not in ("true", "false"):
                raise ConfigError(f"--set {item!r}: expected true or false, got {raw!r}")
            values[knob.name] = raw.lower() == "true"
        elif knob.kind is float:
            values[knob.name] = _float_in_range(item, raw, low, high=high)
        else:
            values[knob.name] = _int_in_range(item, raw, low, high=high)
    return {k.name: values[k.name] for k in ALL_KNOBS if k.name in values}


def _float_in_range(item: str, raw: str, low: float, *, high: float) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"--set {item!r}: {raw!r} is not a number") from None
    if not (math.isfinite(value) and low < value <= high):
        raise ConfigError(f"--set {item!r}: {low:g} < value <= {high:g} must hold, but got {raw}")
    return value


def _int_in_range(item: str, raw: str, low: int, *, high: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"--set {item!r}: {raw!r} is not an integer") from None
    if not low <= value <= high:
        raise ConfigError(f"--set {item!r}: {low} <= value <= {high} must hold, but got {value}")
    return value
