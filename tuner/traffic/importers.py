"""Other records turned into the traffic table: Triton trace files, the Azure LLM trace, any CSV."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from tuner.errors import TrafficError
from tuner.files import os_reason
from tuner.traffic.io import MODEL, TIMESTAMP, read_raw, validate_traffic

TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
# Where a request arrives, in order of preference: the HTTP endpoint's first byte, then the core's
# request start (gRPC's GRPC_WAITREAD_START includes idle waiting for the message, so it is not used)
TRITON_ARRIVAL = ("HTTP_RECV_START", "REQUEST_START")


def import_azure(path: str | os.PathLike) -> pd.DataFrame:
    """The Azure LLM inference trace (`TIMESTAMP, ContextTokens, GeneratedTokens`): `TIMESTAMP` (UTC)
    becomes `timestamp` (Unix-epoch seconds) and `ContextTokens` the `seq_len` shape column."""
    return import_csv(path, {TIMESTAMP: "TIMESTAMP", "seq_len": "ContextTokens"}, time_unit="s")


def import_csv(
    path: str | os.PathLike, mapping: Mapping[str, str] | None = None, time_unit: str = "s"
) -> pd.DataFrame:
    """Any CSV or Parquet table: `mapping` names, for each column of ours, the file's column.

    Only mapped columns (and unmapped ones already named timestamp, batch_size or model) are kept.
    Numeric times are multiplied by `time_unit` (s, ms, us, ns); text times are read as ISO-8601.
    """
    if time_unit not in TIME_UNITS:
        raise TrafficError(f"time unit {time_unit!r}: expected one of {', '.join(TIME_UNITS)}")
    raw, first_line = read_raw(path)
    mapping = dict(mapping or {})
    mapping.setdefault(TIMESTAMP, TIMESTAMP)
    for ours, theirs in mapping.items():
        if theirs not in raw.columns:
            cols = ", ".join(map(str, raw.columns))
            raise TrafficError(f"{path}: no column {theirs!r} to map to {ours!r} (columns found: {cols})")
    keep = {ours: raw[theirs] for ours, theirs in mapping.items()}
    for col in ("batch_size", MODEL):
        if col not in keep and col in raw.columns:
            keep[col] = raw[col]
    table = pd.DataFrame(keep)
    scale = TIME_UNITS[time_unit]
    if scale != 1.0 and pd.api.types.is_numeric_dtype(table[TIMESTAMP]):
        table[TIMESTAMP] = table[TIMESTAMP].astype(np.float64) * scale
    return validate_traffic(table, str(path), first_line=first_line)


def import_triton_trace(path: str | os.PathLike, include_children: bool = False) -> pd.DataFrame:
    """A Triton trace file (`--trace-config triton,file=F --trace-config level=TIMESTAMPS`).

    One row per traced request, at its arrival (HTTP_RECV_START, else REQUEST_START), with its
    `model`. Times are Triton's steady clock in seconds (not wall-clock). Requests that a parent
    (an ensemble or BLS model) sent are left out unless `include_children`. With `rate` > 1 Triton
    traces only every rate-th request, so the table is a sample. With `log-frequency` N > 0 Triton
    writes F.0, F.1, ...: give F and all the parts are read.
    """
    path = Path(path)
    entries = [entry for part in _trace_parts(path) for entry in _trace_entries(part)]
    frame = pd.DataFrame(entries)
    if "id" not in frame or "model_name" not in frame or "timestamps" not in frame:
        raise TrafficError(f"{path}: not a Triton trace (no id / model_name / timestamps entries)")

    heads = frame.loc[frame["model_name"].notna(), ["id", "model_name"]].copy()
    if "parent_id" in frame and not include_children:
        parents = frame.loc[frame["model_name"].notna(), "parent_id"]
        heads = heads[parents.isna() | (parents == 0)]
    heads = heads.drop_duplicates("id")

    stamps = frame.loc[frame["timestamps"].notna(), ["id", "timestamps"]].explode("timestamps")
    stamps = stamps[stamps["timestamps"].map(lambda s: isinstance(s, dict))]
    names = stamps["timestamps"].str.get("name")
    ns = pd.to_numeric(stamps["timestamps"].str.get("ns"), errors="coerce")
    points = pd.DataFrame({"id": stamps["id"].to_numpy(), "name": names.to_numpy(), "ns": ns.to_numpy()})
    points = points[points["name"].isin(TRITON_ARRIVAL) & points["ns"].notna()]
    # per trace id, the arrival marker of the highest preference present
    points["rank"] = points["name"].map({n: i for i, n in enumerate(TRITON_ARRIVAL)})
    arrival = points.sort_values(["id", "rank"], kind="stable").drop_duplicates("id")
    table = heads.merge(arrival[["id", "ns"]], on="id", how="inner")
    if table.empty:
        raise TrafficError(
            f"{path}: no traced requests with an arrival time ({', '.join(TRITON_ARRIVAL)}); "
            "was the server started with --trace-config level=TIMESTAMPS?"
        )
    ns_int = table["ns"].astype(np.int64).to_numpy()
    seconds = (ns_int // 1_000_000_000).astype(np.float64) + (ns_int % 1_000_000_000) / 1e9
    out = pd.DataFrame({TIMESTAMP: seconds, MODEL: table["model_name"].astype(str).to_numpy()})
    return validate_traffic(out, str(path))


def _trace_parts(path: Path) -> list[Path]:
    """F itself, or the F.0, F.1, ... that Triton writes with log-frequency > 0, in order."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise TrafficError(f"{path}: cannot read ({os_reason(exc)})") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise TrafficError(f"{path}: is a directory, not a Triton trace file")
    if mode is not None:
        return [path]
    parts = (
        [p for p in path.parent.glob(path.name + ".*") if p.suffix[1:].isdigit()]
        if path.parent.is_dir()
        else []
    )
    if not parts:
        raise TrafficError(f"{path}: no such file (nor {path.name}.0, {path.name}.1, ... parts)")
    return sorted(parts, key=lambda p: int(p.suffix[1:]))


def _trace_entries(path: Path) -> list[dict]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise TrafficError(f"{path}: cannot read ({os_reason(exc)})") from None
    except UnicodeDecodeError as exc:
        raise TrafficError(f"{path}: cannot read ({exc})") from None
    if not text.strip():
        raise TrafficError(f"{path}: empty file")
    try:
        entries = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TrafficError(
            f"{path}: not a Triton trace (invalid JSON at line {exc.lineno}: {exc.msg})"
        ) from None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise TrafficError(f"{path}: not a Triton trace (expected a JSON list of objects)")
    return entries
