"""A recording too large to hold: Parquet files (one, a directory, or a glob) read as one table, a
row group at a time.

`open_recording` reads only the files' footers: each row group's time range comes from the Parquet
statistics of its timestamp column (or, where a file has none, from a read of that column alone).
Row groups whose time ranges overlap, within a file or across files, form one segment, read together
and sorted by time (stably, in file order); every other segment is one row group. So the requests
come out in time order, one segment in memory at a time, and a window reads only the row groups
whose range meets it (the filter pushed down to the footers' statistics).

A CSV is converted once, streamed a million rows at a time, to Parquet in the tuner's cache
($TUNER_TRAFFIC_CACHE, else $XDG_CACHE_HOME/tuner/traffic, else ~/.cache/tuner/traffic): the user's files
are only ever read. An entry is named `<stem>-<path>-<version>.parquet`, by hashes of the CSV's resolved
path and of its size, modification and change times and inode. One that cannot be read (emptied,
truncated) is converted again; writing one removes the entries of the same CSV's earlier versions. A
Recording holds a shared lock (flock) on each entry it reads for as long as it lives, and an entry is
removed only under an exclusive one: a conversion never removes one that another process is reading.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import re
import stat
import sys
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

import numpy as np
import pandas as pd

from tuner import files
from tuner.errors import TrafficError
from tuner.formats import first_line
from tuner.traffic.io import (
    CSV_SUFFIXES,
    MODEL,
    PARQUET_SUFFIXES,
    TIMESTAMP,
    csv_to_parquet,
    validate_part,
    validate_times,
)

__all__ = ["Part", "Recording", "cache_dir", "joins_recording", "open_recording", "recording_files"]

T = TypeVar("T")
CSV_ROWS = 1_000_000  # rows of a CSV converted at a time (about 100 MB of pandas frame)
_GLOB = set("*?[")


@dataclass(frozen=True, kw_only=True)
class Part:
    """One row group of one Parquet file: where it is, its rows and its time range (seconds)."""

    file: Path  # the Parquet file read (a CSV's conversion in the cache)
    shown: str  # the file as the user named it, for messages
    group: int
    first_row: int  # the file's row where the group starts (0-based)
    rows: int
    lo: float
    hi: float


@dataclass(kw_only=True)
class Recording:
    """Parquet row groups in time order: `segments` are lists of parts read together (one row
    group, or several whose time ranges overlap); `notes` say what was combined and how.

    With `model` set (`of_model`), only the requests whose `model` column names it are read, by
    times() and frames() alike, so a window is found among that model's requests; `left_out` counts
    the others frames() has read past. `rows`, `start` and `end` stay the whole recording's."""

    source: str
    columns: list[str]
    segments: list[list[Part]]
    notes: list[str] = field(default_factory=list)
    model: str | None = None
    left_out: dict[str, int] = field(default_factory=dict)
    # the CSVs' conversions it reads, held until the last copy (of_model) of it goes
    holds: list[_Hold] = field(default_factory=list, repr=False, compare=False)

    def of_model(self, name: str) -> Recording:
        """The same recording, read as `name`'s requests alone (unchanged without a model column)."""
        if MODEL not in self.columns or _only_name(self, name):
            return self
        return replace(self, model=name, left_out={})

    @property
    def rows(self) -> int:
        """Requests in the recording."""
        return sum(p.rows for seg in self.segments for p in seg)

    @property
    def start(self) -> float:
        """The first request's timestamp."""
        return self.segments[0][0].lo

    @property
    def end(self) -> float:
        """The last request's timestamp."""
        return max(p.hi for p in self.segments[-1])

    def frames(self, columns: Sequence[str] | None = None, *, since: float | None = None,
               until: float | None = None) -> Iterator[pd.DataFrame]:
        """The requests in time order, one validated segment at a time; with `since` / `until`,
        only the segments whose time range meets [since, until] are read."""
        if self.model is None:
            yield from _ahead(lambda seg: _read_segment(seg, columns), self._segments(since, until))
            return
        wanted = None if columns is None else list(dict.fromkeys([*columns, MODEL]))
        for df in _ahead(lambda seg: _read_segment(seg, wanted), self._segments(since, until)):
            mine = df[MODEL] == self.model
            if not mine.all():
                for name, count in df.loc[~mine, MODEL].value_counts(sort=False).items():
                    self.left_out[str(name)] = self.left_out.get(str(name), 0) + int(count)
                df = df[mine].reset_index(drop=True)
            yield df if columns is None or MODEL in columns else df.drop(columns=MODEL)

    def times(self, *, since: float | None = None, until: float | None = None) -> Iterator[np.ndarray]:
        """The timestamps alone (float64 seconds, sorted), one segment at a time."""
        if self.model is None:
            yield from _ahead(_segment_times, self._segments(since, until))
            return
        model = self.model
        for df in _ahead(lambda seg: _read_segment(seg, [TIMESTAMP, MODEL]), self._segments(since, until)):
            ts = df.loc[df[MODEL] == model, TIMESTAMP].to_numpy(dtype=np.float64)
            if len(ts):  # a segment of other models' requests alone holds none of these
                yield ts

    def names_model(self) -> bool:
        """Whether any request's `model` column names `model` (a read of that column alone)."""
        return any((df[MODEL] == self.model).any()
                   for df in _ahead(lambda seg: _read_segment(seg, [TIMESTAMP, MODEL]), self._segments(None, None)))

    def _segments(self, since: float | None, until: float | None) -> Iterator[list[Part]]:
        for seg in self.segments:
            if since is not None and max(p.hi for p in seg) < since:
                continue
            if until is not None and seg[0].lo > until:
                break
            yield seg


