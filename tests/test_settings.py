"""The study YAML: examples load, unknown keys and bad values are named, the search section's
choices are checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.errors import SettingsError
from tuner.settings import load_study, study_from_dict

ROOT = Path(__file__).resolve().parent.parent
MINIMAL = {"name": "s", "model_repository": "models", "model": "m", "traffic": {"path": "t.csv"}}


@pytest.mark.parametrize("name", ["quickstart.yaml", "grid.yaml"])
def test_the_tuning_examples_load_with_paths_resolved(name):
    s = load_study(ROOT / "examples" / name)
    assert Path(s.model_repository) == ROOT / "model_repository_templates"
    assert Path(s.traffic.path).is_file()
    assert (Path(s.model_repository) / s.model / "config.pbtxt").is_file()
    assert s.search.capacity.step_duration_s > 0 and s.search.remeasure_repeats >= 3


def test_defaults_and_the_search_section():
    s = study_from_dict(MINIMAL)
    assert s.scoring == "capacity" and s.search.sampler == "tpe" and s.search.preferred_batch_size == "none"
    assert s.search.max_batch_size.log and s.search.top_k == 3 and s.search.remeasure_repeats == 3
    tuned = study_from_dict({**MINIMAL, "search": {"preferred_batch_size": "search", "sampler": "grid",
                                                   "instance_count": {"low": 1, "high": 2}}})
    assert tuned.search.preferred_batch_size == "search" and tuned.search.instance_count.high == 2


@pytest.mark.parametrize("data,message", [
    ({"search": {"sampler": "cmaes"}}, "search.sampler: must be one of tpe, gp, random, grid, got 'cmaes'"),
    ({"scoring": "latency"}, "scoring: must be one of capacity, utilization"),
    ({"search": {"preferred_batch_size": "all"}}, "search.preferred_batch_size: must be one of"),
    ({"search": {"max_batch_size": {"low": 8, "high": 4}}},
     "search.max_batch_size: 1 <= low <= high must hold, but got (low=8, high=4)"),
    ({"search": {"capacity": {"tolerance": 0}}}, "search.capacity.tolerance: must be > 0"),
    ({"search": {"capcity": {}}}, "search.capcity: unknown key"),
    ({"cost": {"price_per_hour": -1}}, "cost.price_per_hour: must be > 0"),
    ({"search": {"trials": "many"}}, "search.trials: expected an integer"),
])
def test_bad_values_are_named(data, message):
    with pytest.raises(SettingsError) as exc:
        study_from_dict({**MINIMAL, **data}, source="study.yaml")
    assert message in str(exc.value) and str(exc.value).startswith("study.yaml: ")
