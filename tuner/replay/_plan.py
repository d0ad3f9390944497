"""What to send: the model's inputs (from its metadata and config), each traffic row's tensor shapes,
and the schedule of due times. Parent-side and unpatched: no gevent here.

Shape mapping rule (documented in the README and `tuner replay --help`):
- a model with `max_batch_size > 0` gets each row's `batch_size` (default 1) as the first dim; a model
  without batching takes only rows with `batch_size` 1;
- a column named `<INPUT>:<k>` (e.g. `INPUT_IDS:0`) gives dim k (counted after the batch dim) of that
  input;
- otherwise a column `seq_len` gives every variable (-1) dim of every input;
- an optional input is sent only when the traffic has an `<INPUT>:<k>` column for it;
- a variable dim with neither column, a shape value that is not a positive integer, a column that
  contradicts a fixed dim, a batch larger than `max_batch_size`, or a request carrying more than
  MAX_REQUEST_BYTES of tensor data make the traffic unfit (TrafficError, naming the row); so do an
  `<INPUT>:<k>` column that names no input or no dim of it (a typo must not send default shapes),
  and a model left with no input to send (every input optional, none with a column).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tuner.errors import ServerSetupError, TrafficError, did_you_mean, traffic_row
from tuner.replay._http import ITEMSIZE

SEQ_LEN = "seq_len"  # tuner.traffic.SEQ_LEN: not imported, as tuner.traffic's package loads its importers and plots
# Datatypes the replay can make data for (Triton's names).
SUPPORTED = set(ITEMSIZE)
# The most tensor data one request may carry: Triton's own default limit on an HTTP request's input
# (--http-max-input-size, 64 MiB). A row above it is a shape no deployment takes, e.g. a seq_len of
# 1e12 (the load generator would try to allocate terabytes); the replay refuses it up front.
MAX_REQUEST_BYTES = 64 << 20


@dataclass(frozen=True)
class InputPlan:
    """One model input as the replay sends it: name, datatype, dims and the traffic column of each dim."""

    name: str
    datatype: str
    dims: tuple[int, ...]  # without the batch dim; -1 = variable
    columns: tuple[str | None, ...]  # per dim: the traffic column that gives it, or None (fixed)


@dataclass(frozen=True, kw_only=True)
class RequestPlan:
    """The tensors of every request: `shapes[shape_ids[i]]` gives row i's shape for each input."""

    model: str
    batched: bool
    max_batch_size: int
    inputs: tuple[InputPlan, ...]
    outputs: tuple[str, ...]
    shapes: list[list[list[int]]]  # shape id -> one shape per input
    shape_ids: np.ndarray

    def to_json(self) -> dict:
        """The plan as the load generator's spec reads it: model, inputs, outputs and shapes."""
        return {
            "model": self.model,
            "inputs": [{"name": i.name, "datatype": i.datatype} for i in self.inputs],
            "outputs": list(self.outputs),
            "shapes": self.shapes,
        }


