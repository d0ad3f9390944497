"""Keyword-only past the first few, as Optuna (`create_study(*, ...)`) and Locust (`Environment(*, ...)`)
do: no function or method of tuner takes more than three positional parameters, and no dataclass of
more than six fields is built positionally (`kw_only=True`). A call then names what it passes, and a
parameter added or reordered cannot silently take another's value."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_POSITIONAL = 3
MAX_POSITIONAL_FIELDS = 6
# hooks whose caller is a library that passes them positionally (Optuna's sampler interface)
LIBRARY_HOOKS = {"after_trial", "before_trial", "sample_independent", "sample_relative",
                 "infer_relative_search_space"}
SOURCES = sorted((ROOT / "tuner").rglob("*.py"))


def _functions(tree: ast.Module):
    for parent in ast.walk(tree):
        for node in ast.iter_child_nodes(parent):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield parent, node


def _positional(parent: ast.AST, node: ast.FunctionDef) -> list[str]:
    names = [a.arg for a in node.args.posonlyargs + node.args.args]
    static = any(ast.unparse(d) == "staticmethod" for d in node.decorator_list)
    if isinstance(parent, ast.ClassDef) and names and names[0] in ("self", "cls") and not static:
        names = names[1:]
    return names


def _dataclass(node: ast.ClassDef) -> ast.expr | None:
    for deco in node.decorator_list:
        if ast.unparse(deco.func if isinstance(deco, ast.Call) else deco).split(".")[-1] == "dataclass":
            return deco
    return None


def long_positional_functions(paths, root: Path = ROOT) -> list[str]:
    """`path:line name(params)` of every function taking more than MAX_POSITIONAL positional parameters."""
    out = []
    for path in paths:
        for parent, node in _functions(ast.parse(path.read_text())):
            names = _positional(parent, node)
            if len(names) > MAX_POSITIONAL and node.args.vararg is None and node.name not in LIBRARY_HOOKS:
                out.append(f"{path.relative_to(root)}:{node.lineno} {node.name}({', '.join(names)})")
    return out


def positional_dataclasses(paths, root: Path = ROOT) -> list[str]:
    """`path:line name (n fields)` of every dataclass of more than MAX_POSITIONAL_FIELDS fields not kw_only."""
    out = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef) or (deco := _dataclass(node)) is None:
                continue
            fields = [s for s in node.body if isinstance(s, ast.AnnAssign) and "ClassVar" not in ast.unparse(s.annotation)]
            kw_only = isinstance(deco, ast.Call) and any(
                k.arg == "kw_only" and ast.unparse(k.value) == "True" for k in deco.keywords)
            if len(fields) > MAX_POSITIONAL_FIELDS and not kw_only:
                out.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({len(fields)} fields)")
    return out


def test_no_function_takes_more_than_three_positional_parameters():
    assert long_positional_functions(SOURCES) == []


def test_no_dataclass_of_more_than_six_fields_is_built_positionally():
    assert positional_dataclasses(SOURCES) == []


@pytest.mark.parametrize("source, found", [
    ("def f(a, b, c, d): ...", 1),
    ("def f(a, b, c, *, d): ...", 0),
    ("class K:\n    def m(self, a, b, c): ...", 0),
    ("class K:\n    def m(self, a, b, c, d): ...", 1),
    ("class K:\n    @staticmethod\n    def m(self, a, b, c): ...", 1),
    ("def f(*args): ...", 0),
    ("class S:\n    def after_trial(self, study, trial, state, values): ...", 0),
])
def test_the_function_rule_sees_what_it_names(tmp_path, source, found):
    path = tmp_path / "m.py"
    path.write_text(source)
    assert len(long_positional_functions([path], root=tmp_path)) == found


def test_the_dataclass_rule_sees_what_it_names(tmp_path):
    fields = "".join(f"    f{i}: int = 0\n" for i in range(7))
    path = tmp_path / "m.py"
    path.write_text("from dataclasses import dataclass\n@dataclass(frozen=True)\nclass D:\n" + fields)
    assert positional_dataclasses([path], root=tmp_path) == ["m.py:3 D (7 fields)"]
    path.write_text("from dataclasses import dataclass\n@dataclass(frozen=True, kw_only=True)\nclass D:\n" + fields)
    assert positional_dataclasses([path], root=tmp_path) == []
