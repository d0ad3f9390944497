"""Other records turned into the traffic table: Triton trace files, the Azure LLM trace, any CSV."""

from __future__ import annotations

import codecs
import os
import re
from array import array
from collections.abc import Iterator, Mapping
from pathlib import Path

import ijson
import numpy as np
import pandas as pd

from tuner.errors import TrafficError
from tuner.files import open_input, os_reason
from tuner.formats import first_line
from tuner.traffic.io import (
    BATCH_SIZE,
    MODEL,
    OUTPUT_TOKENS,
    PREFIX_ID,
    PROMPT_TOKENS,
    SEQ_LEN,
    TIMESTAMP,
    column_names,
    csv_to_parquet,
    read_raw,
    validate_part,
    validate_traffic,
)

# ours: the Azure trace's. `seq_len` (what encoder studies size their inputs by) is the prompt too.
AZURE_MAPPING = {TIMESTAMP: "TIMESTAMP", SEQ_LEN: "ContextTokens", PROMPT_TOKENS: "ContextTokens",
                 OUTPUT_TOKENS: "GeneratedTokens"}
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
# Where a request arrives, in order of preference: the HTTP endpoint's first byte, then the core's
# request start (gRPC's GRPC_WAITREAD_START includes idle waiting for the message, so it is not used)
TRITON_ARRIVAL = ("HTTP_RECV_START", "REQUEST_START")
# A request's own input tensors, traced at level=TENSORS as the dynamic batcher enqueues it (its shape
# then has the batch dim first; TENSOR_BACKEND_INPUT is the batch the backend got, not the request)
TRITON_INPUT = "TENSOR_QUEUE_INPUT"


def import_azure(path: str | os.PathLike) -> pd.DataFrame:
    """The Azure LLM inference trace (`TIMESTAMP, ContextTokens, GeneratedTokens`): `TIMESTAMP` (UTC)
    becomes `timestamp` (Unix-epoch seconds), `ContextTokens` both `prompt_tokens` and the `seq_len`
    shape column (what an encoder study sizes its inputs by), `GeneratedTokens` `output_tokens`. A row
    whose output length is missing or 0 is refused, naming its line."""
    return import_csv(path, AZURE_MAPPING, time_unit="s")


def import_csv(
    path: str | os.PathLike, mapping: Mapping[str, str] | None = None, time_unit: str = "s"
) -> pd.DataFrame:
    """Any CSV or Parquet table: `mapping` names, for each column of ours, the file's column.

    Only mapped columns (and unmapped ones already named as ours: timestamp, batch_size, model, seq_len,
    prompt_tokens, output_tokens, prefix_id or an `<INPUT>:<k>` shape column) are kept: e.g. `{"prompt_tokens": "input_len", "output_tokens":
    "output_len"}` makes a generative table.
    Numeric times are multiplied by `time_unit` (s, ms, us, ns); text times are read as ISO-8601.
    """
    _check_unit(time_unit)
    raw, line = read_raw(path)
    return validate_traffic(_mapped(raw, path, mapping, time_unit=time_unit), str(path), first_line=line)


def import_csv_to_parquet(path: str | os.PathLike, out: str | os.PathLike, *,
                          mapping: Mapping[str, str] | None = None, time_unit: str = "s") -> int:
    """import_csv of a CSV written straight to a Parquet file, a million rows at a time: the input
    is never held whole. Each chunk is validated and sorted; a file out of time order across chunks
    stays so (its row groups overlap, and every reader sorts them). Returns the rows written."""
    _check_unit(time_unit)
    return csv_to_parquet(path, out, rows=CHUNK_ROWS, table=lambda chunk, line: validate_part(
        _mapped(chunk, path, mapping, time_unit=time_unit), str(path), first_line=line))


CHUNK_ROWS = 1_000_000


def _check_unit(time_unit: str) -> None:
    if time_unit not in TIME_UNITS:
        raise TrafficError(f"time unit {time_unit!r}: expected one of {', '.join(TIME_UNITS)}")


# The columns a mapping may make: what the traffic table and the replay read (a shape column is
# `seq_len`, or `<INPUT>:<k>` for dim k of a model input: tuner/replay/_plan.py)
MAPPABLE = (TIMESTAMP, BATCH_SIZE, MODEL, SEQ_LEN, PROMPT_TOKENS, OUTPUT_TOKENS, PREFIX_ID)
_INPUT_DIM = re.compile(r".+:[0-9]+")
# a traced tensor's dim: at most 15 digits, so it is exact as the float the table is built with
_DIM = re.compile(r" *[0-9]{1,15} *")


