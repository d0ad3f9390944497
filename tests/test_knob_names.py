"""A tuned knob's name is spelled only where its meaning is implemented: `tuner/space.py` (the knobs),
the model-config writer (`tuner/modelconfig.py`) and the batcher simulation (`tuner/simulate/_batcher.py`).
The command line, the search, the reports, the exports, the audit, the nightly job and the rest of the
simulation address a knob through `tuner.space` (`space.NAMES`, `space.MAX_BATCH_SIZE`, `space.describe`,
...), so renaming or adding a knob changes `space.py`, not them, as tests/test_layers.py keeps the
import layers.

"Spelled" means code that names the knob: an identifier (a variable, a parameter, a keyword argument, an
attribute) or a string that is the name or the config.pbtxt path itself (a dict key, a column, a
subscript). Prose that mentions a knob in a longer string (a help text, a message) is documentation
for the user, not an address, and docstrings and comments are not code.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tuner import space

ROOT = Path(__file__).resolve().parent.parent
TUNER = ROOT / "tuner"

# Where a knob's name must not be spelled (folders: every module in them).
# (tuner/production/ is not checked: it reads the deployed config's max_batch_size as its fill rate's
# denominator, a measured fact like `Measurement.max_batch_size`, and tunes nothing)
CHECKED = ("tuner/cli", "tuner/search", "tuner/report", "tuner/nightly", "tuner/export.py", "tuner/audit.py",
           "tuner/simulate")
# Where its meaning is implemented: the knobs, the config writer, the batcher.
IMPLEMENTED = ("tuner/space.py", "tuner/modelconfig.py", "tuner/simulate/_batcher.py")

# A measurement's field, not a knob: `Measurement.max_batch_size` is the max_batch_size the measured
# server ran, kept with the measurement as its fill rate's denominator (like `mean_batch_size` beside
# it). Its reads and its construction are allowed where they are exactly these lines; each entry must
# still match a line (a stale one fails), and a new use elsewhere fails until it is judged here.
MEASUREMENT_FIELD = {
    ("tuner/cli/audit_cmd.py",
     "write_textfile(args.textfile, study_families(settings, labels, max_batch_size=result.max_batch_size,"):
        "the production audit's reading of the deployed max_batch_size (the fill rate's denominator), "
        "published as a gauge for the rules to divide by",
    ("tuner/cli/audit_cmd.py",
     "families = study_families(settings, labels, max_batch_size=deployed, baseline=baseline) \\"):
        "the replay audit's deployed max_batch_size (read through space.MAX_BATCH_SIZE), published as the "
        "production audit's is, for the rules to divide by",
    ("tuner/audit.py", "mbs = a.params[\"max_batch_size\"]"):
        "the audit's fill-rate finding reads the trial's value (equal to the measurement's "
        "`load.max_batch_size`); owned by the audit's findings, to read the measurement's field",
    ("tuner/audit.py",
     "settling = warm_up(launcher, settings, traffic, max_batch_size=int(params[space.MAX_BATCH_SIZE]))"):
        "the remote audit's settling warm-up, of the config the server runs (read through space.MAX_BATCH_SIZE), "
        "as the replay's warm-up is",
    ("tuner/audit.py", "fill = f\", fill rate {m.fill_rate:.2f}\" if m.max_batch_size > 0 else \"\""):
        "the measurement's field: a model without batching has no fill rate",
    ("tuner/cli/replay_cmd.py", "warm = warm_up(launcher, settings, traffic, max_batch_size=int(running.max_batch_size))"):
        "the replay measures the config the server runs: the warm-up's shape sweep up to its max_batch_size",
    ("tuner/cli/replay_cmd.py",
     "probe = make_probe(launcher, settings, windows, max_batch_size=int(running.max_batch_size),"):
        "the measurement's field, from the config the server runs",
    ("tuner/cli/replay_cmd.py", "if m.max_batch_size <= 0:"): "the measurement's field (no batching)",
    ("tuner/cli/replay_cmd.py", "if m.max_batch_size <= 0:  # each request runs alone: there is no batch to fill"):
        "the measurement's field (no batching)",
    ("tuner/cli/replay_cmd.py",
     "return f\"no batching (max_batch_size {m.max_batch_size}): one request per execution, no fill rate\""):
        "the measurement's field",
    ("tuner/cli/replay_cmd.py",
     "return f\"mean {m.mean_batch_size:.2f} of max {m.max_batch_size} (fill rate {m.fill_rate:.2f})\""):
        "the measurement's field",
    ("tuner/simulate/_study.py",
     "def measurement(run: BatchRun, requests: Requests, *, speed: float, warmup_s: float, max_batch_size: int,"):
        "the simulated measurement is built as a real one: the fill rate's denominator",
    ("tuner/simulate/_study.py", "max_batch_size=max_batch_size, sla_percentile=sla_percentile,"):
        "the measurement's field (its fill rate's denominator)",
    ("tuner/simulate/_study.py",
     "max_batch_size=config.max_batch_size, sla_percentile=self.sla.percentile)"):
        "the measurement's field, from the simulated configuration",
}


def _words() -> set[str]:
    return {*space.NAMES, *space.ENGINE_NAMES, *(k.path for k in space.KNOBS if "." in k.path)}


def _modules(paths) -> list[Path]:
    out = []
    for name in paths:
        path = ROOT / name
        out.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return out


def spellings(path: Path, words: set[str]) -> list[tuple[int, str, str]]:
    """(line, what, the word) for each place `path`'s code spells one of `words`."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in words:
            found.append((node.lineno, "name", node.id))
        elif isinstance(node, ast.Attribute) and node.attr in words:
            found.append((node.lineno, "attribute", node.attr))
        elif isinstance(node, ast.keyword) and node.arg in words:
            found.append((node.lineno, "keyword", node.arg))
        elif isinstance(node, ast.arg) and node.arg in words:
            found.append((node.lineno, "parameter", node.arg))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
              and node.value.strip() in words):
            found.append((node.lineno, "string", node.value.strip()))
    return found


