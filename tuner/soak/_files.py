"""A soak's directory, `OUTPUT/soak/`: what is written there and how it is read back.

    soak.json       what was soaked: study, configuration, plan, capacity at the start, SLA; a
                    vLLM-served model's also `unit: tokens` and its engine arguments (`engine`)
    windows.csv     one row per finished window, appended (and synced) as each window ends, so that
                    an interrupted soak keeps every finished window
    executions.csv  per window and batch size: successful and failed executions (none for a
                    vLLM-served model: its engine batches, not Triton)
    findings.json   the analysis (trends, breaches, batch limits, quiet windows, restart advice)
    report.html     the time-series page (`tuner report OUTPUT`)

and `last_soak`: what an output directory's soak found, in a line or two (the audit's and the nightly's).
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
from pathlib import Path

import pandas as pd

from tuner.errors import InputError, OutputError
from tuner.files import check_output_dir, json_safe, os_reason, read_json_object, write_atomic
from tuner.formats import first_line
from tuner.soak.analysis import summary_lines

SOAK_DIR = "soak"
META = "soak.json"
WINDOWS = "windows.csv"
EXECUTIONS = "executions.csv"
FINDINGS = "findings.json"
REPORT = "report.html"
_OURS = (META, WINDOWS, EXECUTIONS, FINDINGS, REPORT)


class SoakFileError(InputError):
    """A soak directory that cannot be read (said in one line)."""


def soak_dir(output: str | os.PathLike) -> Path:
    """The soak directory of an output directory."""
    return Path(output) / SOAK_DIR


def has_soak(output: str | os.PathLike) -> bool:
    """True when the output directory holds a soak (at least its soak.json)."""
    return (soak_dir(output) / META).is_file()


def prepare(output: str | os.PathLike, *, replace: bool) -> Path:
    """The soak directory, made and empty of an earlier soak's files; an earlier soak is refused
    unless `replace`."""
    folder = soak_dir(output)
    if not (folder / META).exists() and any((folder / name).exists() for name in _OURS):
        # a soak writes its soak.json first: files of its names without one are someone's own
        taken = ", ".join(name for name in _OURS if (folder / name).exists())
        raise OutputError(f"{folder}: holds {taken} but no {META}: not a soak's files (not replaced, even with "
                          "--replace); name another --output")
    if (folder / META).exists():
        if not replace:
            raise OutputError(f"{folder}: holds an earlier soak; pass --replace to overwrite it, or --output "
                              "another directory")
        for name in _OURS:
            try:
                (folder / name).unlink(missing_ok=True)
            except IsADirectoryError:
                shutil.rmtree(folder / name, ignore_errors=True)
            except OSError as exc:
                raise OutputError(f"{folder / name}: cannot remove ({os_reason(exc)})") from None
    return check_output_dir(folder, "soak directory")


def write_json(path: Path, data: dict) -> Path:
    """`data` as JSON, whole or not at all (NaN and infinities become null)."""
    return write_atomic(path, json.dumps(json_safe(data), indent=2, default=str) + "\n")


def append_rows(path: Path, rows: list[dict], columns: list[str]) -> None:
    """Append `rows` to a CSV file (its header first when new), flushed to disk before returning."""
    new = not path.exists() or path.stat().st_size == 0
    try:
        with open(path, "a", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
            if new:
                writer.writeheader()
            for row in rows:
                writer.writerow({k: _cell(row.get(k)) for k in columns})
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise OutputError(f"{path}: cannot write ({os_reason(exc)})") from None


def read_meta(folder: Path) -> dict:
    """soak.json of a soak directory."""
    return _read_json(folder / META)


def read_findings(folder: Path) -> dict | None:
    """findings.json of a soak directory, or None when the soak wrote none (yet)."""
    return _read_json(folder / FINDINGS) if (folder / FINDINGS).exists() else None


def read_windows(folder: Path) -> pd.DataFrame:
    """windows.csv as a table (empty when no window finished)."""
    return _read_csv(folder / WINDOWS)


def read_executions(folder: Path) -> pd.DataFrame:
    """executions.csv as a table (empty when no window finished)."""
    return _read_csv(folder / EXECUTIONS)


def _read_csv(path: Path) -> pd.DataFrame:
    if not path.exists() or path.stat().st_size == 0:
        return pd.DataFrame()
    try:
        frame = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise SoakFileError(f"{path}: cannot read as CSV ({first_line(exc)})") from None
    for column in ("valid", "sla_ok", "restarted"):
        if column in frame.columns:
            frame[column] = frame[column].astype(str).str.lower().eq("true")
    return frame


def _read_json(path: Path) -> dict:
    return read_json_object(path, missing="not found (not a soak directory)", error=SoakFileError)


def _cell(value):
    if isinstance(value, float) and not math.isfinite(value):
        return ""
    return value


def last_soak(output: str | os.PathLike) -> list[str]:
    """One or two lines on the findings of the soak in `output` (empty when it holds none, or an
    unreadable one: said in the line)."""
    if not has_soak(output):
        return []
    folder = soak_dir(output)
    try:
        findings = read_findings(folder)
        meta = read_meta(folder)
    except SoakFileError as exc:
        return [f"last soak: unreadable ({exc})"]
    if findings is None:
        return [f"last soak ({str(meta.get('started_utc', '?'))[:16]}): no findings yet (still running, or killed)"]
    return summary_lines(findings, meta)