def _only_name(rec: Recording, name: str) -> bool:
    """Whether every row group's footer says its `model` column holds `name` alone (min = max, no
    empty cell): then nothing is left out, and the fast read of the times alone stands."""
    import pyarrow.parquet as pq

    metas = {}
    for part in (p for seg in rec.segments for p in seg):
        if part.file not in metas:
            pf = pq.ParquetFile(part.file)
            metas[part.file] = (pf.metadata, pf.schema_arrow.names.index(MODEL))
        meta, index = metas[part.file]
        stats = meta.row_group(part.group).column(index).statistics
        if stats is None or not stats.has_min_max or stats.null_count != 0 or not stats.min == stats.max == name:
            return False
    return True


def _ahead(read: Callable[[list[Part]], T], segments: Iterator[list[Part]]) -> Iterator[T]:
    """read(segment) for each segment, the next one read in a thread while the caller works on
    this one (pyarrow and numpy let go of the GIL: a second core decodes while the first counts);
    two segments in memory at most."""
    with ThreadPoolExecutor(1) as pool:
        pending = None
        for seg in segments:
            upcoming = pool.submit(read, seg)
            if pending is not None:
                yield pending.result()
            pending = upcoming
        if pending is not None:
            yield pending.result()


def cache_dir() -> Path:
    """Where CSV recordings are converted to Parquet: $TUNER_TRAFFIC_CACHE, else the user cache."""
    return files.user_cache("TUNER_TRAFFIC_CACHE", "traffic")


