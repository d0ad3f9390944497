"""The study YAML: examples load, unknown keys and bad values are named, the search section's
choices are checked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tuner.errors import SettingsError
from tuner.settings import parse_host_port, parse_yaml, read_study, study_from_dict

ROOT = Path(__file__).resolve().parent.parent
MINIMAL = {"name": "s", "model_repository": "models", "model": "m", "traffic": {"path": "t.csv"}}


@pytest.mark.parametrize("name", ["quickstart.yaml", "grid.yaml"])
def test_the_tuning_examples_load_with_paths_resolved(name):
    s = read_study(ROOT / "examples" / name)
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
    some = study_from_dict({**MINIMAL, "search": {"preferred_batch_size": ["none", "powers_of_two"]}})
    assert some.search.preferred_batch_size == ["none", "powers_of_two"]


@pytest.mark.parametrize("data,message", [
    ({"search": {"sampler": "cmaes"}}, "search.sampler: must be one of tpe, gp, random, grid, got 'cmaes'"),
    ({"scoring": "latency"}, "scoring: must be one of capacity, utilization"),
    ({"search": {"preferred_batch_size": "all"}}, "search.preferred_batch_size: must be one of"),
    ({"search": {"preferred_batch_size": ["none", "search"]}},
     "search.preferred_batch_size: a list must name distinct choices among none, max, powers_of_two, got"),
    ({"search": {"preferred_batch_size": ["max", "max"]}}, "search.preferred_batch_size: a list must name distinct"),
    ({"search": {"preferred_batch_size": []}}, "search.preferred_batch_size: a list must name distinct"),
    ({"search": {"max_batch_size": {"low": 8, "high": 4}}},
     "search.max_batch_size: 1 <= low <= high must hold, but got (low=8, high=4)"),
    ({"search": {"capacity": {"tolerance": 0}}}, "search.capacity.tolerance: must be > 0"),
    ({"search": {"capacity": {"max_steps": 0}}}, "search.capacity.max_steps: must be > 0"),
    ({"search": {"capacity": {"tolerance": 3}}}, "search.capacity.tolerance: the bracket's relative width, a "
                                                 "fraction in (0, 1], got 3"),
    ({"search": {"capacity": {"start_speed": 10, "max_speed": 8}}},
     "search.capacity.start_speed 10 is above max_speed 8"),
    ({"search": {"max_queue_delay_microseconds": {"low": 0, "high": 8000, "step": 3000}}},
     "search.max_queue_delay_microseconds: high=8000 is not low + a whole number of steps of 3000 (the search "
     "would never try it): e.g. high 6000 or step 4000"),
    ({"search": {"capcity": {}}}, "search.capcity: unknown key (did you mean capacity? expected one of: "),
    ({"sla": {"latncy_ms": 5}}, "sla.latncy_ms: unknown key (did you mean latency_ms? expected one of: latency_ms, "),
    # the file's own path is the loader's to set: not a key, and not listed as one
    ({"source": "elsewhere.yaml"}, "source: unknown key (did you mean storage? expected one of: name, "
                                   "model_repository, model, traffic, server, replay, measurement, sla, cost, "
                                   "scoring, search, output, storage)"),
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


@pytest.mark.parametrize("server,key", [
    ({"shm_size": "1 gig"}, "server.shm_size: expected a size such as 256m or 1g"),
    ({"gpus": "banana"}, "server.gpus: expected 'all', a count or device ids"),  # not a device id for the runtime
    ({"gpus": "-1"}, "server.gpus: expected"), ({"gpus": -1}, "server.gpus: expected"),
    ({"gpus": [0, -1]}, "server.gpus: expected"),
])
def test_a_docker_size_or_gpu_list_it_cannot_read_is_refused_at_load(server, key):
    with pytest.raises(SettingsError, match=rf"^study.yaml: {re.escape(key)}"):
        study_from_dict({**MINIMAL, "server": {"launcher": "docker", **server}}, source="study.yaml")
    for fine in ({"shm_size": "1g"}, {"shm_size": "1.5gb"}, {"gpus": "all"}, {"gpus": 2}, {"gpus": "0,1"},
                 {"gpus": "device=1,2"}, {"gpus": [0, 3]}):
        study_from_dict({**MINIMAL, "server": {"launcher": "docker", **fine}}, source="study.yaml")


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


# --- values no range check sees, keys given twice, files too large, paths the OS refuses -------------

def _study_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text("name: s\nmodel_repository: models\nmodel: m\ntraffic: {path: t.csv}\n" + text)
    return path


@pytest.mark.parametrize("text,key,value", [
    ("sla: {latency_ms: .nan}", "sla.latency_ms", "nan"),
    ("search: {model_error: .nan}", "search.model_error", "nan"),
    ("search: {timeout_s: .inf}", "search.timeout_s", "inf"),
    ("replay: {warmup_s: -.inf}", "replay.warmup_s", "-inf"),
    ("sla: {percentile: .nan}", "sla.percentile", "nan"),
    ("cost: {price_per_hour: 1.0e+400}", "cost.price_per_hour", "inf"),
    ("cost: {price_per_hour: 1e300000}", "cost.price_per_hour", "inf"),
])
def test_nan_and_infinity_are_refused_naming_the_key(tmp_path, text, key, value):
    with pytest.raises(SettingsError) as exc:
        read_study(_study_file(tmp_path, text + "\n"))
    assert str(exc.value) == f"{tmp_path / 'study.yaml'}: {key}: expected a finite number, got {value}"


def test_a_number_in_exponent_form_is_a_number_as_yaml_1_2_reads_it():
    # PyYAML's YAML 1.1 wants a dot and a signed exponent; without the resolver these were strings
    text = "a: 1e3\nb: 2.5e-3\nc: -1E+2\nd: .5e1\ne: 1e3x\nf: '1e3'\ng: 1.5\nh: 12\ni: 1_000e1\n"
    assert parse_yaml(text, "s.yaml") == {"a": 1000.0, "b": 0.0025, "c": -100.0, "d": 5.0, "e": "1e3x",
                                          "f": "1e3", "g": 1.5, "h": 12, "i": 10000.0}


def test_a_latency_limit_written_2e2_is_200_ms(tmp_path):
    assert read_study(_study_file(tmp_path, "sla: {latency_ms: 2e2}\n")).sla.latency_ms == 200


@pytest.mark.parametrize("seed", [-1, 2**32, 2**40])
def test_a_seed_optuna_would_refuse_is_refused_at_load(seed):
    with pytest.raises(SettingsError, match=rf"^study.yaml: search.seed: must be in 0..4294967295, got {seed}$"):
        study_from_dict({**MINIMAL, "search": {"seed": seed}}, source="study.yaml")
    assert study_from_dict({**MINIMAL, "search": {"seed": 2**32 - 1}}).search.seed == 2**32 - 1


@pytest.mark.parametrize("text,where,key,first", [
    ("sla: {latency_ms: 200}\nsla: {latency_ms: 7}\n", "6:1", "sla", 5),
    ("sla: {latency_ms: 200, latency_ms: 7}\n", "5:24", "latency_ms", 5),
    ("search:\n  trials: 5\n  capacity: {tolerance: 0.1}\n  trials: 50\n", "8:3", "trials", 6),
])
def test_a_key_given_twice_is_refused_with_its_line(tmp_path, text, where, key, first):
    path = _study_file(tmp_path, text)
    with pytest.raises(SettingsError) as exc:
        read_study(path)
    assert str(exc.value) == f"{path}:{where}: invalid YAML: duplicate key {key!r} (first on line {first})"


def test_a_merge_may_still_override_a_key():
    text = "base: &sla {latency_ms: 200, percentile: 95}\nsla: {<<: *sla, latency_ms: 50}\n"
    assert parse_yaml(text, "study.yaml")["sla"] == {"latency_ms": 50, "percentile": 95}


def test_a_huge_yaml_is_refused_by_its_size_before_it_is_parsed(tmp_path):
    import time

    path = tmp_path / "study.yaml"
    with open(path, "wb") as fh:
        fh.truncate(50 * 2**20)  # 50 MiB, sparse
    started = time.monotonic()
    with pytest.raises(SettingsError, match=r"study.yaml: too large \(50.0 MiB; at most 1.0 MiB is read\)$"):
        read_study(path)
    assert time.monotonic() - started < 1.0


def _bad_path(tmp_path: Path, case: str) -> Path:
    if case == "a symbolic-link loop":
        (tmp_path / "loop.csv").symlink_to("loop.csv")
        return tmp_path / "loop.csv"
    if case == "a name too long":
        return tmp_path / ("t" * 300 + ".csv")
    (tmp_path / "a-file").write_text("x")
    return tmp_path / "a-file" / "t.csv"


CASES = ["a symbolic-link loop", "a name too long", "a file where a directory is expected"]
REASONS = {"a symbolic-link loop": "Too many levels of symbolic links", "a name too long": "File name too long",
           "a file where a directory is expected": "Not a directory"}


@pytest.mark.parametrize("key", ["traffic.path", "model_repository", "search.profile", "output"])
@pytest.mark.parametrize("case", CASES)
def test_a_path_in_the_study_the_os_refuses_is_one_line_naming_the_key(tmp_path, key, case):
    bad = _bad_path(tmp_path, case)
    section, _, name = key.rpartition(".")
    data = {**MINIMAL, section: {**MINIMAL.get(section, {}), name: bad.name if case != "a file where a " \
            "directory is expected" else "a-file/t.csv"}} if section else {**MINIMAL, key: str(bad)}
    with pytest.raises(SettingsError) as exc:
        study_from_dict(data, base_dir=tmp_path, source="study.yaml")
    assert str(exc.value).startswith(f"study.yaml: {key}: {bad}: {REASONS[case]}"), exc.value


@pytest.mark.parametrize("case", CASES)
def test_tune_of_a_study_whose_traffic_the_os_refuses_is_one_line(tmp_path, capsys, case):
    from tuner.cli import main

    bad = _bad_path(tmp_path, case)
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({**MINIMAL, "traffic": {"path": str(bad)}, "output": "out"}))
    for argv in (["tune", str(study)], ["tune", str(study), "--check"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"tuner: error: {study}: traffic.path: {bad}: "), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", CASES)
def test_a_study_file_the_os_refuses_is_one_line(tmp_path, case):
    bad = _bad_path(tmp_path, case).with_suffix(".yaml")
    if case == "a symbolic-link loop":
        bad.symlink_to(bad.name)
    with pytest.raises(SettingsError, match=rf"^{re.escape(str(bad))}: cannot read \({REASONS[case]}\)"):
        read_study(bad)


def test_the_nightly_settings_refuse_keys_given_twice_nan_and_paths_the_os_refuses(tmp_path):
    from tuner.nightly.settings import load_nightly

    nightly = tmp_path / "nightly.yaml"
    (tmp_path / "loop").symlink_to("loop")
    for text, message in (
        ("study: s.yaml\ntraffic: {path: t}\nstudy: t.yaml\n", ":3:1: invalid YAML: duplicate key 'study' "
         "(first on line 1)"),
        ("study: s.yaml\ntraffic: {path: t, hours: .nan}\n", ": traffic.hours: expected a finite number, got nan"),
        ("study: loop\ntraffic: {path: t}\n", f": study: {tmp_path / 'loop'}: Too many levels of symbolic links"),
        ("study: s.yaml\ntraffic: {path: t}\nsource: elsewhere.yaml\n", ": source: unknown key (expected one of: "
         "study, traffic, study_overrides, output, production, search, confirm, drift)"),  # the loader's
    ):
        nightly.write_text(text)
        with pytest.raises(SettingsError) as exc:
            load_nightly(nightly)
        assert str(exc.value) == f"{nightly}{message}"


def _range_study(tmp_path: Path, traffic: str) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(f"name: s\nmodel_repository: models\nmodel: m\ntraffic: {{path: t.csv, {traffic}}}\n")
    return path


def test_a_date_range_reads_unquoted_yaml_dates_and_is_the_only_window(tmp_path):
    study = read_study(_range_study(tmp_path, "since: 2026-11-25T06:00:00, until: '2026-11-26'"))
    assert (study.traffic.since, study.traffic.until) == ("2026-11-25T06:00:00", "2026-11-26")
    assert read_study(_range_study(tmp_path, "since: 1764050400")).traffic.since == 1764050400.0


@pytest.mark.parametrize("traffic,expected", [
    ("since: yesterday", "traffic.since: cannot read 'yesterday' as a date and time"),
    ("since: 2026-11-26, until: 2026-11-25", "traffic.until must come after traffic.since"),
    ("since: 2026-11-25, busiest_s: 600", "give since/until or busiest_s or start_s/duration_s"),
    ("until: 2026-11-25, duration_s: 600", "give since/until or busiest_s or start_s/duration_s"),
])
def test_a_bad_date_range_is_one_line_naming_it(tmp_path, traffic, expected):
    path = _range_study(tmp_path, traffic)
    with pytest.raises(SettingsError) as exc:
        read_study(path)
    assert str(exc.value).startswith(f"{path}: ") and expected in str(exc.value) and "\n" not in str(exc.value)


# --- a generative study: the engine knobs' ranges and the token SLA --------------------------------


def test_the_engine_knobs_ranges_load():
    s = study_from_dict({**MINIMAL, "search": {
        "max_num_seqs": {"low": 8, "high": 256, "log": True}, "max_num_batched_tokens": {"low": 512, "high": 8192},
        "enable_chunked_prefill": [True, False], "kv_cache_gib": {"low": 1, "high": 4}}})
    assert s.search.max_num_seqs.log and s.search.enable_chunked_prefill == [True, False]
    assert s.search.kv_cache_gib.high == 4 and s.search.gpu_memory_utilization is None
    gpu = study_from_dict({**MINIMAL, "cost": {"gpu": "h100"},
                           "search": {"gpu_memory_utilization": {"low": 0.5, "high": 0.95, "step": 0.05}}})
    assert gpu.search.gpu_memory_utilization.step == 0.05


@pytest.mark.parametrize("data,message", [
    ({"search": {"max_num_seqs": {"low": 0, "high": 8}}}, "search.max_num_seqs: 1 <= low <= high must hold"),
    ({"search": {"enable_chunked_prefill": [True, True]}}, "search.enable_chunked_prefill: a list of distinct choices"),
    ({"search": {"enable_chunked_prefill": ["yes"]}}, "search.enable_chunked_prefill[0]: expected true or false"),
    ({"search": {"gpu_memory_utilization": {"low": 0.5, "high": 0.9}}},
     "search.gpu_memory_utilization: the server is a CPU (cost.gpu: cpu); size its KV cache with search.kv_cache_gib"),
    ({"cost": {"gpu": "CPU"}, "search": {"gpu_memory_utilization": {"low": 0.5, "high": 0.9}}},
     "search.gpu_memory_utilization: the server is a CPU (cost.gpu: cpu)"),  # the price table's case aside
    ({"cost": {"gpu": "h100"}, "search": {"gpu_memory_utilization": {"low": 0.5, "high": 1.5}}},
     "search.gpu_memory_utilization: 0 < low <= high <= 1 must hold"),
    ({"cost": {"gpu": "h100"}, "search": {"gpu_memory_utilization": {"low": 0.5, "high": 0.9},
                                          "kv_cache_gib": {"low": 1, "high": 2}}},
     "search: give either gpu_memory_utilization or kv_cache_gib, not both"),
    ({"sla": {"ttft_ms": 0}}, "sla.ttft_ms: must be > 0"),
    ({"sla": {"tpot_ms": -5}}, "sla.tpot_ms: must be > 0"),
])
def test_bad_engine_ranges_and_token_limits_are_named(data, message):
    with pytest.raises(SettingsError) as exc:
        study_from_dict({**MINIMAL, **data}, source="study.yaml")
    assert message in str(exc.value) and str(exc.value).startswith("study.yaml: ")


def test_a_study_keeps_the_sla_of_its_kind():
    from tuner.settings import check_generative
    generative = study_from_dict({**MINIMAL, "sla": {"ttft_ms": 500, "tpot_ms": 50, "percentile": 99}})
    check_generative(generative, generative=True)
    check_generative(study_from_dict({**MINIMAL, "sla": {"tpot_ms": 50}}), generative=True)  # either one
    check_generative(study_from_dict(MINIMAL), generative=False)
    check_generative(study_from_dict({**MINIMAL, "sla": {"e2e_ms": 20000}}), generative=True)  # or end to end
    with pytest.raises(SettingsError, match="sla.e2e_ms: a token limit"):
        check_generative(study_from_dict({**MINIMAL, "sla": {"e2e_ms": 20000}}), generative=False)
    with pytest.raises(SettingsError, match="a generative study .* needs sla.ttft_ms, sla.tpot_ms and/or sla.e2e_ms"):
        check_generative(study_from_dict(MINIMAL), generative=True)
    with pytest.raises(SettingsError, match="sla.ttft_ms: a token limit, for a generative study"):
        check_generative(generative, generative=False)


@pytest.mark.parametrize("written", [100, 2000])
def test_an_encoders_latency_limit_in_a_generative_study_is_refused_even_at_its_default(written):
    from tuner.settings import check_generative, with_overrides
    study = study_from_dict({**MINIMAL, "sla": {"ttft_ms": 500, "latency_ms": written}}, source="study.yaml")
    with pytest.raises(SettingsError, match=r"^<study>: sla.latency_ms: the encoder.s limit, not used"):
        check_generative(study, generative=True)
    unwritten = study_from_dict({**MINIMAL, "sla": {"ttft_ms": 500}})
    check_generative(unwritten, generative=True)
    # an override of another key keeps the default unwritten; one of latency_ms writes it
    check_generative(with_overrides(unwritten, {"sla.percentile": 95}), generative=True)
    with pytest.raises(SettingsError, match="sla.latency_ms: the encoder's limit"):
        check_generative(with_overrides(unwritten, {"sla.latency_ms": 100}), generative=True)
    assert unwritten.sla.latency_ms == 100 and f"{unwritten.sla.latency_ms:g}" == "100"


@pytest.mark.parametrize("url,ok", [("http://127.0.0.1:9002/metrics", True), ("http://127.0.0.1:9002/metrics/", True),
                                    ("127.0.0.1:9002", False), ("http://127.0.0.1/metrics", False),
                                    ("https://127.0.0.1:9002/metrics", False)])
def test_a_remote_servers_metrics_url_is_an_http_metrics_endpoint(url, ok):
    data = {**MINIMAL, "server": {"launcher": "remote", "url": "127.0.0.1:9000", "metrics_url": url}}
    if ok:
        assert study_from_dict(data).server.metrics_url == url
    else:
        with pytest.raises(SettingsError, match="server.metrics_url: expected"):
            study_from_dict(data, source="study.yaml")


@pytest.mark.parametrize("search,key", [
    ({"max_batch_size": {"low": 1, "high": 64, "log": True, "step": 4}}, "search.max_batch_size"),
    ({"max_queue_size": {"low": 1, "high": 64, "log": True, "step": 3}}, "search.max_queue_size"),
    ({"gpu_memory_utilization": {"low": 0.5, "high": 0.9, "log": True, "step": 0.1}}, "search.gpu_memory_utilization"),
])
def test_a_log_range_with_a_step_is_refused_not_its_step_dropped(search, key):
    # the search would draw on the log scale and ignore the step (Optuna refuses the two together)
    with pytest.raises(SettingsError) as exc:
        study_from_dict({**MINIMAL, "cost": {"gpu": "h100"}, "search": search}, source="study.yaml")
    assert str(exc.value).startswith(f"study.yaml: {key}: a log range takes no step"), exc.value
    assert "\n" not in str(exc.value)
    # the same range without the step (or with Optuna's step 1) loads
    plain = {name: {k: v for k, v in r.items() if k != "step"} for name, r in search.items()}
    study_from_dict({**MINIMAL, "cost": {"gpu": "h100"}, "search": plain}, source="study.yaml")
    study_from_dict({**MINIMAL, "search": {"max_batch_size": {"low": 1, "high": 64, "log": True, "step": 1}}})


def test_a_null_max_batch_size_is_refused_at_load_where_a_null_delay_is_not_tuned(tmp_path):
    # every encoder study sizes its batches from the range (the traffic's largest request, a profile's rows)
    path = _study_file(tmp_path, "search: {max_batch_size: null}\n")
    with pytest.raises(SettingsError) as exc:
        read_study(path)
    assert str(exc.value).startswith(f"{path}: search.max_batch_size: null: give a range"), exc.value
    held = _study_file(tmp_path, "search: {max_batch_size: {low: 16, high: 16}, max_queue_delay_microseconds: null}\n")
    assert read_study(held).search.max_queue_delay_microseconds is None


def test_a_study_without_an_output_writes_to_runs_of_its_name_beside_it(tmp_path):
    # every such study shared runs/study: a second one's resume check refused it, or mixed their outputs
    from tuner.settings import read_study

    for name in ("alpha", "beta/gamma"):
        path = tmp_path / f"{name.replace('/', '-')}.yaml"
        path.write_text(yaml.safe_dump({"name": name, "model_repository": ".", "model": "m",
                                        "traffic": {"path": "t.csv"}}))
        assert read_study(path).output == str(tmp_path / "runs" / name.replace("/", "_"))


@pytest.mark.parametrize("given, resolved", [
    ("sqlite:///mine.db", "sqlite:///{dir}/mine.db"),        # relative to the study file, as its other paths
    ("sqlite:///../up.db", "sqlite:///{parent}/up.db"),
    ("sqlite:////abs/x.db", "sqlite:////abs/x.db"),
    ("study.journal", "{dir}/study.journal"),
    ("postgresql://tuner@db:5432/tuner", "postgresql://tuner@db:5432/tuner"),
])
def test_a_study_storage_file_is_relative_to_the_study_file(tmp_path, given, resolved):
    # it was taken relative to the working directory: from another folder, another database
    from tuner.settings import read_study

    folder = tmp_path / "s"
    folder.mkdir()
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump({"name": "x", "model_repository": ".", "model": "m", "traffic": {"path": "t.csv"},
                                    "storage": given}))
    assert read_study(path).storage == resolved.format(dir=folder, parent=tmp_path)
