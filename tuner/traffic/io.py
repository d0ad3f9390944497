"""The traffic table on disk: read, validate and write CSV and Parquet.

One row per request: `timestamp` (float64 seconds; ISO-8601 or datetime input becomes seconds since
the Unix epoch, naive times taken as UTC), `batch_size` (int64, 1 when absent), shape columns such as
`seq_len` (int64), and an optional `model` (str). A *generative* table (requests to an LLM) also has
`prompt_tokens` and `output_tokens` (int64 >= 1: the prompt's length and the tokens to generate) and
may have `prefix_id` (str: requests sharing one share their prompt's beginning, for prefix caching). Every check is vectorised and the first bad row is
named with its file, row and column, so a 10-million-row file fails in one clear line. A CSV is
UTF-8, with or without the byte-order mark Excel writes; each cell holds one value (a Parquet list or
struct column is refused).
"""

from __future__ import annotations

import codecs
import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pandas as pd

from tuner import files
from tuner.errors import TrafficError
from tuner.formats import first_line

TIMESTAMP = "timestamp"
BATCH_SIZE = "batch_size"
MODEL = "model"
SEQ_LEN = "seq_len"  # sizes every variable dim that has no <INPUT>:<k> column of its own
PROMPT_TOKENS = "prompt_tokens"
OUTPUT_TOKENS = "output_tokens"
PREFIX_ID = "prefix_id"
TOKEN_COLUMNS = (PROMPT_TOKENS, OUTPUT_TOKENS)
RESERVED = (TIMESTAMP, BATCH_SIZE, MODEL, PREFIX_ID)
CSV_SUFFIXES = (".csv",)
PARQUET_SUFFIXES = (".parquet", ".pq")
_PANDAS_MAJOR = int(pd.__version__.split(".")[0])
_BLANKS = " \t\ufeff"


def shape_columns(df: pd.DataFrame) -> list[str]:
    """The per-request size columns (e.g. `seq_len`, `prompt_tokens`): every column but timestamp,
    batch_size, model and prefix_id."""
    return [c for c in df.columns if c not in RESERVED]


def is_generative(df: pd.DataFrame) -> bool:
    """Whether the table holds generative requests: both `prompt_tokens` and `output_tokens`."""
    return all(c in df.columns for c in TOKEN_COLUMNS)


def fit_context(df: pd.DataFrame, context: int) -> pd.DataFrame:
    """The generative requests of `df` whose prompt and output tokens together fit a model's context of
    `context` tokens (a trace recorded on a larger model, replayed on a smaller one); TrafficError in
    one line when the table has no token columns or nothing fits."""
    if not is_generative(df):
        raise TrafficError(f"no {' and '.join(TOKEN_COLUMNS)} columns: only a generative trace has tokens to fit")
    if context < 1:
        raise TrafficError(f"context {context}: must be at least 1 token")
    fits = (df[PROMPT_TOKENS] + df[OUTPUT_TOKENS]).to_numpy() <= context
    if not fits.any():
        raise TrafficError(f"none of the {len(df):,} requests fits a context of {context:,} tokens")
    return df[fits].reset_index(drop=True)


