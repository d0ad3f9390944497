"""The append-only history: one JSON line per night in `<output>/history.jsonl`.

A night is appended last, after its run directory is in place, with one `write` of one line on a file
opened for appending; a run killed before that leaves the history as it was. A torn last line (a
crash inside the write) is never glued to the next night's line; reading skips it, and any other
line that is not a night's record, and says so on stderr.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from tuner import formats, space
from tuner.errors import TunerError
from tuner.files import os_reason
from tuner.nightly.rule import UNIT_LABELS

HISTORY_NAME = "history.jsonl"


def history_path(output: str | Path) -> Path:
    """Where the history lives: `<output>/history.jsonl`."""
    return Path(output) / HISTORY_NAME


def is_history(path: Path) -> bool:
    """Whether `path` is a history nights wrote: a regular file, empty or holding a night's record
    (a JSON object with its `night`), whatever else an edit or a torn line left in it."""
    if not path.is_file():
        return False
    lines = path.read_bytes().decode(errors="replace").splitlines()
    return not any(line.strip() for line in lines) or any(_is_night(line) for line in lines)


def _is_night(line: str) -> bool:
    try:
        entry = json.loads(line)
    except json.JSONDecodeError:
        return False
    return isinstance(entry, dict) and "night" in entry


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


def read_history(output: str | Path, *, warn: Callable[[str], None] | None = None) -> list[dict]:
    """Every complete night, oldest first. A line that is not a night's JSON object (torn by a killed
    run, or edited) is skipped and said, with its line number, through `warn` (default: one line on
    stderr): the night still runs, but the previous night it warm-starts from and compares with may
    be an older one than the user expects."""
    path = history_path(output)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        reason = os_reason(exc) if isinstance(exc, OSError) else f"not UTF-8 text at byte {exc.start}"
        raise TunerError(f"{path}: cannot read ({reason})") from None
    nights, skipped = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            entry = None
        if isinstance(entry, dict):
            nights.append(entry)
        else:
            skipped.append(number)
    if skipped:
        (warn or _warn)(f"{path}: skipped {len(skipped)} line(s) that are not a night's JSON record "
                        f"(line {_numbers(skipped)}: torn by a killed run, or edited); read {len(nights)} night(s)")
    return nights


def _warn(text: str) -> None:
    print(f"tuner: warning: {text}", file=sys.stderr, flush=True)


def _numbers(numbers: list[int], shown: int = 5) -> str:
    """`3, 7, 9` (the first `shown`, then how many more)."""
    head = ", ".join(map(str, numbers[:shown]))
    return head + (f" and {len(numbers) - shown} more" if len(numbers) > shown else "")


def _params(p: dict | None) -> str:
    return space.describe(p) if p else "-"


def _best(night: dict) -> str:
    """The search's best score with its unit (`1.2e+06 tokens/$`): a night before units were written
    scored requests."""
    unit = night.get("unit", "requests")
    value = night.get(f"best_{unit}_per_dollar")
    return "-" if value is None else f"{formats.number(value)} {UNIT_LABELS.get(unit, unit + '/$')}"


def history_table(nights: list[dict]) -> pd.DataFrame:
    """One row per night: the decision, both configurations, the best score with its unit and the server's
    price it divides by (a night before prices were kept: -), the gain, the rate, the drift and why."""
    rows = []
    for n in nights:
        drift = n.get("drifted") or []
        rows.append({
            "night": n.get("night", "?"),
            "decision": n.get("decision", "?"),
            "exit": n.get("exit_code", ""),
            "production": _params(n.get("production")),
            "candidate": _params(n.get("candidate")),
            "best": _best(n),
            "price": "-" if n.get("price_per_hour") is None else f"{n['price_per_hour']:g} $/h",
            "gain": formats.number(n.get("gain"), "+.1%"),
            "rate_rps": formats.number(n.get("rate_rps"), ".1f"),
            "drift": ", ".join(drift) if drift else "-",
            # the whole reason is in the night's decision.json and summary.md
            "reason": textwrap.shorten(n.get("reason", ""), width=100, placeholder=" ..."),
        })
    return pd.DataFrame(rows, columns=["night", "decision", "exit", "production", "candidate", "best", "price",
                                       "gain", "rate_rps", "drift", "reason"])


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