def _get_json(base: str, path: str, timeout_s: float = 10.0) -> dict:
    """GET http://BASE/PATH as JSON; an unreachable server or an error status is a ServerSetupError."""
    url = f"http://{base}/{path}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read()).get("error", "")
        except Exception:
            detail = ""
        raise ServerSetupError(f"{url}: HTTP {exc.code}{': ' + detail if detail else ''}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ServerSetupError(f"cannot reach Triton at {base}: {reason}") from None


def model_info(http: str, model: str) -> tuple[dict, dict]:
    """The model's metadata and config from the server; a clear error when it is not loaded."""
    try:
        ready = urllib.request.urlopen(f"http://{http}/v2/models/{model}/ready", timeout=10).status
    except urllib.error.HTTPError:
        ready = 0
    except (urllib.error.URLError, OSError) as exc:
        raise ServerSetupError(f"cannot reach Triton at {http}: {getattr(exc, 'reason', exc)}") from None
    if ready != 200:
        raise ServerSetupError(f"model '{model}' is not loaded (not ready) on the Triton at {http}")
    return _get_json(http, f"v2/models/{model}"), _get_json(http, f"v2/models/{model}/config")


def statistics(http: str, model: str) -> dict:
    """The model's entry of `v2/models/<model>/stats` (cumulative since the model was loaded)."""
    stats = _get_json(http, f"v2/models/{model}/stats").get("model_stats", [])
    if not stats:
        raise ServerSetupError(f"Triton at {http} has no statistics for model '{model}'")
    return stats[0]


def plan_requests(metadata: dict, config: dict, traffic: pd.DataFrame, *, drop_oversize: bool = False) -> RequestPlan:
    """The tensors of every traffic row for this model (see the module doc); TrafficError if unfit.
    `drop_oversize`: rows whose request would pass MAX_REQUEST_BYTES are left out instead of refused
    (a warm-up's synthetic rows, up to max_batch_size rows of the traffic's longest shapes, which the
    traffic itself, checked as it is, never sends)."""
    model = metadata.get("name") or config.get("name", "?")
    max_batch = int(config.get("max_batch_size", 0))
    batched = max_batch > 0
    n = len(traffic)
    if "batch_size" in traffic.columns:
        batch = _positive_ints(traffic["batch_size"], "batch_size", traffic)
    else:
        batch = np.ones(n)
    if n:
        worst = int(np.argmax(batch))
        biggest = int(batch[worst])
        if not batched and biggest != 1:
            raise TrafficError(f"{traffic_row(traffic, worst)}: batch_size {biggest} but model "
                               f"'{model}' does not batch (max_batch_size 0)")
        if batched and biggest > max_batch:
            raise TrafficError(f"{traffic_row(traffic, worst)}: batch_size {biggest} exceeds "
                               f"model '{model}' max_batch_size {max_batch}")

    inputs = [plan for plan, sent in _input_plans(model, config, traffic.columns) if sent]
    dim_values: list[np.ndarray] = [batch] if batched else []
    for plan in inputs:
        for k, (d, column) in enumerate(zip(plan.dims, plan.columns, strict=True)):
            if column is None:
                dim_values.append(np.full(n, float(d)))
                continue
            values = _positive_ints(traffic[column], column, traffic)
            if d != -1 and n and (values != d).any():
                bad = int(np.argmax(values != d))
                raise TrafficError(f"{traffic_row(traffic, bad)}: {column}={int(values[bad])} but "
                                   f"model '{model}' input {plan.name} dim {k} is fixed at {d}")
            dim_values.append(values)
    outputs = tuple(o["name"] for o in config.get("output", []))

    if drop_oversize and n:
        fits = _request_bytes(batched, inputs, dim_values=dim_values, n=n) <= MAX_REQUEST_BYTES
        if fits.any() and not fits.all():
            return plan_requests(metadata, config, traffic[fits])
    _check_request_sizes(model, batched, inputs, dim_values=dim_values, traffic=traffic)

    # One id per distinct combination of all dims, so requests are made once per shape, not per request.
    table = np.stack(dim_values, axis=1).astype(np.int64) if dim_values else np.zeros((n, 0), dtype=np.int64)
    unique, shape_ids = np.unique(table, axis=0, return_inverse=True) if n else (table, np.zeros(0, int))
    shapes = []
    for row in unique.tolist():
        pos = 1 if batched else 0
        per_input = []
        for plan in inputs:
            dims = row[pos:pos + len(plan.dims)]
            pos += len(plan.dims)
            per_input.append(([row[0]] if batched else []) + dims)
        shapes.append(per_input)
    return RequestPlan(model=model, batched=batched, max_batch_size=max_batch, inputs=tuple(inputs), outputs=outputs, shapes=shapes,
                       shape_ids=np.asarray(shape_ids, dtype=np.int64).reshape(-1))


def describe_inputs(config: dict, traffic: pd.DataFrame) -> list[str]:
    """One short line per model input of `config` (as Triton reports it or `modelconfig.to_json` writes
    it; errors name the model by its `name`) saying what a replay of `traffic` sends: the datatype, the
    shape with the traffic column that sizes each dim (a batching model's first dim is `batch_size`, or
    `batch 1` without that column), and whether it is sent, e.g.
    `IDS: INT64 [batch_size, -1 from seq_len, 4], sent`. TrafficError where the replay would refuse the
    traffic's columns for the model (see the module doc); the rows are checked by `plan_requests`."""
    model = config.get("name") or "?"
    batched = int(config.get("max_batch_size", 0)) > 0
    batch = ["batch_size" if "batch_size" in traffic.columns else "batch 1"] if batched else []
    lines = []
    for plan, sent in _input_plans(model, config, traffic.columns):
        dims = [str(d) if column is None else f"{d} from {column}"
                for d, column in zip(plan.dims, plan.columns, strict=True)]
        how = "sent" if sent else f"optional, not sent (no {plan.name}:<k> column)"
        lines.append(f"{plan.name}: {plan.datatype} [{', '.join(batch + dims)}], {how}")
    return lines


def ignored_columns(config: dict, columns: pd.Index) -> list[str]:
    """The traffic's shape columns that size nothing the replay sends to the model of `config` (`seq_len`
    where no sent input has a variable dim it sizes): their values change no request. TrafficError as
    `describe_inputs` for columns the replay refuses."""
    if SEQ_LEN not in columns:
        return []
    plans = _input_plans(config.get("name") or "?", config, columns)
    return [] if any(SEQ_LEN in plan.columns for plan, sent in plans if sent) else [SEQ_LEN]


def _input_plans(model: str, config: dict, columns: pd.Index) -> list[tuple[InputPlan, bool]]:
    """Each input of `config` as the replay would send it, with whether it is sent (an optional one only
    with an `<INPUT>:<k>` column), from the traffic's `columns`; TrafficError for a shape column no
    input takes, an input the replay cannot make, a variable dim no column sizes, or nothing to send."""
    specs = config.get("input", [])
    used = _check_shape_columns(model, specs, columns)
    plans = []
    for spec in specs:
        name = spec["name"]
        # config.pbtxt names TYPE_STRING what a request calls BYTES; an unset one is refused by validate
        datatype = spec.get("data_type", "TYPE_INVALID").removeprefix("TYPE_")
        datatype = {"STRING": "BYTES"}.get(datatype, datatype)
        dims = tuple(int(d) for d in spec.get("dims", []))
        sent = not spec.get("optional") or name in used  # Triton takes a request without an optional input
        if not sent:
            plans.append((InputPlan(name, datatype, dims, (None,) * len(dims)), False))
            continue
        if datatype not in SUPPORTED:
            raise TrafficError(f"model '{model}' input {name}: datatype {datatype} is not supported "
                               f"by the replay")
        if spec.get("is_shape_tensor"):
            raise TrafficError(f"model '{model}' input {name}: shape tensors are not supported by the replay")
        dim_columns: list[str | None] = []
        for k, d in enumerate(dims):
            own = f"{name}:{k}"
            column = own if own in columns else (SEQ_LEN if d == -1 and SEQ_LEN in columns else None)
            if d == -1 and column is None:
                raise TrafficError(f"model '{model}' input {name} has a variable dim {k} and the traffic "
                                   f"has no '{SEQ_LEN}' or '{own}' column to size it")
            dim_columns.append(column)
        plans.append((InputPlan(name, datatype, dims, tuple(dim_columns)), True))
    if specs and not any(sent for _, sent in plans):  # Triton fails a request of no input
        names = ", ".join(spec["name"] for spec in specs)
        raise TrafficError(f"model '{model}': every input is optional ({names}) and the traffic has no "
                           f"<INPUT>:<k> column for any, so a request would carry no input; add one such as "
                           f"'{specs[0]['name']}:0' to send that input")
    return plans


def _check_shape_columns(model: str, specs: list[dict], columns: pd.Index) -> set[str]:
    """The inputs the traffic's `<INPUT>:<k>` columns (any column with a ':') size; TrafficError naming
    the first that names no input or no dim of it (k counts the input's dims after the batch dim)."""
    dims = {spec["name"]: len(spec.get("dims", [])) for spec in specs}
    used = set()
    for column in map(str, columns):
        name, colon, k = column.rpartition(":")
        if not colon:
            continue
        if name not in dims:
            hint = did_you_mean(name, dims) or f"its inputs: {', '.join(dims) or 'none'}"
            raise TrafficError(f"traffic column '{column}': model '{model}' has no input {name!r} ({hint}); an "
                               f"<INPUT>:<k> column gives dim k of that input")
        if not (k.isdigit() and str(int(k)) == k and int(k) < dims[name]):
            raise TrafficError(f"traffic column '{column}': model '{model}' input {name} has no dim {k!r} "
                               f"(its dims after the batch dim: {', '.join(map(str, range(dims[name])))}); an "
                               f"<INPUT>:<k> column gives dim k of that input")
        used.add(name)
    return used


def peak_rate(due_s: np.ndarray, window_s: float = 1.0) -> float:
    """The most requests due in any `window_s` seconds, per second (the offered peak)."""
    if len(due_s) == 0:
        return 0.0
    ends = np.searchsorted(due_s, due_s + window_s, side="left")
    return float((ends - np.arange(len(due_s))).max()) / window_s


def _check_request_sizes(model: str, batched: bool, inputs: list[InputPlan], *, dim_values: list[np.ndarray],
                         traffic: pd.DataFrame) -> None:
    """Refuse the first row whose tensors add up to more than MAX_REQUEST_BYTES (sizes in floats: a
    product of huge dims must not wrap around)."""
    total = _request_bytes(batched, inputs, dim_values=dim_values, n=len(traffic))
    shapes = _input_dims(batched, inputs, dim_values)
    over = total > MAX_REQUEST_BYTES
    if not over.any():
        return
    i = int(np.argmax(over))
    described = ", ".join(f"{plan.name} {[int(d[i]) for d in dims]} {plan.datatype}"
                          for plan, dims in zip(inputs, shapes, strict=True))
    raise TrafficError(f"{traffic_row(traffic, i)}: its request would carry "
                       f"{_bytes(total[i])} of tensor data ({described}), above the replay's limit of "
                       f"{_bytes(MAX_REQUEST_BYTES)} per request for model '{model}'")


def _input_dims(batched: bool, inputs: list[InputPlan], dim_values: list[np.ndarray]) -> list[list[np.ndarray]]:
    """Each input's dims, one array of values per dim (the batch dim first where the model batches)."""
    pos, out = 1 if batched else 0, []
    for plan in inputs:
        out.append(([dim_values[0]] if batched else []) + dim_values[pos:pos + len(plan.dims)])
        pos += len(plan.dims)
    return out


def _request_bytes(batched: bool, inputs: list[InputPlan], *, dim_values: list[np.ndarray], n: int) -> np.ndarray:
    """Each row's tensor bytes, all inputs together (in floats: a product of huge dims must not wrap)."""
    total = np.zeros(n)
    for plan, dims in zip(inputs, _input_dims(batched, inputs, dim_values), strict=True):
        total += np.prod(np.stack(dims), axis=0) * ITEMSIZE[plan.datatype] if dims else ITEMSIZE[plan.datatype]
    return total


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _positive_ints(column: pd.Series, name: str, traffic: pd.DataFrame) -> np.ndarray:
    """The column as floats holding positive integers (floats: sizes are checked before any cast)."""
    values = pd.to_numeric(column, errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(values) | (values < 1) | (values != np.round(values))
    if bad.any():
        i = int(np.argmax(bad))
        raise TrafficError(f"{traffic_row(traffic, i)}: {name}={column.iloc[i]} is not a "
                           f"positive integer")
    return values