def recording_files(path: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """The traffic tables a recording is made of: a file, a directory's .parquet/.pq/.csv files, a
    glob pattern's matches, or a list of files; sorted by name."""
    if isinstance(path, (list, tuple)):
        found = [Path(p) for p in path]
        if not found:
            raise TrafficError("no traffic files given")
        return found
    text = os.fspath(path)
    suffixes = CSV_SUFFIXES + PARQUET_SUFFIXES
    if _is(text, stat.S_ISDIR):
        found = sorted(p for p in Path(text).iterdir() if p.is_file() and p.suffix.lower() in suffixes)
        if not found:
            raise TrafficError(f"{text}: an empty directory (no .parquet, .pq or .csv files in it)")
        return found
    if _GLOB & set(Path(text).name) and not _is(text, lambda mode: True):
        found = sorted(Path(p) for p in glob.glob(text) if Path(p).is_file() and Path(p).suffix.lower() in suffixes)
        if not found:
            raise TrafficError(f"{text}: no .parquet, .pq or .csv files match")
        return found
    return [Path(text)]


def joins_recording(path: str | os.PathLike, recording: str | os.PathLike) -> bool:
    """Whether a file written at `path`, there yet or not, would be read as part of the recording
    `recording` names (a directory or a glob pattern takes every traffic file in it or matching it):
    a new profile.csv in a study's traffic directory would be replayed as traffic next time."""
    path, text = Path(os.path.abspath(path)), os.fspath(recording)
    if path.suffix.lower() not in CSV_SUFFIXES + PARQUET_SUFFIXES:
        return False
    if _is(text, stat.S_ISDIR):  # resolved: the same directory by another name is the same directory
        return Path(os.path.realpath(path)).parent == Path(os.path.realpath(text))
    if _GLOB & set(Path(text).name) and not _is(text, lambda mode: True):
        return path.match(os.path.abspath(text))
    return False


def _is(path: str, kind) -> bool:
    """Whether `path` is there and its mode passes `kind` (a name the OS refuses is left to the
    read, which names the reason)."""
    try:
        return bool(kind(os.stat(path).st_mode))
    except (OSError, ValueError):
        return False


def open_recording(path: str | os.PathLike | Sequence[str | os.PathLike], *,
                   progress: bool = False) -> Recording:
    """The recording at `path` (see recording_files), planned from the files' footers.

    A file that is not readable Parquet, or whose columns differ from the first file's, is named
    in a TrafficError. CSV files are converted once to Parquet in cache_dir(), streamed.
    """
    paths = recording_files(path)
    source = os.fspath(path) if not isinstance(path, (list, tuple)) else str(paths[0].parent)
    parts: list[Part] = []
    columns: list[str] | None = None
    kinds: dict[str, str] = {}
    first: str | None = None
    holds: list[_Hold] = []
    for n, given in enumerate(paths, start=1):
        if progress and len(paths) > 20 and (n == len(paths) or n % 100 == 0):
            print(f"  reading footers: {n:,} of {len(paths):,} files", file=sys.stderr, flush=True)
        parquet, hold = _as_parquet(given, progress=progress)
        if hold is not None:
            holds.append(hold)
        pf = _open(parquet, str(given))
        names = list(pf.schema_arrow.names)
        if TIMESTAMP not in names:
            raise TrafficError(f"{given}: no {TIMESTAMP!r} column (columns found: {', '.join(names) or 'none'})")
        these = {name: _family(pf.schema_arrow.field(name).type) for name in names}
        if columns is None:
            columns, kinds, first = names, these, str(given)
        elif set(names) != set(columns):
            raise TrafficError(
                f"{given}: columns {', '.join(sorted(names))} differ from {first}'s "
                f"({', '.join(sorted(columns))}); every file of a recording has the same columns"
            )
        else:
            for name, kind in these.items():
                if kind != kinds[name]:
                    raise TrafficError(f"{given}: column {name!r} holds {kind}, but {kinds[name]} in {first}")
        parts += _parts(pf, parquet, str(given))
    if not parts:
        raise TrafficError(f"{source}: no requests (the files hold no rows)")
    segments, notes = _segments(parts)
    return Recording(source=source, columns=list(columns or []), segments=segments, notes=notes, holds=holds)


def _family(kind) -> str:
    """What a Parquet column holds, as far as reading it as traffic goes."""
    import pyarrow as pa

    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind):
        return "numbers"
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        return "times"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind) \
            or pa.types.is_large_binary(kind) or pa.types.is_dictionary(kind):
        return "text"
    return str(kind)


def _open(path: Path, shown: str):
    import pyarrow.parquet as pq

    with files.open_input(path, what="a traffic file", label=shown, error=TrafficError) as fh:
        empty = os.fstat(fh.fileno()).st_size == 0
    if empty:
        raise TrafficError(f"{shown}: empty file")
    try:
        return pq.ParquetFile(path)
    except OSError as exc:
        if isinstance(exc, (FileNotFoundError, PermissionError)):
            raise TrafficError(f"{shown}: cannot read ({files.os_reason(exc)})") from None
        raise TrafficError(f"{shown}: not a readable Parquet file ({first_line(exc)})") from None
    except Exception as exc:  # pyarrow raises several unrelated types for a damaged file
        raise TrafficError(f"{shown}: not a readable Parquet file ({first_line(exc)})") from None


