"""Tonight's traffic: the newest N hours of a traffic file or a directory of them.

A directory may mix recorded traffic tables (.csv, .parquet) and Triton trace files (.json); each is
read by `tuner.traffic`, the tables are joined and sorted by time, and the last `hours` before the
newest request are kept. Rows for other models (a `model` column) are left out.

The tables are read as one out-of-core recording (tuner.traffic.recording): the newest request is
found in the Parquet footers, and only the row groups that reach into the last `hours` are read, so a
growing directory of hourly files costs a footer per old file, not a read of it (a CSV is converted to
Parquet once, in the tuner's cache). Trace files are read whole.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from tuner.errors import TrafficError
from tuner.traffic import MODEL, TIMESTAMP, import_triton_trace, validate_traffic
from tuner.traffic.recording import open_recording
from tuner.traffic.scan import read_since

TABLE_SUFFIXES = (".csv", ".parquet", ".pq")
TRACE_SUFFIXES = (".json",)


def traffic_files(path: str | Path, pattern: str = "*") -> list[Path]:
    """The traffic files at `path`: the file itself, or a directory's tables and traces matching `pattern`."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise TrafficError(f"{path}: no such file or directory")
    files = sorted(p for p in path.glob(pattern)
                   if p.is_file() and p.suffix.lower() in TABLE_SUFFIXES + TRACE_SUFFIXES)
    if not files:
        raise TrafficError(f"{path}: no traffic files matching {pattern!r} "
                           f"(expected {', '.join(TABLE_SUFFIXES + TRACE_SUFFIXES)})")
    return files


def joins_tonight(path: str | Path, traffic: str | Path, pattern: str = "*") -> bool:
    """Whether a file written at `path`, there yet or not, would be read as one of the night's traffic
    files (`traffic_files`: a directory's tables and traces matching `pattern`)."""
    path, traffic = Path(os.path.abspath(path)), Path(traffic)
    return (traffic.is_dir() and path.suffix.lower() in TABLE_SUFFIXES + TRACE_SUFFIXES
            and Path(os.path.realpath(path.parent)) == Path(os.path.realpath(traffic)) and path.match(pattern))


def newest_traffic(path: str | Path, hours: float, model: str | None = None,
                   *,
                   pattern: str = "*") -> tuple[pd.DataFrame, list[Path]]:
    """The last `hours` of traffic (by timestamp) and the files it was read from."""
    files = traffic_files(path, pattern)
    # a trace read for the model alone keeps its shape columns (read whole, a trace of several models
    # keeps only the columns every model's requests have); one without its requests adds nothing
    traces = [t for t in (import_triton_trace(f, model=model) for f in files if f.suffix.lower() in TRACE_SUFFIXES)
              if len(t)]
    recorded = [f for f in files if f.suffix.lower() in TABLE_SUFFIXES]
    rec = open_recording(recorded) if recorded else None
    if not traces and rec is None:
        raise TrafficError(f"{path}: no requests for model {model!r} in its trace files")
    newest = max([float(t[TIMESTAMP].iloc[-1]) for t in traces] + ([rec.end] if rec else []))
    tables = traces + ([read_since(rec, newest - hours * 3600.0)] if rec else [])
    tables = [t for t in tables if len(t)]
    table = pd.concat(tables, ignore_index=True) if len(tables) > 1 else tables[0]
    if MODEL in table.columns and model is not None:
        table = table[table[MODEL] == model]
        if table.empty:
            raise TrafficError(f"{path}: no requests for model {model!r} in the '{MODEL}' column")
        table = table.drop(columns=[MODEL])
    # importers of different kinds may disagree on optional columns; a request without a shape
    # column value cannot be replayed
    table = table.dropna(axis=1, how="any") if len(tables) > 1 else table
    table = table.sort_values(TIMESTAMP, kind="stable", ignore_index=True)
    ts = table[TIMESTAMP].to_numpy(dtype=np.float64)
    cutoff = ts[-1] - hours * 3600.0
    table = table[ts >= cutoff].reset_index(drop=True)
    return validate_traffic(table, str(path)), [Path(f) for f in files]