def _is_ours(column: object) -> bool:
    """Whether a column name is one of the traffic table's (MAPPABLE, or an `<INPUT>:<k>` shape column)."""
    return isinstance(column, str) and (column in MAPPABLE or _INPUT_DIM.fullmatch(column) is not None)


def _check_mapping(mapping: Mapping[str, str], path) -> None:
    """Refuse a column of ours that nothing reads (a typo would otherwise be dropped, or be taken for
    the missing timestamp)."""
    for ours, theirs in mapping.items():
        if not _is_ours(ours):
            raise TrafficError(f"{path}: cannot map {theirs!r} to {ours!r}: not a column of the traffic table "
                               f"(expected {', '.join(MAPPABLE)}, or <INPUT>:<k> for dim k of a model input)")


def left_out(path: str | os.PathLike, mapping: Mapping[str, str] | None = None) -> list[str]:
    """The columns of a CSV or Parquet file that `import_csv` leaves out with `mapping`: neither mapped
    nor already named as ours (read from the header alone; [] where it cannot be read, which the
    import then says)."""
    try:
        if not Path(path).is_file():  # a FIFO would block the read; a path not there is the import's to name
            return []
        if Path(path).suffix.lower() in (".parquet", ".pq"):
            import pyarrow.parquet as pq

            columns = pq.read_schema(path).names
        else:
            columns = list(pd.read_csv(path, nrows=0).columns)
    except Exception:  # noqa: BLE001 - the import itself names what is wrong with the file
        return []
    used = set((mapping or {}).values())
    return [str(c) for c in columns if c not in used and not _is_ours(c)]


def _mapped(raw: pd.DataFrame, path, mapping: Mapping[str, str] | None, *, time_unit: str) -> pd.DataFrame:
    """Our columns from the file's, by `mapping`, times scaled to seconds (unvalidated)."""
    mapping = dict(mapping or {})
    _check_mapping(mapping, path)
    if TIMESTAMP not in mapping and TIMESTAMP not in raw.columns:
        raise TrafficError(f"{path}: no {TIMESTAMP!r} column: map one of the file's to it "
                           f"(columns found: {column_names(raw)})")
    mapping.setdefault(TIMESTAMP, TIMESTAMP)
    for ours, theirs in mapping.items():
        if theirs not in raw.columns:
            raise TrafficError(f"{path}: no column {theirs!r} to map to {ours!r} "
                               f"(columns found: {column_names(raw)})")
    keep = {ours: raw[theirs] for ours, theirs in mapping.items()}
    # a column the file already names as ours is kept as it is (a shape column too: dropping it would
    # make the replay send default shapes)
    for col in raw.columns:
        if col not in keep and _is_ours(col):
            keep[col] = raw[col]
    table = pd.DataFrame(keep)
    scale = TIME_UNITS[time_unit]
    if scale != 1.0 and pd.api.types.is_numeric_dtype(table[TIMESTAMP]):
        table[TIMESTAMP] = table[TIMESTAMP].astype(np.float64) * scale
    return table


