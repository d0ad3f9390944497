"""Every shipped example does what its header says: its dry run passes here, and the ones meant for
this machine (a local server) run a short tune to the end. The full runs, with the times their
headers state, are the project's to measure (the README's figures)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tuner.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
STUDIES = sorted(p for p in EXAMPLES.glob("*.yaml") if "study" not in yaml.safe_load(p.read_text()))
NIGHTLY = sorted(p for p in EXAMPLES.glob("*.yaml") if "study" in yaml.safe_load(p.read_text()))
# meant for this machine: a local server and a template that needs nothing more (encoder_torch needs
# PyTorch and is meant for a GPU host: its header says so, its dry run runs here; the LLM quick start's
# short tune is tests/llm/test_tune.py, which checks its outputs in tokens too)
LOCAL = [p for p in STUDIES if (yaml.safe_load(p.read_text()).get("server") or {}).get("launcher", "local") == "local"
         and yaml.safe_load(p.read_text())["model"] not in ("encoder_torch", "llm_vllm")]


def test_there_are_examples_of_each_kind():
    assert {p.name for p in LOCAL} >= {"quickstart.yaml", "quickstart_model.yaml", "encoder_sim_bursty.yaml",
                                       "encoder_sim_flash_crowd.yaml"}
    assert [p.name for p in NIGHTLY] == ["nightly.yaml"] and "gpu_study.yaml" in {p.name for p in STUDIES}


@pytest.mark.parametrize("example", STUDIES, ids=lambda p: p.name)
def test_the_dry_run_of_every_study_passes_and_starts_nothing(example, capsys, tmp_path):
    header = example.read_text().split("\nname:")[0]
    assert "tuner tune examples/" in header and ("minutes" in header or "hours" in header), \
        f"{example.name}: its header says how to run it and how long it takes"
    output = tmp_path / "out"
    assert main(["tune", str(example), "--check", "--output", str(output)]) == 0
    out = capsys.readouterr().out
    assert "ok (nothing was started)" in out and not output.exists()


def test_the_dry_run_of_the_model_strategy_says_what_it_will_measure(capsys, tmp_path):
    assert main(["tune", str(EXAMPLES / "quickstart_model.yaml"), "--check", "--output", str(tmp_path / "o")]) == 0
    search = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("search"))
    assert "model: profile measured first" in search and "top 3 measured" in search, search
    assert "tpe up to 8 trials" in search and "top 2 re-measured 2x" in search, search


@pytest.mark.parametrize("example", NIGHTLY, ids=lambda p: p.name)
def test_the_dry_run_of_the_nightly_example_passes(example, capsys):
    assert main(["nightly", str(example), "--check"]) == 0
    assert "ok (nothing was started)" in capsys.readouterr().out


def cheapest(example: Path, tmp: Path) -> Path:
    """The example with two trials, one short capacity step after the load's, no repeat of a close call,
    short warm-up windows and replay leads, on the traffic's busiest minute, its paths made absolute."""
    study = yaml.safe_load(example.read_text())
    for key in ("model_repository",):
        study[key] = str((EXAMPLES / study[key]).resolve())
    study["traffic"]["path"] = str((EXAMPLES / study["traffic"]["path"]).resolve())
    # the busiest minute (the whole of a shorter recording): longer than any step replays here (at most
    # 2 s of wall time at the highest speed one capacity step reaches), and the model strategy simulates
    # it, not the whole hour
    if not any(k in study["traffic"] for k in ("since", "until", "start_s", "duration_s")):
        study["traffic"]["busiest_s"] = 60
    study["output"] = str(tmp / example.stem)
    search = study.setdefault("search", {})
    search.update(trials=2, top_k=1, remeasure_repeats=1)
    search["capacity"] = {**search.get("capacity", {}), "step_duration_s": 1.0, "max_steps": 1}
    study["replay"] = {**study.get("replay", {}), "warmup_s": 0.5}
    study["measurement"] = {"window_s": 0.5, "warmup_max_s": 8, "max_repeats": 1}
    path = tmp / example.name
    path.write_text(yaml.safe_dump(study))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("example", LOCAL, ids=lambda p: p.name)
def test_every_local_example_runs_a_short_tune_to_the_end(example, tmp_path, capsys):
    code = main(["tune", str(cheapest(example, tmp_path)), "--quiet"])
    captured = capsys.readouterr()
    assert code in (0, 3), captured.out + captured.err  # 3: two trials found nothing under the SLA yet
    summary = json.loads((tmp_path / example.stem / "summary.json").read_text())
    counts = summary["trials"]
    assert counts["complete"] + counts["pruned"] + counts["unmeasured"] + counts["unstable"] == 2, counts
    assert (tmp_path / example.stem / "report.html").is_file()
