"""The append-only history: one JSON line per night in `<output>/history.jsonl`.

A night is appended last, after its run directory is in place, with one `write` of one line on a file
opened for appending; a run killed before that leaves the history as it was. A torn last line (a
crash inside the write) is skipped when reading and never glued to the next night's line.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pandas as pd

from tuner import space
from tuner.errors import TunerError

HISTORY_NAME = "history.jsonl"


def history_path(output: str | Path) -> Path:
    """Where the history lives: `<output>/history.jsonl`."""
    return Path(output) / HISTORY_NAME


def append_night(output: str | Path, entry: dict) -> Path:
    """The history file, with `entry` appended as one JSON line (after a torn last line, on a new one)."""
    path = history_path(output)
    line = json.dumps(entry, sort_keys=True, default=_plain) + "\n"
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = "\n" + line  # a torn line stays on its own and is skipped by the reader
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def read_history(output: str | Path) -> list[dict]:
    """Every complete night, oldest first."""
    path = history_path(output)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise TunerError(f"{path}: cannot read ({exc.strerror or exc})") from None
    nights = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line torn by a killed run
        if isinstance(entry, dict):
            nights.append(entry)
    return nights


def _params(p: dict | None) -> str:
    return space.describe(p) if p else "-"


def history_table(nights: list[dict]) -> pd.DataFrame:
    """One row per night: the decision, both configurations, the gain, the rate, the drift and why."""
    rows = []
    for n in nights:
        gain = n.get("gain")
        drift = n.get("drifted") or []
        rows.append({
            "night": n.get("night", "?"),
            "decision": n.get("decision", "?"),
            "exit": n.get("exit_code", ""),
            "production": _params(n.get("production")),
            "candidate": _params(n.get("candidate")),
            "gain": "-" if gain is None else f"{gain:+.1%}",
            "rate_rps": "-" if n.get("rate_rps") is None else f"{n['rate_rps']:.1f}",
            "drift": ", ".join(drift) if drift else "-",
            # the whole reason is in the night's decision.json and summary.md
            "reason": textwrap.shorten(n.get("reason", ""), width=100, placeholder=" ..."),
        })
    return pd.DataFrame(rows, columns=["night", "decision", "exit", "production", "candidate", "gain",
                                       "rate_rps", "drift", "reason"])


def format_history(nights: list[dict]) -> str:
    """The nights as an aligned text table (a line saying so when there are none)."""
    if not nights:
        return "no nights recorded yet"
    return history_table(nights).to_string(index=False)


def _plain(value):
    # numpy scalars and paths in an entry become plain JSON values
    if hasattr(value, "item"):
        return value.item()
    return str(value)