def _parts(pf, parquet: Path, shown: str) -> list[Part]:
    """The file's row groups with their time ranges: the footer's statistics for a numeric time
    column, else a read of the time column of that group."""
    meta = pf.metadata
    index = pf.schema_arrow.names.index(TIMESTAMP)
    numeric = _family(pf.schema_arrow.field(TIMESTAMP).type) == "numbers"
    out, row = [], 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        rows = group.num_rows
        if rows == 0:
            continue
        # the leaf column of a flat schema has the field's index
        stats = group.column(index).statistics if index < group.num_columns else None
        if numeric and stats is not None and stats.has_min_max and stats.null_count == 0 \
                and np.isfinite(float(stats.min)) and np.isfinite(float(stats.max)) and float(stats.min) >= 0:
            lo, hi = float(stats.min), float(stats.max)
        else:
            # no usable statistics (or a bad value the read will name): read the times themselves
            ts = _group_times(pf, g, shown=shown, first_row=row)
            lo, hi = float(ts.min()), float(ts.max())
        out.append(Part(file=parquet, shown=shown, group=g, first_row=row, rows=rows, lo=lo, hi=hi))
        row += rows
    return out


def _segments(parts: list[Part]) -> tuple[list[list[Part]], list[str]]:
    """Parts in time order, those whose ranges overlap merged into one segment; notes on overlaps."""
    ordered = sorted(parts, key=lambda p: (p.lo, p.hi))
    segments: list[list[Part]] = []
    hi = -np.inf
    for part in ordered:
        if segments and part.lo < hi:
            segments[-1].append(part)
        else:
            segments.append([part])
        hi = max(hi, part.hi)
    notes: list[str] = []
    overlapping = [seg for seg in segments if len(seg) > 1]
    for seg in overlapping[:5]:
        shown = list(dict.fromkeys(p.shown for p in seg))
        lo, top = seg[0].lo, max(p.hi for p in seg)
        rows = sum(p.rows for p in seg)
        what = (f"{shown[0]} is not in time order" if len(shown) == 1
                else f"{', '.join(shown[:3])}{' ...' if len(shown) > 3 else ''} overlap in time")
        notes.append(f"{what} ({lo:.3f} to {top:.3f} s): their {rows:,} requests are merged, "
                     "sorted by time (equal times kept in file order)")
    if len(overlapping) > 5:
        notes.append(f"... and {len(overlapping) - 5} more overlapping stretches, merged the same way")
    return segments, notes


# use_threads=False throughout: a row group is read while the last one is counted, and on a busy
# machine pyarrow's thread pool costs two to three times the CPU of one thread for the same read

def _group_times(pf, group: int, *, shown: str, first_row: int) -> np.ndarray:
    col = pf.read_row_group(group, columns=[TIMESTAMP], use_threads=False).column(0).to_pandas()
    return validate_times(col, shown, row_offset=first_row)


def _segment_times(seg: list[Part]) -> np.ndarray:
    import pyarrow.parquet as pq

    parts = [_group_times(pq.ParquetFile(p.file), p.group, shown=p.shown, first_row=p.first_row) for p in seg]
    ts = parts[0] if len(parts) == 1 else np.concatenate(parts)
    if len(ts) > 1 and not (np.diff(ts) >= 0).all():
        ts = np.sort(ts, kind="stable")
    return ts


def _read_segment(seg: list[Part], columns: Sequence[str] | None) -> pd.DataFrame:
    import pyarrow.parquet as pq

    frames = []
    for p in seg:
        raw = pq.ParquetFile(p.file).read_row_group(p.group, columns=list(columns) if columns else None,
                                                        use_threads=False)
        try:
            df = raw.to_pandas()
        except Exception as exc:  # a column pandas cannot hold
            raise TrafficError(f"{p.shown}: not a readable Parquet file ({first_line(exc)})") from None
        frames.append(validate_part(df, p.shown, row_offset=p.first_row))
    if len(frames) == 1:
        return frames[0]
    table = pd.concat(frames, ignore_index=True)
    return table.sort_values(TIMESTAMP, kind="stable", ignore_index=True)


# --- CSV: converted once ----------------------------------------------------------------------------

