"""The study files the benchmarks ship (benchmarks/*.yaml) stay valid: each passes the dry run, and each
grid holds the configurations its header counts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tuner import space
from tuner.cli import main
from tuner.settings import read_study

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
STUDIES = sorted(BENCHMARKS.glob("*.yaml"))


def test_there_are_benchmark_studies():
    assert {p.name for p in STUDIES} >= {"encoder_torch_cpu_grid.yaml", "encoder_sim_wide_grid.yaml"}


@pytest.mark.parametrize("study", STUDIES, ids=lambda p: p.name)
def test_each_passes_the_dry_run_and_its_grid_is_the_size_its_header_says(study, capsys, tmp_path):
    assert main(["tune", str(study), "--check", "--output", str(tmp_path / "out")]) == 0
    assert "ok (nothing was started)" in capsys.readouterr().out
    header = study.read_text().split("\nname:")[0]
    assert f"benchmarks/{study.name}" in header, "its header says how to run it"
    said = re.search(r"\((\d+) configurations and the incumbent", header.replace("\n#", ""))
    settings = read_study(study)
    assert settings.search.sampler == "grid" and said, "a grid study says how many configurations it holds"
    assert space.grid_size(settings.search) == int(said[1])
    # the wider space: more than batch size x delay
    assert {"instance_count", "max_queue_size"} <= set(space.grid(settings.search))