def import_triton_trace(path: str | os.PathLike, include_children: bool = False, *, model: str | None = None,
                        notes: list[str] | None = None) -> pd.DataFrame:
    """A Triton trace file (`--trace-config triton,file=F --trace-config level=TIMESTAMPS`, and
    `--trace-config level=TENSORS` for the sizes).

    One row per traced request, at its arrival (HTTP_RECV_START, else REQUEST_START), with its
    `model`. With level=TENSORS, each request's input tensors as the dynamic batcher enqueued it
    (TENSOR_QUEUE_INPUT, shape e.g. `8,64`) give its `batch_size` (the first dim: only a batching
    model has a dynamic batcher) and a shape column `<INPUT>:<k>` per further dim k (from 0), as the
    replay reads them. A request without traced inputs (timestamps only, or a model without a
    dynamic batcher) gets batch_size 1, and a shape column that not every request has is left out:
    each is said in a line appended to `notes`. Times are Triton's steady clock in seconds (not
    wall-clock). Requests that a parent
    (an ensemble or BLS model) sent are left out unless `include_children`. With `rate` > 1 Triton
    traces only every rate-th request, so the table is a sample. With `log-frequency` N > 0 Triton
    writes F.0, F.1, ...: give F and all the parts are read. An entry whose id, model_name,
    parent_id or arrival time has the wrong type is refused, naming its part and entry. With `model`,
    only that model's requests are kept (their shape columns complete, where a trace of several models
    keeps only the columns every request has): a trace holding none of them gives an empty table, whose
    `attrs["models"]` are the models it holds.

    The JSON is streamed (ijson): what is kept is a few integers per traced request, never the
    file's text nor its entries as Python objects (a trace of millions of requests is gigabytes).
    """
    path = Path(path)
    heads = {"id": array("q"), "model": array("q")}  # each qualifying head, in file order
    stamps = {"id": array("q"), "rank": array("q"), "ns": array("q")}  # each arrival marker, in order
    models: dict[str, int] = {}  # model name -> code
    tensors = {"id": array("q"), "input": array("q"), "dim": array("q"), "size": array("q")}  # each traced dim
    inputs: dict[str, int] = {}  # input name -> code
    seen = set()
    for part in _trace_parts(path):
        for n, entry in enumerate(_trace_entries(part), start=1):
            where = f"{part}: entry {n}"
            seen.update(k for k in ("id", "model_name", "timestamps") if k in entry)
            if entry.get("model_name") is not None:
                trace_id, name, child = _trace_head(entry, where)
                if include_children or not child:
                    code = models.setdefault(name, len(models))
                    if model is None or name == model:
                        heads["id"].append(trace_id)
                        heads["model"].append(code)
            if entry.get("timestamps") is not None:
                trace_id = _trace_int(entry, "id", where)
                for rank, ns in _trace_arrivals(entry, where):
                    stamps["id"].append(trace_id)
                    stamps["rank"].append(rank)
                    stamps["ns"].append(ns)
            if entry.get("activity") == TRITON_INPUT:
                trace_id = _trace_int(entry, "id", where)
                name, dims = _trace_tensor(entry, where)
                code = inputs.setdefault(name, len(inputs))
                for dim, size in enumerate(dims):
                    for key, value in zip(tensors, (trace_id, code, dim, size), strict=True):
                        tensors[key].append(value)
    if len(seen) < 3:
        raise TrafficError(f"{path}: not a Triton trace (no id / model_name / timestamps entries)")
    ids, codes = _first_heads(heads)
    if model is not None and not len(ids):
        empty = pd.DataFrame({TIMESTAMP: np.zeros(0), MODEL: np.array([], dtype=object)})
        empty.attrs["models"] = sorted(models)  # what the trace holds instead, for the refusal to name
        return empty
    ns = _arrival_of(stamps, ids)
    found = ns >= 0
    if not found.any():
        raise TrafficError(
            f"{path}: no traced requests with an arrival time ({', '.join(TRITON_ARRIVAL)}); "
            "was the server started with --trace-config level=TIMESTAMPS?"
        )
    ids, ns, codes = ids[found], ns[found], codes[found]
    # split whole and fractional seconds so the float is rounded once, not twice
    seconds = (ns // 1_000_000_000).astype(np.float64) + (ns % 1_000_000_000) / 1e9
    names = np.array(list(models), dtype=object)
    out = pd.DataFrame({TIMESTAMP: seconds, MODEL: names[codes]})
    sizes = _request_sizes(tensors, ids, inputs=list(inputs), where=path)
    if notes is not None:
        notes.extend(_size_notes(sizes, out[MODEL], path))
    sizes[BATCH_SIZE] = sizes[BATCH_SIZE].fillna(1)  # a request without traced inputs, as the note says
    out = pd.concat([out, sizes.dropna(axis=1).astype(np.int64)], axis=1)
    return validate_traffic(out, str(path))


def _request_sizes(tensors: dict[str, array], ids: np.ndarray, *, inputs: list[str], where) -> pd.DataFrame:
    """Per request (in the order of `ids`): `batch_size` from its traced input tensors' first dim, and
    `<INPUT>:<k>` from dim k+1; NaN where the request has no such tensor (all NaN: no tensors)."""
    table = pd.DataFrame({k: np.frombuffer(v, dtype=np.int64) if v else np.zeros(0, np.int64)
                          for k, v in tensors.items()})
    # an input traced twice for one request (enqueued again): its first
    table = table[table["id"].isin(ids)].drop_duplicates(["id", "input", "dim"])
    row = pd.Index(ids)
    first = table[table["dim"] == 0]
    spread = first.groupby("id")["size"].agg(["min", "max"])
    mixed = spread.index[spread["min"] != spread["max"]]
    if len(mixed):
        bad = first[first["id"] == mixed[0]]
        dims = ", ".join(f"{inputs[i]} {n}" for i, n in zip(bad["input"], bad["size"], strict=True))
        raise TrafficError(f"{where}: request id {mixed[0]}: its input tensors' first dims differ ({dims}), "
                           "not one batch size")
    sizes = pd.DataFrame({BATCH_SIZE: spread["min"].reindex(row).to_numpy(dtype=np.float64)})
    rest = table[table["dim"] > 0]
    for (code, dim), part in rest.groupby(["input", "dim"], sort=True):
        sizes[f"{inputs[code]}:{dim - 1}"] = part.set_index("id")["size"].reindex(row).to_numpy(dtype=np.float64)
    return sizes


def _size_notes(sizes: pd.DataFrame, model: pd.Series, path) -> list[str]:
    """What the trace did not give (its requests' batch sizes or shapes), a line each."""
    missing = sizes[BATCH_SIZE].isna().to_numpy()
    if missing.all():
        return [f"{path}: batch sizes and shapes were not in the trace (no {TRITON_INPUT} entries for its "
                "requests: traced without --trace-config level=TENSORS, or models without a dynamic batcher); "
                "batch_size 1 assumed"]
    notes = []
    if missing.any():
        which = ", ".join(sorted(model[missing].unique()))
        notes.append(f"{path}: {int(missing.sum()):,} of {len(missing):,} requests (model {which}) have no "
                     f"traced input tensors (no {TRITON_INPUT} entries: a model without a dynamic batcher?); "
                     "batch_size 1 assumed for them")
    partial = [c for c in sizes.columns if c != BATCH_SIZE and sizes[c].isna().any()]
    if partial:
        which = f" (models: {', '.join(sorted(model.unique()))}; --model NAME imports one model's requests with " \
                "its shape columns)" if model.nunique() > 1 else ""
        notes.append(f"{path}: shape columns {', '.join(partial)} left out: not every request has the input "
                     f"(a traffic table has one set of shape columns){which}")
    return notes


def _first_heads(heads: dict[str, array]) -> tuple[np.ndarray, np.ndarray]:
    """Each request's first qualifying head, in the order of those heads: (ids, model codes)."""
    ids = np.frombuffer(heads["id"], dtype=np.int64) if heads["id"] else np.zeros(0, np.int64)
    codes = np.frombuffer(heads["model"], dtype=np.int64) if heads["model"] else np.zeros(0, np.int64)
    first = np.sort(np.unique(ids, return_index=True)[1])
    return ids[first], codes[first]


def _arrival_of(stamps: dict[str, array], ids: np.ndarray) -> np.ndarray:
    """Each id's arrival (ns): its most preferred marker, the first of it if repeated; -1 for none."""
    if not stamps["id"]:
        return np.full(len(ids), -1, dtype=np.int64)
    sid, rank, ns = (np.frombuffer(stamps[k], dtype=np.int64) for k in ("id", "rank", "ns"))
    order = np.lexsort((np.arange(len(sid)), rank, sid))  # by id, then preference, then file order
    sid, ns = sid[order], ns[order]
    first = np.r_[True, sid[1:] != sid[:-1]]
    sid, ns = sid[first], ns[first]
    at = np.searchsorted(sid, ids).clip(max=len(sid) - 1)
    return np.where(sid[at] == ids, ns[at], -1)


def _trace_head(entry: dict, where: str) -> tuple[int, str, bool]:
    """A request's head entry: its id, model, and whether a parent (an ensemble or BLS model) sent it."""
    trace_id = _trace_int(entry, "id", where)
    model = entry["model_name"]
    if not isinstance(model, str) or not model.strip():
        raise TrafficError(f"{where}: 'model_name' must be a model's name, got {_short(model)}")
    parent = entry.get("parent_id")
    if parent is not None:
        parent = _trace_int(entry, "parent_id", where)
    return trace_id, model, bool(parent)


def _trace_arrivals(entry: dict, where: str) -> Iterator[tuple[int, int]]:
    """The arrival markers of a timestamps entry (TRITON_ARRIVAL): (preference rank, ns) each."""
    stamps = entry["timestamps"]
    if not isinstance(stamps, list) or not all(isinstance(t, dict) for t in stamps):
        raise TrafficError(f"{where}: 'timestamps' must be a list of {{name, ns}} objects, got {_short(stamps)}")
    for stamp in stamps:
        name = stamp.get("name")
        if not isinstance(name, str) or name not in TRITON_ARRIVAL:
            continue
        ns = stamp.get("ns")
        if isinstance(ns, float) and ns.is_integer():
            ns = int(ns)  # a trace rewritten by a tool that keeps numbers as doubles
        if isinstance(ns, bool) or not isinstance(ns, int) or not 0 <= ns < 2**63:
            raise TrafficError(f"{where}: {name} 'ns' must be a time in nanoseconds (an integer from 0), "
                               f"got {_short(ns)}")
        yield TRITON_ARRIVAL.index(name), ns


def _trace_tensor(entry: dict, where: str) -> tuple[str, list[int]]:
    """A traced input tensor's name and dims (its "shape", e.g. "8,64": the batch dim first)."""
    tensor = entry.get("tensor")
    name = tensor.get("name") if isinstance(tensor, dict) else None
    if not isinstance(name, str) or not name.strip():
        raise TrafficError(f"{where}: {TRITON_INPUT} 'tensor' must be an object with the input's 'name', "
                           f"got {_short(tensor)}")
    shape = tensor.get("shape")
    dims = shape.split(",") if isinstance(shape, str) else []
    if not dims or not all(_DIM.fullmatch(d) and int(d) > 0 for d in dims):
        raise TrafficError(f"{where}: {TRITON_INPUT} {name} 'shape' must be the tensor's dims, positive integers "
                           f"(e.g. '8,64'), got {_short(shape)}")
    return name, [int(d) for d in dims]


def _trace_int(entry: dict, key: str, where: str) -> int:
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TrafficError(f"{where}: {key!r} must be an integer, got {_short(value)}")
    return value


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _trace_parts(path: Path) -> list[Path]:
    """F itself, or the F.0, F.1, ... that Triton writes with log-frequency > 0, in order."""
    try:
        path.stat()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise TrafficError(f"{path}: cannot read ({os_reason(exc)})") from None
    else:
        return [path]
    parts = (
        [p for p in path.parent.glob(path.name + ".*") if p.suffix[1:].isdigit()]
        if path.parent.is_dir()
        else []
    )
    if not parts:
        raise TrafficError(f"{path}: no such file (nor {path.name}.0, {path.name}.1, ... parts)")
    return sorted(parts, key=lambda p: int(p.suffix[1:]))


def _trace_entries(path: Path) -> Iterator[dict]:
    """The entries of one trace file, one at a time, as the file is read (a JSON list of objects)."""
    with open_input(path, what="a Triton trace file", error=TrafficError) as fh:
        # utf-8-sig: a trace saved by an editor that marks UTF-8 with a byte-order mark
        if fh.peek(3)[:3] == codecs.BOM_UTF8:
            fh.read(3)
        events = ijson.parse(fh, use_float=True)
        n, first = 0, None
        try:
            first = next(events)
            if first[1] != "start_array":
                raise TrafficError(f"{path}: not a Triton trace (expected a JSON list of objects)")
            for n, entry in enumerate(ijson.items(_after(first, events), "item"), start=1):
                if not isinstance(entry, dict):
                    raise TrafficError(f"{path}: not a Triton trace (entry {n} is {_short(entry)}, not an object)")
                yield entry
        except ijson.JSONError as exc:
            reason = first_line(exc)
            if first is None and "premature EOF" in reason:  # nothing but white space
                raise TrafficError(f"{path}: empty file") from None
            raise TrafficError(f"{path}: not a Triton trace (invalid JSON in entry {n + 1}: {reason})") from None
        except OSError as exc:
            raise TrafficError(f"{path}: cannot read ({os_reason(exc)})") from None


def _after(first: tuple, events: Iterator[tuple]) -> Iterator[tuple]:
    """The parse events again, the first one (already read) included."""
    yield first
    yield from events