def offences(paths, words: set[str]) -> list[str]:
    """Every spelling in `paths` that is not an allowed measurement field, as `path:line: what word`."""
    out = []
    for path in _modules(paths):
        rel = path.relative_to(ROOT).as_posix()
        if rel in IMPLEMENTED:
            continue
        lines = path.read_text().splitlines()
        for line, what, word in spellings(path, words):
            if (rel, lines[line - 1].strip()) not in MEASUREMENT_FIELD:
                out.append(f"{rel}:{line}: {what} {word!r}")
    return out


def test_a_knob_is_spelled_only_where_its_meaning_is_implemented():
    assert offences(CHECKED, _words()) == []


def test_the_allowed_measurement_fields_are_still_there():
    """A stale exception would let a future spelling on that line pass unseen."""
    for (rel, text), why in MEASUREMENT_FIELD.items():
        lines = {line.strip() for line in (ROOT / rel).read_text().splitlines()}
        assert text in lines, f"{rel}: no line {text!r} any more ({why}): remove the entry"


def test_the_check_finds_each_kind_of_spelling(tmp_path):
    """The check fails on a module that spells a knob as code, and passes prose."""
    module = tmp_path / "m.py"
    module.write_text('"""Docstring naming max_batch_size."""\n'
                      'def f(max_queue_size, row, config):\n'
                      '    """max_batch_size in a docstring."""\n'
                      '    g(instance_count=1)\n'
                      '    help = "e.g. --set max_batch_size=8"  # prose\n'
                      '    return row["preferred_batch_size"], config.max_batch_size, max_queue_delay_microseconds\n')
    found = sorted((line, what) for line, what, _ in spellings(module, _words()))
    assert found == [(2, "parameter"), (4, "keyword"), (6, "attribute"), (6, "name"), (6, "string")]


@pytest.mark.parametrize("knob", space.ALL_KNOBS, ids=lambda k: k.name)
def test_every_knob_is_implemented_in_space(knob):
    """The other side: each knob's name is spelled in space.py, where it is defined."""
    assert f'"{knob.name}"' in (TUNER / "space.py").read_text()