def _as_parquet(path: Path, *, progress: bool) -> tuple[Path, _Hold | None]:
    """A Parquet file to read for `path`: itself, or a CSV's conversion in the cache (made once), held
    while it is read."""
    suffix = path.suffix.lower()
    if suffix in PARQUET_SUFFIXES:
        return path, None
    if suffix not in CSV_SUFFIXES:
        with files.open_input(path, what="a traffic file", error=TrafficError):
            pass  # a path that is not there is said so before its suffix is judged
        raise TrafficError(f"{path}: unknown traffic file type {suffix or '(no suffix)'!r} "
                           "(expected .csv or .parquet)")
    with files.open_input(path, what="a traffic file", error=TrafficError) as fh:
        st = os.fstat(fh.fileno())
    source = path.resolve()
    # the change time and inode too: a file replaced by one of the same size and modification time
    # (`cp -p`, `rsync -a`, `tar x`) has a new one, which no tool can set back
    version = f"{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}"
    folder = cache_dir()
    mine = _digest(str(source))
    target = folder / f"{source.stem[:80]}-{mine}-{_digest(version)}.parquet"
    hold = _held(target)
    if hold is not None:
        return target, hold
    # not there, or not readable (emptied, truncated): the CSV is read again, never blamed for it
    for _ in range(2):
        convert_csv(path, target, progress=progress)
        hold = _held(target)
        if hold is not None:
            break
    else:
        raise TrafficError(f"{path}: its conversion to Parquet ({target}) cannot be read back")
    _remove_earlier(folder, mine, keep=target)
    return target, hold


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class _Hold:
    """A cache entry open with a shared lock (flock), closed once no Recording reads it any more: no
    other process's conversion removes the entry while this one reads it."""

    def __init__(self, fd: int) -> None:
        weakref.finalize(self, os.close, fd)


def _held(entry: Path) -> _Hold | None:
    """The cache entry held (_Hold), when it is there and readable Parquet (its footer: an emptied or
    truncated file has none); None otherwise."""
    import pyarrow.parquet as pq

    fd = _open_locked(entry)
    if fd is None:
        return None
    try:
        pq.ParquetFile(entry)
    except Exception:  # pyarrow raises several unrelated types for a damaged file
        os.close(fd)
        return None
    return _Hold(fd)


def _open_locked(entry: Path) -> int | None:
    """The entry open with a shared lock, the file its name holds now (None when there is none)."""
    for _ in range(5):  # renamed over meanwhile by another process's conversion of the same version
        try:
            fd = os.open(entry, os.O_RDONLY)
        except OSError:
            return None
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while a removal holds the entry
        try:
            if os.fstat(fd).st_ino == os.stat(entry).st_ino:
                return fd
        except OSError:  # removed while this waited
            os.close(fd)
            return None
        os.close(fd)
    return None


def _remove_earlier(folder: Path, mine: str, *, keep: Path) -> None:
    """Remove the conversions of the source file's earlier versions (`mine`: its path's digest) but
    `keep`; one that another process is reading (a shared lock) is left for a later conversion."""
    earlier = re.compile(rf".*-{mine}-[0-9a-f]{{16}}\.parquet")
    for entry in folder.iterdir():
        if entry.name == keep.name or not earlier.fullmatch(entry.name):
            continue
        try:
            fd = os.open(entry, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(fd).st_ino == os.stat(entry).st_ino:
                os.unlink(entry)
        except OSError:  # held by a reader, or gone already
            pass
        finally:
            os.close(fd)


def convert_csv(path: Path, target: Path, *, progress: bool = False) -> Path:
    """Write the CSV traffic file `path` as Parquet at `target`, CSV_ROWS rows at a time (each
    chunk validated as read_traffic validates the whole), whole or not at all."""
    target.parent.mkdir(parents=True, exist_ok=True)

    def said(rows: int) -> None:
        if progress and rows >= CSV_ROWS:  # a file that takes more than a moment
            print(f"  converting {path.name} to Parquet: {rows:,} rows", file=sys.stderr, flush=True)

    csv_to_parquet(path, target, rows=CSV_ROWS, table=lambda chunk, line: validate_part(
        chunk, str(path), first_line=line), on_rows=said)
    return target