def _kind(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in CSV_SUFFIXES:
        return "csv"
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    raise TrafficError(
        f"{path}: unknown traffic file type {suffix or '(no suffix)'!r} (expected .csv or .parquet)"
    )


def read_raw(path: str | os.PathLike) -> tuple[pd.DataFrame, int | None]:
    """The file as pandas reads it, unvalidated, and the file line of data row 0 (None for Parquet)."""
    path = Path(path)
    with files.open_input(path, what="a traffic file", error=TrafficError) as fh:
        kind = _kind(path)
        if os.fstat(fh.fileno()).st_size == 0:
            raise TrafficError(f"{path}: empty file")
        if kind == "parquet":
            return _read_parquet(fh, path), None
        return _read_csv(fh, path), 2


def _read_parquet(fh: BinaryIO, path: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(fh)
    except Exception as exc:  # pyarrow raises several unrelated types for a damaged file
        raise TrafficError(f"{path}: not a readable Parquet file ({first_line(exc)})") from None


def _read_csv(fh: BinaryIO, path: Path) -> pd.DataFrame:
    """A CSV in UTF-8, with or without the byte-order mark that Excel's "CSV UTF-8" writes."""
    _refuse_utf16(fh, path)
    with _csv_errors(path):
        table = pd.read_csv(fh, **_CSV_OPTIONS)
    return _stripped(table)


def _iter_csv(path: str | os.PathLike, rows: int) -> Iterator[tuple[pd.DataFrame, int]]:
    """A CSV traffic file `rows` rows at a time, unvalidated, each with the file line of its first
    row: read as read_raw reads it, without ever holding the whole file."""
    path = Path(path)
    with files.open_input(path, what="a traffic file", error=TrafficError) as fh:
        if os.fstat(fh.fileno()).st_size == 0:
            raise TrafficError(f"{path}: empty file")
        _refuse_utf16(fh, path)
        line = 2
        with _csv_errors(path):  # a chunk's parse error surfaces as it is read, not at the first call
            for chunk in pd.read_csv(fh, chunksize=rows, **_CSV_OPTIONS):
                yield _stripped(chunk), line
                line += len(chunk)


# How every CSV traffic file is read, whole or a chunk at a time. A float written by write_traffic
# must read back bit for bit: pandas 3 does so by default, pandas 2 only with round_trip.
_CSV_OPTIONS = {"encoding": "utf-8-sig", "skipinitialspace": True,
                **({"float_precision": "round_trip"} if _PANDAS_MAJOR < 3 else {})}


def _refuse_utf16(fh: BinaryIO, path: Path) -> None:
    if fh.peek(2)[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):
        raise TrafficError(f"{path}: not a readable CSV table (UTF-16 text; save it as UTF-8 CSV)")


@contextlib.contextmanager
def _csv_errors(path: Path) -> Iterator[None]:
    """pandas' failures to read a CSV, each as one line naming the file; a Ctrl-C (or SIGTERM) in the
    middle of the read stays the interrupt (exit 130), not a complaint about the file."""
    with _interrupts_noted() as interrupts:
        try:
            yield
        except (pd.errors.EmptyDataError, OSError, pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
            # pandas' C parser can turn a Ctrl-C that lands in its read into "Calling read(nbytes) on
            # source failed", with nothing behind it: the interrupt noted as it came is raised instead
            if interrupts:
                raise interrupts[0] from None
            if isinstance(exc, pd.errors.EmptyDataError):
                raise TrafficError(f"{path}: empty file (no header, no rows)") from None
            if isinstance(exc, OSError):
                raise TrafficError(f"{path}: cannot read ({files.os_reason(exc)})") from None
            raise TrafficError(f"{path}: not a readable CSV table ({first_line(exc)})") from None


@contextlib.contextmanager
def _interrupts_noted() -> Iterator[list[BaseException]]:
    """Within the block, every interrupt SIGINT or SIGTERM raises (through the handler in place:
    KeyboardInterrupt, tuner.errors.Terminated) is also noted in the list yielded. Main thread only
    (elsewhere the list stays empty); a signal whose handler is not Python's is left alone."""
    noted: list[BaseException] = []
    if threading.current_thread() is not threading.main_thread():
        yield noted
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def note(signum, frame):
        try:
            previous[signum](signum, frame)
        except BaseException as exc:
            noted.append(exc)
            raise

    for sig, handler in previous.items():
        if callable(handler):
            signal.signal(sig, note)
    try:
        yield noted
    finally:
        for sig, handler in previous.items():
            if callable(handler):
                signal.signal(sig, handler)


def _stripped(table: pd.DataFrame) -> pd.DataFrame:
    # a header's spaces and stray byte-order marks (a file marked twice) are no part of its names
    table.columns = [c.strip(_BLANKS) if isinstance(c, str) else c for c in table.columns]
    return table


def read_traffic(path: str | os.PathLike) -> pd.DataFrame:
    """Load and validate a traffic file (.csv or .parquet); sorted by timestamp (stable)."""
    raw, line = read_raw(path)
    return validate_traffic(raw, str(path), first_line=line)


def csv_to_parquet(path: str | os.PathLike, target: str | os.PathLike, *, rows: int,
                   table: Callable[[pd.DataFrame, int], pd.DataFrame],
                   on_rows: Callable[[int], None] | None = None) -> int:
    """The CSV traffic file `path` written as Parquet at `target`, `rows` rows at a time, whole or not
    at all: the input is never held whole. `table(chunk, line)` makes each chunk (its first row on
    file line `line`) a validated traffic table; `on_rows(written)` after each. Returns the rows
    written. A file out of time order across chunks stays so (its row groups overlap; every reader
    sorts them)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    written, writer = 0, None
    with replacing(target) as tmp:
        try:
            for chunk, line in _iter_csv(path, rows):
                if len(chunk) == 0:
                    continue
                arrow = pa.Table.from_pandas(table(chunk, line), preserve_index=False)
                if writer is None:
                    writer = pq.ParquetWriter(tmp, arrow.schema)
                elif arrow.schema != writer.schema:
                    try:
                        arrow = arrow.cast(writer.schema)
                    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError, TypeError):
                        raise TrafficError(f"{path}: line {line}: the columns change type from the rows "
                                           "before (one type per column)") from None
                writer.write_table(arrow)
                written += len(arrow)
                if on_rows is not None:
                    on_rows(written)
            if writer is None:
                raise TrafficError(f"{path}: no requests (a header but no rows)")
        finally:
            if writer is not None:
                writer.close()
    return written


def write_traffic(df: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write a traffic table as CSV or Parquet, chosen by the suffix; returns the path.

    The file appears whole or not at all (written beside it, then renamed over it).
    """
    path = Path(path)
    kind = _kind(path)
    table = validate_traffic(df, str(path))
    with replacing(path) as tmp:
        if kind == "csv":
            table.to_csv(tmp, index=False)
        else:
            table.to_parquet(tmp, index=False)
    return path


def check_output(path: str | os.PathLike) -> Path:
    """The path of a traffic file to write, once its suffix is known and a file can be made there."""
    path = Path(path)
    _kind(path)
    return check_writable(path)


def check_writable(path: str | os.PathLike) -> Path:
    """The path, once a new file can be made there (tuner.files.check_writable), or a TrafficError."""
    return files.check_writable(path, error=TrafficError)


def replacing(path: str | os.PathLike):
    """A temporary path beside `path` that replaces it when complete (tuner.files.replacing)."""
    return files.replacing(path, error=TrafficError)


def validate_traffic(df: pd.DataFrame, source: str, first_line: int | None = None) -> pd.DataFrame:
    """Check a raw table and return it normalised (dtypes, column order, stable sort by time).

    `first_line` is the file line of row 0 for a CSV (so messages say "line N"); else rows are
    counted from 1. Raises TrafficError naming the source, row and column of the first problem.
    """
    return validate_part(df, source, first_line=first_line)


def validate_part(df: pd.DataFrame, source: str, *, first_line: int | None = None,
                  row_offset: int = 0) -> pd.DataFrame:
    """validate_traffic of a part of a file: a Parquet row group whose first row is the file's
    `row_offset` (0-based), or a CSV chunk whose first row is on line `first_line`."""
    where = _Where(source, first_line, row_offset)
    if df.columns.duplicated().any():
        dup = df.columns[df.columns.duplicated()][0]
        raise TrafficError(f"{source}: column {dup!r} appears twice")
    if TIMESTAMP not in df.columns:
        raise TrafficError(f"{source}: no {TIMESTAMP!r} column (columns found: {column_names(df)})")
    if len(df) == 0:
        raise TrafficError(f"{source}: no requests (a header but no rows)")
    for col in df.columns:
        _one_value_per_cell(df[col], str(col), where)

    out = {TIMESTAMP: _seconds(df[TIMESTAMP], where)}
    out[BATCH_SIZE] = (
        _positive_int(df[BATCH_SIZE], BATCH_SIZE, where)
        if BATCH_SIZE in df.columns
        else np.ones(len(df), dtype=np.int64)
    )
    for col in shape_columns(df):
        out[str(col)] = _positive_int(df[col], str(col), where, shape=True)
    if MODEL in df.columns:
        out[MODEL] = _model(df[MODEL], where)
    if PREFIX_ID in df.columns:
        out[PREFIX_ID] = _text(df[PREFIX_ID], PREFIX_ID, where)
    table = pd.DataFrame(out)
    ts = table[TIMESTAMP].to_numpy()
    if len(ts) > 1 and not (np.diff(ts) >= 0).all():
        table = table.sort_values(TIMESTAMP, kind="stable", ignore_index=True)
    return table


def validate_times(col: pd.Series, source: str, *, row_offset: int = 0) -> np.ndarray:
    """A timestamp column alone, checked and converted as validate_traffic does (float64 seconds,
    in the order given): what a scan of the time column reads, without the other columns."""
    if len(col) == 0:
        return np.empty(0, dtype=np.float64)
    _one_value_per_cell(col, TIMESTAMP, _Where(source, None, row_offset))
    return _seconds(col, _Where(source, None, row_offset))


def column_names(df: pd.DataFrame) -> str:
    """The table's column names for a message: as written, or quoted where a character would not
    show (a byte-order mark, a trailing space)."""
    names = [str(c) for c in df.columns]
    shown = [n if n.isprintable() and n == n.strip() and n else repr(n) for n in names]
    return ", ".join(shown) or "none"


# what pandas infers for a column of single values only ("mixed" or "mixed-integer" may hide a list)
_SCALAR_KINDS = frozenset({
    "string", "bytes", "floating", "integer", "mixed-integer-float", "decimal", "complex",
    "boolean", "datetime64", "datetime", "date", "timedelta64", "timedelta", "time", "period", "empty",
})


def _one_value_per_cell(col: pd.Series, name: str, where: _Where) -> None:
    """Refuse a column whose cells hold lists, arrays or mappings (a Parquet list or struct column):
    a request has one value per column."""
    nested = isinstance(col.dtype, pd.ArrowDtype) and _is_nested(col.dtype.pyarrow_dtype)
    if not nested and (col.dtype != object or pd.api.types.infer_dtype(col, skipna=True) in _SCALAR_KINDS):
        return
    bad = _first_bad(~col.map(pd.api.types.is_scalar).to_numpy(dtype=bool))
    if bad is None:
        return
    value = col.iloc[bad]
    value = value.tolist() if hasattr(value, "tolist") else value
    what = "a mapping" if isinstance(value, dict) else f"a {type(value).__name__}"
    text = repr(value)
    text = text if len(text) <= 40 else text[:37] + "..."
    raise where.fail(bad, name, f"{what} ({text}), not one value per request")


def _is_nested(dtype) -> bool:
    """Whether a pyarrow type holds several values (list, struct, map)."""
    import pyarrow as pa

    return pa.types.is_nested(dtype)


class _Where:
    """Names a row the way the user finds it: a CSV's file line, or a 1-based row."""

    def __init__(self, source: str, first_line: int | None, row_offset: int = 0):
        self.source = source
        self.first_line = first_line
        self.row_offset = row_offset

    def fail(self, row: int, column: str, problem: str) -> TrafficError:
        if self.first_line is None:
            at = f"row {row + self.row_offset + 1}"
        else:
            at = f"line {row + self.first_line}"
        return TrafficError(f"{self.source}: {at}, column {column!r}: {problem}")


def _first_bad(mask: np.ndarray) -> int | None:
    bad = np.flatnonzero(mask)
    return int(bad[0]) if len(bad) else None


def _show(value: object) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)) or value is pd.NA:
        return "empty (NaN)"
    return repr(value.item() if isinstance(value, np.generic) else value)


def _seconds(col: pd.Series, where: _Where) -> np.ndarray:
    """Times as float64 seconds: numbers as they are, ISO-8601 / datetimes as Unix-epoch seconds."""
    name = TIMESTAMP
    if pd.api.types.is_bool_dtype(col):
        raise where.fail(0, name, "not a time (booleans)")
    if isinstance(col.dtype, pd.DatetimeTZDtype) or pd.api.types.is_datetime64_dtype(col):
        return _datetime_seconds(col, col, where)
    if pd.api.types.is_numeric_dtype(col):
        values = col.to_numpy(dtype=np.float64, na_value=np.nan)
    else:
        numbers = pd.to_numeric(col, errors="coerce")
        if numbers.notna().any():
            # a numeric column with a stray word: name the first cell that is not a number
            bad = _first_bad((numbers.isna() & col.notna()).to_numpy())
            if bad is not None:
                raise where.fail(bad, name, f"unparsable time {_show(col.iloc[bad])}")
            values = numbers.to_numpy(dtype=np.float64, na_value=np.nan)
        else:
            parsed = pd.to_datetime(col, utc=True, format="ISO8601", errors="coerce")
            return _datetime_seconds(parsed, col, where)
    bad = _first_bad(~np.isfinite(values))
    if bad is not None:
        raise where.fail(bad, name, _empty_or(col.iloc[bad], "not a finite time:"))
    bad = _first_bad(values < 0)
    if bad is not None:
        raise where.fail(bad, name, f"negative time {_show(col.iloc[bad])}")
    return values


def _empty_or(value: object, problem: str) -> str:
    """What is wrong with a cell: it is empty (NaN), or `problem` and the value."""
    return "empty (NaN)" if pd.isna(value) else f"{problem} {_show(value)}"


def _datetime_seconds(parsed: pd.Series, raw: pd.Series, where: _Where) -> np.ndarray:
    if isinstance(parsed.dtype, pd.DatetimeTZDtype):
        parsed = parsed.dt.tz_convert("UTC").dt.tz_localize(None)
    missing = parsed.isna().to_numpy()
    bad = _first_bad(missing)
    if bad is not None:
        raise where.fail(bad, TIMESTAMP, _empty_or(raw.iloc[bad], "unparsable time"))
    ns = parsed.to_numpy().astype("datetime64[ns]").astype(np.int64)
    bad = _first_bad(ns < 0)
    if bad is not None:
        raise where.fail(bad, TIMESTAMP, f"negative time {_show(raw.iloc[bad])} (before 1970)")
    # split whole and fractional seconds so the float is rounded once, not twice
    return (ns // 1_000_000_000).astype(np.float64) + (ns % 1_000_000_000) / 1e9


def _positive_int(col: pd.Series, name: str, where: _Where, *, shape: bool = False) -> np.ndarray:
    hint = " (columns other than timestamp, batch_size, model and prefix_id are shape sizes)" if shape else ""
    if name in TOKEN_COLUMNS:
        hint = f" (every generative request needs its {name.replace('_', ' ')}, at least 1)"
    if pd.api.types.is_bool_dtype(col):
        raise where.fail(0, name, f"not an integer (booleans){hint}")
    if pd.api.types.is_integer_dtype(col) and not col.isna().any():
        values = col.to_numpy(dtype=np.int64)
    else:
        numbers = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        finite = np.isfinite(numbers)
        whole = finite & (numbers == np.floor(numbers))
        # the first row wrong for any reason is named, not the first of the first reason checked
        bad = _first_bad(~whole | (np.abs(numbers) > 2**53) | (numbers <= 0))
        if bad is not None:
            raw = col.iloc[bad]
            if not finite[bad]:
                if pd.isna(raw):
                    problem = "empty (NaN)" + (hint if name in TOKEN_COLUMNS else "")
                elif isinstance(raw, (float, np.floating)):
                    problem = f"not a finite number: {_show(raw)}"
                else:
                    problem = f"not a number: {_show(raw)}{hint}"
            elif not whole[bad]:
                problem = f"not a whole number: {_show(raw)}"
            elif abs(numbers[bad]) > 2**53:
                problem = f"too large: {_show(raw)}"
            else:
                tokens = hint if name in TOKEN_COLUMNS else ""
                # a whole number read as a float (a column with an empty cell) as the file writes it
                problem = f"must be a positive integer, got {int(numbers[bad])}{tokens}"
            raise where.fail(bad, name, problem)
        values = numbers.astype(np.int64)
    bad = _first_bad(values <= 0)
    if bad is not None:
        tokens = hint if name in TOKEN_COLUMNS else ""
        raise where.fail(bad, name, f"must be a positive integer, got {_show(col.iloc[bad])}{tokens}")
    return values


def _model(col: pd.Series, where: _Where) -> pd.Series:
    return _text(col, MODEL, where, what="empty model name")


def _text(col: pd.Series, name: str, where: _Where, *, what: str = "empty") -> pd.Series:
    """A column of names (model, prefix_id) as strings; an empty cell is refused."""
    if col.dtype == object and pd.api.types.infer_dtype(col, skipna=True) == "bytes":
        col = col.str.decode("utf-8", errors="replace")  # a Parquet binary column: the names, not "b'...'"
    text = col.astype("str")
    empty = (col.isna() | (text.str.strip() == "")).to_numpy()
    bad = _first_bad(empty)
    if bad is not None:
        raise where.fail(bad, name, what)
    if pd.api.types.is_float_dtype(col):  # a CSV's integer ids with a gap read as floats: 3.0 is "3"
        whole = col.to_numpy(dtype=np.float64)
        if (whole == np.floor(whole)).all():
            text = pd.Series(whole.astype(np.int64)).astype("str")
    return text.reset_index(drop=True)
