"""The study YAML: examples load, unknown keys and bad values are named, the search section's
choices are checked."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tuner.errors import SettingsError
from tuner.settings import load_study, parse_host_port, study_from_dict

ROOT = Path(__file__).resolve().parent.parent
MINIMAL = {"name": "s", "model_repository": "models", "model": "m", "traffic": {"path": "t.csv"}}


@pytest.mark.parametrize("name", ["quickstart.yaml", "grid.yaml"])
def test_the_tuning_examples_load_with_paths_resolved(name):
    s = load_study(ROOT / "examples" / name)
    assert Path(s.model_repository) == ROOT / "model_repository_templates"
    assert Path(s.traffic.path).is_file()
    assert (Path(s.model_repository) / s.model / "config.pbtxt").is_file()
    # Re-measured more than once, so the recommendation carries a spread (the quick start uses 2
    # to stay under ten minutes; the default is 3).
    assert s.search.capacity.step_duration_s > 0 and s.search.remeasure_repeats >= 2


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


# --- server addresses ----------------------------------------------------------------------------

@pytest.mark.parametrize("url,why", [
    ("127.0.0.1:abc", "port 'abc' is not a number"),
    ("127.0.0.1:99999", "port 99999 is out of range"),
    ("127.0.0.1:0", "port 0 is out of range"),
    ("not a url:::", "no port"),
    ("localhost", "no port"),
    (":8000", "no host"),
    ("http://127.0.0.1:8000/v2/models", "no path"),
    ("ftp://127.0.0.1:8000", "scheme 'ftp://' is not http://"),
    ("::1:8000", "an IPv6 address goes in brackets"),
])
def test_a_bad_server_url_is_refused_at_load(url, why):
    data = {**MINIMAL, "server": {"launcher": "remote", "url": url}}
    with pytest.raises(SettingsError) as exc:
        study_from_dict(data, source="study.yaml")
    message = str(exc.value)
    assert message.startswith("study.yaml: server.url: expected host:port"), message
    assert "port in 1..65535" in message and f"but got {url!r} ({why}" in message, message


def test_a_bad_grpc_url_is_refused_at_load():
    data = {**MINIMAL, "server": {"launcher": "remote", "url": "127.0.0.1:8000", "grpc_url": "127.0.0.1:x"}}
    with pytest.raises(SettingsError, match=r"^study.yaml: server.grpc_url: .*port 'x' is not a number"):
        study_from_dict(data, source="study.yaml")


@pytest.mark.parametrize("text,schemes,expected", [
    ("127.0.0.1:8000", ("http",), ("127.0.0.1", 8000)),
    ("http://localhost:8000/", ("http",), ("localhost", 8000)),
    (" HTTP://triton-0.svc.cluster.local:65535 ", ("http",), ("triton-0.svc.cluster.local", 65535)),
    ("[::1]:8001", ("grpc",), ("[::1]", 8001)),
    ("grpc://10.0.0.7:8001", ("grpc",), ("10.0.0.7", 8001)),
])
def test_parse_host_port_keeps_the_address_usable_as_host_colon_port(text, schemes, expected):
    assert parse_host_port(text, where="x", schemes=schemes) == expected


def test_a_tune_with_a_bad_url_writes_nothing(tmp_path, capsys):
    from tuner.cli import main

    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({
        "name": "s", "model_repository": str(ROOT / "model_repository_templates"), "model": "encoder_sim",
        "traffic": {"path": str(ROOT / "traffic_profiles" / "bursty_60s.csv")},
        "server": {"launcher": "remote", "url": "127.0.0.1:abc"}, "output": "out"}))
    assert main(["tune", str(study)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"tuner: error: {study}: server.url: "), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.yaml"]
