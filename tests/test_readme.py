"""The README says what the tree and the command line are: its study block is the quick start's file,
its Commands block names every flag of every command, its Layout table names every module, and every
relative link in it and in docs/ leads somewhere."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import yaml

from tuner.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    start = README.index(f"\n## {title}")
    end = README.find("\n## ", start + 1)
    return README[start:end if end > 0 else None]


def _leaves(parser: argparse.ArgumentParser, path: list[str]):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield " ".join(path), parser
        return
    for name, sub in subs[0].choices.items():
        yield from _leaves(sub, [*path, name])


def test_the_study_block_is_the_quick_starts_file():
    block = re.search(r"```yaml\n(.*?)```", _section("A study file"), re.S).group(1)
    assert yaml.safe_load(block) == yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())


COMMANDS = dict(_leaves(build_parser(), []))


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_commands_block_names_every_flag(command):
    parser = COMMANDS[command]
    block = re.search(r"```\n(.*?)```", _section("Commands"), re.S).group(1)
    lines = re.split(r"\n(?=tuner )", block)
    text = " ".join(line for line in lines if line.startswith(f"tuner {command} ") or line == f"tuner {command}")
    assert text, f"no line for tuner {command}"
    missing = [a.option_strings for a in parser._actions
               if a.option_strings and not isinstance(a, argparse._HelpAction)
               and not any(re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", text) for o in a.option_strings)]
    assert not missing


def test_the_layout_table_names_every_module():
    rows = [line for line in _section("Layout").splitlines() if line.startswith("| `tuner/")]
    named = set()
    for row in rows:
        cell, job = row.split(" | ", 1)
        paths = re.findall(r"`([^`]+)`", cell)
        named.update(paths)
        for package in (p for p in paths if p.endswith("/")):
            named.update(package + m for m in re.findall(r"`([\w./]+\.py)`", job))
            named.update(package + m for m in re.findall(r"`(\w+/)`", job))
    modules = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tuner").rglob("*.py"))
    unnamed = [m for m in modules if m not in named
               and not (m.endswith("/__init__.py") and m[: -len("__init__.py")] in named)]
    assert not unnamed


@pytest.mark.parametrize("page", ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))])
def test_relative_links_lead_somewhere(page):
    text = re.sub(r"```.*?```", "", (ROOT / page).read_text(), flags=re.S)
    broken = [link for link in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text)
              if not (ROOT / page).parent.joinpath(link).exists()]
    assert not broken
