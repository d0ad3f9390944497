"""The real corpus of Triton config.pbtxt files (tests/data/triton-configs: Triton's own, with its
license), for the config tests.

Without the corpus every corpus test gets the one value `MISSING` and fails saying why (never skips).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

CORPUS = Path(__file__).resolve().parent / "data" / "triton-configs"
FILES = sorted(CORPUS.rglob("config.pbtxt")) if CORPUS.is_dir() else []
# Without the corpus every corpus test gets this one value and fails saying why (never skips).
MISSING = Path("<corpus missing>")

# Triton's expected messages about the fields `validate` covers: max_batch_size, priority levels
# and queue policies, preserve_ordering, sequence-batching controls, the ensemble scheduler,
# instance-group kinds.
SCHEDULING_MESSAGE = re.compile(
    r"max_batch_size|max batch size|priority level|[Qq]ueue policy|preserve_ordering"
    r"|ensemble scheduling|has kind KIND_(CPU|MODEL) but specifies|sequence batching"
)
# Triton's expected messages about an input's or output's name, data_type, dims and reshape (validate
# checks them after the scheduling fields, as Triton does)
IO_MESSAGE = re.compile(r"^model (input|output) '[^']*' (must specify|cannot have empty reshape|dimension must be"
                        r"|reshape dimensions must be|has different)")


def corpus_file(path: Path) -> Path:
    if path == MISSING:
        pytest.fail(
            f"the Triton config corpus is not at {CORPUS} (it is part of the repository: "
            "is the checkout complete?)"
        )
    return path


def expected_message(path: Path) -> str | None:
    expected = path.parent / "expected"
    return expected.read_text().strip() if expected.exists() else None


def ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(CORPUS)) if p != MISSING else "missing" for p in paths]
