"""The tuned knobs (tuner/space.py): drawing, the grid, writing them into a config and reading them
back, `--set`, and the checks before a study starts. Pure: no server (the slow test in
test_modelconfig.py has a real Triton accept what `space.apply` writes)."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest
import yaml
from google.protobuf import text_format

from tuner import modelconfig, space
from tuner.errors import ConfigError, SettingsError
from tuner.settings import FloatRange, IntRange, SearchSettings

ROOT = Path(__file__).resolve().parent.parent

BASE = """
name: "m"
backend: "python"
max_batch_size: 8
dynamic_batching { }
"""


def with_base(extra: str) -> modelconfig.ModelConfig:
    config = modelconfig.parse(BASE, "base")
    text_format.Merge(extra, config)
    return config


def _changed(a, b) -> dict[str, tuple]:
    return {path: (x, y) for path, x, y in modelconfig.diff_fields(a, b)}


# --- the space: what a study tunes ----------------------------------------------------------------


def test_only_the_knobs_a_study_ranges_are_tuned():
    assert [k.name for k in space.tuned(SearchSettings())] == ["max_batch_size", "max_queue_delay_microseconds"]
    every = SearchSettings(preferred_batch_size="search", instance_count=IntRange(1, 2), max_queue_size=IntRange(0, 64))
    assert [k.name for k in space.tuned(every)] == list(space.NAMES)


def test_suggest_draws_within_the_ranges_and_the_grid_walks_them():
    search = SearchSettings(max_batch_size=IntRange(1, 64, log=True), max_queue_delay_microseconds=IntRange(0, 4000, step=2000),
                            max_queue_size=IntRange(0, 100, step=50))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(20):
        params = space.suggest(study.ask(), search)
        assert 1 <= params["max_batch_size"] <= 64 and params["max_queue_delay_microseconds"] in (0, 2000, 4000)
        assert params["max_queue_size"] in (0, 50, 100)
    g = space.grid(search)
    assert g == {"max_batch_size": [1, 2, 4, 8, 16, 32, 64], "max_queue_delay_microseconds": [0, 2000, 4000],
                 "max_queue_size": [0, 50, 100]}
    assert space.grid_size(search) == 7 * 3 * 3
    finer = SearchSettings(max_batch_size=IntRange(1, 64, log=True), grid_per_octave=2)
    assert space.grid(finer)["max_batch_size"] == [1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64]


def test_grid_walks_log_ranges_in_powers_of_two_with_every_tuned_knob():
    search = SearchSettings(max_batch_size=IntRange(3, 40, log=True), max_queue_delay_microseconds=IntRange(0, 1000, step=500),
                            preferred_batch_size="search", instance_count=IntRange(1, 2))
    g = space.grid(search)
    assert g["max_batch_size"] == [3, 4, 8, 16, 32, 40] and g["max_queue_delay_microseconds"] == [0, 500, 1000]
    assert g["preferred_batch_size"] == ["none", "max", "powers_of_two"]
    assert space.grid_size(search) == 6 * 3 * 3 * 2


def test_a_trial_config_changes_only_the_tuned_fields_and_the_incumbent_reads_back():
    base = modelconfig.parse(
        'name: "m" max_batch_size: 64 dynamic_batching { } instance_group [ { count: 1, kind: KIND_CPU } ]', "x")
    search = SearchSettings(preferred_batch_size="powers_of_two", instance_count=IntRange(1, 2),
                            max_queue_size=IntRange(0, 64))
    assert space.from_config(base, search) == {"max_batch_size": 64, "max_queue_delay_microseconds": 0,
                                               "instance_count": 1, "max_queue_size": 0}
    config = space.apply(base, {"max_batch_size": 12, "max_queue_delay_microseconds": 500, "instance_count": 2,
                                "max_queue_size": 32}, search)
    assert set(_changed(base, config)) == {"max_batch_size", "dynamic_batching.max_queue_delay_microseconds",
                                           "dynamic_batching.preferred_batch_size", "instance_group[0].count",
                                           "dynamic_batching.default_queue_policy.max_queue_size"}
    assert list(config.dynamic_batching.preferred_batch_size) == [1, 2, 4, 8, 12]  # the study's strategy
    assert space.from_config(config, search) == {"max_batch_size": 12, "max_queue_delay_microseconds": 500,
                                                 "instance_count": 2, "max_queue_size": 32}
    assert space.deployed(config)["max_queue_size"] == 32
    assert space.config_fields(config)["dynamic_batching.default_queue_policy.max_queue_size"] == 32


def test_preferred_size_strategies():
    assert space.preferred_sizes("max", 8) == (8,) and space.preferred_sizes("none", 8) is None
    assert space.preferred_sizes("powers_of_two", 12) == (1, 2, 4, 8, 12)
    assert space.preferred_sizes((4, 8), 16) == (4, 8)
    searched = SearchSettings(preferred_batch_size="search")
    base = modelconfig.parse("max_batch_size: 8 dynamic_batching { preferred_batch_size: [8] }", "x")
    assert space.from_config(base, searched)["preferred_batch_size"] == "max"
    some = SearchSettings(preferred_batch_size=["none", "powers_of_two"], max_batch_size=IntRange(8, 8),
                          max_queue_delay_microseconds=IntRange(0, 0))
    assert space.grid(some)["preferred_batch_size"] == ["none", "powers_of_two"] and space.grid_size(some) == 2
    # a searched strategy is each configuration's own, never the study's
    config = space.apply(base, {"max_batch_size": 8, "preferred_batch_size": "powers_of_two"}, some)
    assert list(config.dynamic_batching.preferred_batch_size) == [1, 2, 4, 8]


# --- writing a config -----------------------------------------------------------------------------


def test_apply_changes_only_named_fields_and_leaves_input_alone():
    base = with_base(
        """
        dynamic_batching { preferred_batch_size: [2, 4] max_queue_delay_microseconds: 100 priority_levels: 2 default_priority_level: 1 }
        instance_group [ { kind: KIND_CPU count: 1 }, { kind: KIND_GPU gpus: [0] count: 2 } ]
        parameters { key: "k" value { string_value: "v" } }
        """
    )
    before = modelconfig.to_text(base)
    new = space.apply(base, {"max_batch_size": 16, "max_queue_delay_microseconds": 500,
                             "preferred_batch_size": (8, 16), "instance_count": 3})
    assert modelconfig.to_text(base) == before
    assert _changed(base, new) == {
        "max_batch_size": (8, 16),
        "dynamic_batching.max_queue_delay_microseconds": (100, 500),
        "dynamic_batching.preferred_batch_size": ([2, 4], [8, 16]),
        "instance_group[0].count": (1, 3),
        "instance_group[1].count": (2, 3),
    }
    assert space.apply(base, {}) == base


def test_apply_creates_blocks_that_are_missing():
    base = modelconfig.parse('name: "m" max_batch_size: 8', "x")
    new = space.apply(base, {"max_queue_delay_microseconds": 0, "instance_count": 2})
    assert new.HasField("dynamic_batching")  # present even with a zero delay
    assert _changed(base, new) == {"dynamic_batching": (None, {}), "instance_group[0].count": (None, 2)}
    assert new.instance_group[0].kind == 0  # KIND_AUTO: left to Triton


def test_smaller_max_batch_size_drops_preferred_sizes_that_no_longer_fit():
    # What Triton's auto-complete reports back: preferred_batch_size = [max_batch_size].
    base = modelconfig.parse("max_batch_size: 32 dynamic_batching { preferred_batch_size: [4, 32] }", "x")
    new = space.apply(base, {"max_batch_size": 8})
    assert list(new.dynamic_batching.preferred_batch_size) == [4]
    modelconfig.validate(new, "x")
    explicit = space.apply(base, {"max_batch_size": 8, "preferred_batch_size": (8,)})
    assert list(explicit.dynamic_batching.preferred_batch_size) == [8]


def test_apply_refuses_to_replace_the_sequence_batcher_and_unknown_knobs():
    base = modelconfig.parse('name: "seq" max_batch_size: 8 sequence_batching { }', "x")
    with pytest.raises(ConfigError, match="seq uses sequence_batching"):
        space.apply(base, {"max_queue_delay_microseconds": 10})
    with pytest.raises(ConfigError, match="seq uses sequence_batching"):
        space.apply(base, {"max_queue_size": 10})
    assert space.apply(base, {"max_batch_size": 4}).max_batch_size == 4
    with pytest.raises(ConfigError, match="unknown tuned field 'batch'"):
        space.apply(base, {"batch": 4})


# --- --set ----------------------------------------------------------------------------------------


def test_parse_assignments_all_keys():
    params = space.parse_assignments([
        "max_batch_size=16",
        "max_queue_delay_microseconds=2000",
        "preferred_batch_size=4, 8",
        "instance_group.count=2",
        "dynamic_batching.default_queue_policy.max_queue_size=100",
    ])
    assert params == {"max_batch_size": 16, "max_queue_delay_microseconds": 2000, "preferred_batch_size": (4, 8),
                      "instance_count": 2, "max_queue_size": 100}
    assert space.parse_assignments(["dynamic_batching.max_queue_delay_microseconds=0", "instance_count=1"]) == \
        {"max_queue_delay_microseconds": 0, "instance_count": 1}


@pytest.mark.parametrize(
    "items,named",
    [
        (["max_batch=8"], "'max_batch'"),
        (["max_batch_size"], "KEY=VALUE"),
        (["max_batch_size=eight"], "'eight' is not an integer"),
        (["max_batch_size=-1"], "max_batch_size=-1"),
        (["max_batch_size=4294967296"], "max_batch_size=4294967296"),
        (["max_queue_delay_microseconds=1.5"], "'1.5'"),
        (["preferred_batch_size=4,x"], "'x'"),
        (["preferred_batch_size=0"], "preferred_batch_size=0"),
        (["preferred_batch_size="], "comma list"),
        (["instance_count=0"], "instance_count=0"),
        (["max_queue_size=-1"], "max_queue_size=-1"),
        (["max_batch_size=8", "max_batch_size=4"], "more than once"),
    ],
)
def test_parse_assignments_rejects_by_name(items, named):
    with pytest.raises(ConfigError) as exc:
        space.parse_assignments(items)
    assert named in str(exc.value)


# --- before a study starts ------------------------------------------------------------------------


def test_a_model_that_cannot_batch_or_uses_another_scheduler_is_refused():
    with pytest.raises(ConfigError, match=r"x/config.pbtxt: max_batch_size is 0: this model does not batch"):
        space.check_tunable(modelconfig.parse("max_batch_size: 0", "x"), "x/config.pbtxt")
    with pytest.raises(ConfigError, match="uses sequence_batching, not dynamic_batching"):
        space.check_tunable(modelconfig.parse("max_batch_size: 4 sequence_batching { }", "x"), "x")
    space.check_tunable(modelconfig.parse("max_batch_size: 4", "x"), "x")
    # a streaming model that does not batch: a vLLM-backend model whose model.json is missing
    with pytest.raises(ConfigError, match="the model streams .decoupled., as a vLLM-backend model does, but its "
                                          "version directory holds no model.json"):
        space.check_tunable(modelconfig.parse("max_batch_size: 0 model_transaction_policy { decoupled: true }",
                                              "x"), "x")


def test_a_search_of_instance_count_over_several_instance_groups_is_refused_as_config_set_refuses_it():
    # a trial would set the GPU group and the CPU group to the same count: the split is the user's
    two = modelconfig.parse("max_batch_size: 4 instance_group [{ count: 1 kind: KIND_GPU }, "
                            "{ count: 3 kind: KIND_CPU }]", "x")
    with pytest.raises(ConfigError, match=r"^x: search.instance_count: the config has 2 instance groups "
                                          r"\(counts 1, 3\), and instance_count would set each to the same "
                                          r"count: leave instance_count out of the search, or keep one"):
        space.check_tunable(two, "x", search=SearchSettings(instance_count=IntRange(1, 4)))
    space.check_tunable(two, "x", search=SearchSettings())  # not searched: the groups stay as they are
    one = modelconfig.parse("max_batch_size: 4 instance_group [{ count: 2 kind: KIND_GPU gpus: [0, 1] }]", "x")
    space.check_tunable(one, "x", search=SearchSettings(instance_count=IntRange(1, 4)))


def test_the_space_narrows_to_fit_the_largest_request_or_refuses():
    search = SearchSettings(max_batch_size=IntRange(1, 64, log=True))
    same, note = space.fit_to_rows(search, 1, where="row 0", source="s.yaml")
    assert same == search and note == ""
    narrowed, note = space.fit_to_rows(search, 8, where="row 17", source="s.yaml")
    assert narrowed.max_batch_size == IntRange(8, 64, log=True)
    assert "low raised from 1 to 8" in note and "row 17" in note
    with pytest.raises(SettingsError, match=r"^s.yaml: search.max_batch_size: .*request of 65 rows \(row 3\).*at least 65"):
        space.fit_to_rows(search, 65, where="row 3", source="s.yaml")


def test_values_outside_the_ranges_are_named():
    search = SearchSettings(max_batch_size=IntRange(1, 64, log=True))
    assert space.outside({"max_batch_size": 128, "max_queue_delay_microseconds": 0}, search) == \
        ["max_batch_size 128 (search.max_batch_size: 1..64)"]
    assert space.outside({"max_batch_size": 64, "max_queue_delay_microseconds": 0}, search) == []


# --- a configuration as text, a diff, a table's row --------------------------------------------------


def test_a_configuration_is_written_as_text_one_way_in_three_forms():
    params = {"max_queue_delay_microseconds": 2000, "max_batch_size": 16, "preferred_batch_size": (4, 8)}
    assert space.describe(params) == "delay us 2000, batch 16, preferred 4,8"
    # as `--set` takes them, in the knobs' order (what parse_assignments reads back)
    assert space.describe(params, as_set=True) == \
        "max_batch_size=16, max_queue_delay_microseconds=2000, preferred_batch_size=4,8"
    assert space.parse_assignments(["max_batch_size=16", "max_queue_delay_microseconds=2000",
                                    "preferred_batch_size=4,8"]) == {
        "max_batch_size": 16, "max_queue_delay_microseconds": 2000, "preferred_batch_size": (4, 8)}
    assert space.describe({"instance_count": 2, "max_batch_size": 4}, as_set=True, code=True) == \
        "`max_batch_size=4`, `instance_count=2`"


def test_config_diff_compares_canonical_prints_of_configs_or_texts():
    old = with_base("")
    new = space.apply(old, {"max_batch_size": 4})
    lines = space.config_diff(old, new, old_name="a/config.pbtxt", new_name="b/config.pbtxt")
    assert lines[:2] == ["--- a/config.pbtxt", "+++ b/config.pbtxt"]
    assert "-max_batch_size: 8" in lines and "+max_batch_size: 4" in lines
    # a text is compared in its canonical print (its comments and layout are no change) ...
    text = "# a comment\n" + modelconfig.to_text(old).replace("max_batch_size: 8", "max_batch_size:    8")
    assert space.config_diff(text, old, old_name="a", new_name="b") == []
    # ... and a text that does not parse as it is
    assert space.config_diff("not a config {", "not a config {", old_name="a", new_name="b") == []
    assert "+x" in space.config_diff("not a config {", "not a config {\nx", old_name="a", new_name="b")


def test_values_are_read_from_a_table_row_and_a_config():
    row = {"max_batch_size": 8.0, "max_queue_delay_microseconds": 500, "preferred_batch_size": "4,8",
           "capacity_rps": 3.5}
    assert space.from_row(row) == {"max_batch_size": 8, "max_queue_delay_microseconds": 500,
                                   "preferred_batch_size": "4,8"}
    assert space.sizes_text(()) == "default" and space.sizes_text((4, 8)) == "4,8"
    bare = modelconfig.parse('name: "m"\nmax_batch_size: 8\n', "bare")  # no batcher, no instance group
    assert [space.value_in(bare, n) for n in space.NAMES] == [8, 0, (), 1, 0]
    full = with_base("instance_group { count: 3 }\ndynamic_batching { preferred_batch_size: [2, 4] "
                     "max_queue_delay_microseconds: 100 default_queue_policy { max_queue_size: 7 } }")
    assert [space.value_in(full, n) for n in space.NAMES] == [8, 100, (2, 4), 3, 7]
    # the constants name the knobs in their order
    assert (space.MAX_BATCH_SIZE, space.QUEUE_DELAY, space.PREFERRED, space.INSTANCES, space.QUEUE_SIZE) == \
        space.NAMES


# --- vLLM's continuous-batching knobs (engine arguments in model.json) ----------------------------

ENGINE_SEARCH = SearchSettings(max_batch_size=None, max_queue_delay_microseconds=None,
                               max_num_seqs=IntRange(8, 64, log=True), max_num_batched_tokens=IntRange(512, 2048, log=True),
                               enable_chunked_prefill=[True, False], kv_cache_gib=IntRange(1, 4))


def test_the_engine_knobs_are_drawn_gridded_and_described():
    assert [k.name for k in space.tuned(ENGINE_SEARCH)] == [
        "max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "kv_cache_gib"]
    assert space.grid(ENGINE_SEARCH) == {"max_num_seqs": [8, 16, 32, 64], "max_num_batched_tokens": [512, 1024, 2048],
                                         "enable_chunked_prefill": [True, False], "kv_cache_gib": [1, 2, 3, 4]}
    assert space.grid_size(ENGINE_SEARCH) == 4 * 3 * 2 * 4
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(10):
        params = space.suggest(study.ask(), ENGINE_SEARCH)
        assert 8 <= params["max_num_seqs"] <= 64 and params["enable_chunked_prefill"] in (True, False)
    text = space.describe({"max_num_seqs": 32, "enable_chunked_prefill": False, "kv_cache_gib": 2})
    assert text == "seqs 32, chunked prefill false, kv cache GiB 2"
    assert space.describe({"kv_cache_gib": 2, "max_num_seqs": 32}, as_set=True) == "max_num_seqs=32, kv_cache_gib=2"


def test_a_range_of_numbers_is_gridded_by_its_step_or_in_points():
    from tuner.settings import FloatRange
    stepped = SearchSettings(gpu_memory_utilization=FloatRange(0.5, 0.9, step=0.2))
    assert space.grid(stepped)["gpu_memory_utilization"] == [0.5, 0.7, 0.9]
    points = space.grid(SearchSettings(gpu_memory_utilization=FloatRange(0.5, 0.9)))["gpu_memory_utilization"]
    assert len(points) == space.GRID_POINTS and points[0] == 0.5 and points[-1] == 0.9
    trial = optuna.create_study().ask()
    assert 0.5 <= space.suggest(trial, stepped)["gpu_memory_utilization"] <= 0.9


def test_a_trial_splits_into_its_config_and_its_model_json():
    params = {"max_batch_size": 8, "max_num_seqs": 16, "kv_cache_gib": 2}
    config, engine = space.split(params)
    assert config == {"max_batch_size": 8} and engine == {"max_num_seqs": 16, "kv_cache_gib": 2}
    base = {"model": "tiny", "max_num_seqs": 4, "kv_cache_memory_bytes": 2**30}
    args = space.apply_engine(base, engine)
    assert args == {"model": "tiny", "max_num_seqs": 16, "kv_cache_memory_bytes": 2 * 2**30}
    assert base["max_num_seqs"] == 4  # a copy
    assert "kv_cache_memory_bytes" not in space.apply_engine(base, {"kv_cache_gib": 0})  # 0: vLLM's own size
    with pytest.raises(ConfigError, match="kv_cache_gib: a vLLM engine argument: it goes in the model's model.json"):
        space.apply(with_base(""), params)
    with pytest.raises(ConfigError, match=r"max_num_batched_tokens \(8\) must be greater than or equal to"):
        space.apply_engine(base, {"max_num_seqs": 16, "max_num_batched_tokens": 8})


def test_the_incumbents_engine_knobs_are_its_model_json_or_vllms_defaults():
    from tuner.llm import engineargs
    engine = engineargs.resolved({"max_num_seqs": 48, "kv_cache_memory_bytes": 3 * 2**30}, "cpu")
    assert space.from_config(with_base(""), ENGINE_SEARCH, engine=engine) == {
        "max_num_seqs": 48, "max_num_batched_tokens": 2048, "enable_chunked_prefill": True, "kv_cache_gib": 3}
    assert space.from_config(with_base(""), ENGINE_SEARCH, engine=engineargs.resolved({}))["kv_cache_gib"] == 0
    with pytest.raises(ConfigError, match="engine arguments"):
        space.from_config(with_base(""), ENGINE_SEARCH)
    assert space.outside({"max_num_seqs": 128, "kv_cache_gib": 0}, ENGINE_SEARCH) == [
        "max_num_seqs 128 (search.max_num_seqs: 8..64)", "kv_cache_gib 0 (search.kv_cache_gib: 1..4)"]


def test_a_study_tunes_the_knobs_of_its_models_kind():
    engine_only = SearchSettings(max_num_seqs=IntRange(8, 64))
    narrowed = space.study_space(engine_only, vllm=True, source="s.yaml")
    assert [k.name for k in space.tuned(narrowed)] == ["max_num_seqs"]
    assert space.study_space(SearchSettings(), vllm=False, source="s.yaml") == SearchSettings()
    with pytest.raises(SettingsError, match="s.yaml: search.max_batch_size: Triton's dynamic batcher does nothing on "
                                            r"a vLLM-backend model \(vLLM handles the batching\)"):
        space.study_space(SearchSettings(max_batch_size=IntRange(1, 8), max_num_seqs=IntRange(8, 64)),
                          vllm=True, source="s.yaml")
    with pytest.raises(SettingsError, match="search.instance_count: Triton's dynamic batcher does nothing"):
        space.study_space(SearchSettings(instance_count=IntRange(1, 2), max_num_seqs=IntRange(8, 64)),
                          vllm=True, source="s.yaml")
    with pytest.raises(SettingsError, match="give a range to at least one of max_num_seqs"):
        space.study_space(SearchSettings(), vllm=True, source="s.yaml")
    with pytest.raises(SettingsError, match="search.max_num_seqs: a vLLM engine argument .* not a vLLM-backend model"):
        space.study_space(engine_only, vllm=False, source="s.yaml")


def test_set_takes_the_engine_knobs_by_name_or_path():
    assert space.parse_assignments(["max_num_seqs=64", "model.json:enable_chunked_prefill=false",
                                    "gpu_memory_utilization=0.8"]) == {
        "max_num_seqs": 64, "enable_chunked_prefill": False, "gpu_memory_utilization": 0.8}
    with pytest.raises(ConfigError, match="expected true or false"):
        space.parse_assignments(["enable_chunked_prefill=maybe"])
    with pytest.raises(ConfigError, match="0 < value <= 1 must hold"):
        space.parse_assignments(["gpu_memory_utilization=1.5"])
    with pytest.raises(ConfigError, match="1 <= value"):
        space.parse_assignments(["max_num_seqs=0"])


def test_a_table_row_gives_each_engine_knob_its_type():
    row = {"max_num_seqs": "32", "enable_chunked_prefill": "False", "gpu_memory_utilization": "0.85"}
    assert space.from_row(row, space.ENGINE_KNOBS) == {
        "max_num_seqs": 32, "enable_chunked_prefill": False, "gpu_memory_utilization": 0.85}


def test_a_value_outside_a_knobs_choices_is_refused_naming_it_as_the_study_file_spells_it():
    search = SearchSettings(max_num_seqs=IntRange(2, 8), enable_chunked_prefill=(False,))
    with pytest.raises(SettingsError, match=r"^search.enable_chunked_prefill: production's enable_chunked_prefill "
                                            r"is true, not one of the choices \[false\]: .* add true to"):
        space.check_choices({"max_num_seqs": 64, "enable_chunked_prefill": True}, search, whose="production's")
    # a number outside its range is measured with a note instead (`outside`)
    space.check_choices({"max_num_seqs": 64, "enable_chunked_prefill": False}, search, whose="the incumbent's")


def test_a_zero_queue_size_on_a_config_without_a_queue_policy_writes_nothing():
    # 0 is unbounded, what no queue policy already means: a "keep it" recommendation shows no change
    base = modelconfig.parse('name: "m" max_batch_size: 8 dynamic_batching { }', "x")
    assert _changed(base, space.apply(base, {"max_queue_size": 0})) == {}
    bare = modelconfig.parse('name: "m" max_batch_size: 8', "x")
    assert _changed(bare, space.apply(bare, {"max_queue_size": 0})) == {}
    # a policy the config has is set, to 0 too
    bounded = modelconfig.parse('max_batch_size: 8 dynamic_batching { default_queue_policy { max_queue_size: 16 } }',
                                "x")
    assert _changed(bounded, space.apply(bounded, {"max_queue_size": 0})) == {
        "dynamic_batching.default_queue_policy.max_queue_size": (16, None)}  # proto3: 0 is unset
    assert _changed(base, space.apply(base, {"max_queue_size": 32})) == {
        "dynamic_batching.default_queue_policy.max_queue_size": (None, 32)}


def test_the_incumbent_is_its_config_as_it_is_and_a_fixed_setting_applies_to_the_trials():
    # the encoder_sim template: `dynamic_batching { }`, no queue policy, no instance group
    base = modelconfig.parse('name: "m" max_batch_size: 8 dynamic_batching { }', "x")
    search = SearchSettings(max_batch_size=IntRange(4, 64, log=True), preferred_batch_size="powers_of_two",
                            max_queue_size=IntRange(0, 64), instance_count=IntRange(1, 2))
    incumbent = space.from_config(base, search)
    assert space.apply(base, incumbent, search) == base
    trial = space.apply(base, {**incumbent, space.MAX_BATCH_SIZE: 16}, search)
    assert list(trial.dynamic_batching.preferred_batch_size) == [1, 2, 4, 8, 16]  # the study's strategy
    # nor is a config without a dynamic batcher given one as the incumbent
    bare = modelconfig.parse('name: "m" max_batch_size: 8', "x")
    assert space.apply(bare, space.from_config(bare, search), search) == bare


@pytest.mark.parametrize("search,vllm,named", [
    (SearchSettings(max_batch_size=IntRange(1, 3_000_000_000)), False,
     "search.max_batch_size: max_batch_size takes 0..2147483647, but the range is 1..3000000000"),
    (SearchSettings(max_queue_delay_microseconds=IntRange(0, 2**64)), False,
     f"search.max_queue_delay_microseconds: dynamic_batching.max_queue_delay_microseconds takes 0..{2**64 - 1}, "
     f"but the range is 0..{2**64}"),
    (SearchSettings(instance_count=IntRange(1, 2**31)), False, "search.instance_count: instance_group.count takes "),
    (SearchSettings(max_num_seqs=IntRange(8, 2**40)), True, "search.max_num_seqs: model.json:max_num_seqs takes "),
])
def test_a_range_beyond_its_knobs_own_bounds_is_refused_in_one_line(search, vllm, named):
    # the bounds `--set` holds a value to (Knob.bounds): before, a trial crashed writing the value mid-study
    with pytest.raises(SettingsError) as exc:
        space.study_space(search, vllm=vllm, source="s.yaml")
    assert str(exc.value).startswith(f"s.yaml: {named}"), exc.value
    within = SearchSettings(max_batch_size=IntRange(1, 2**31 - 1), max_queue_delay_microseconds=IntRange(0, 2**64 - 1))
    assert space.study_space(within, vllm=False, source="s.yaml") == within


def test_the_grid_of_a_wide_range_is_counted_not_listed():
    # tune --check counts the grid for every sampler: a MemoryError / OverflowError building the list before
    wide = SearchSettings(max_batch_size=IntRange(1, 64, log=True), max_queue_delay_microseconds=IntRange(0, 2**64 - 1))
    assert space.grid_size(wide) == 7 * 2**64
    stepped = SearchSettings(max_batch_size=IntRange(1, 10, step=3), max_queue_delay_microseconds=IntRange(0, 10**15, step=500))
    assert space.grid_size(stepped) == 4 * (2 * 10**12 + 1)
    small = SearchSettings(max_batch_size=IntRange(1, 10, step=3), max_queue_delay_microseconds=IntRange(0, 1000, step=500),
                           gpu_memory_utilization=FloatRange(0.5, 0.9, step=0.1))
    assert space.grid_size(small) == 4 * 3 * 5 == math.prod(len(v) for v in space.grid(small).values())


def test_tune_check_refuses_a_range_beyond_its_knobs_bounds_in_one_line(tmp_path, capsys):
    from tuner.cli import main

    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({
        "name": "s", "model_repository": str(ROOT / "model_repository_templates"), "model": "encoder_sim",
        "traffic": {"path": str(ROOT / "traffic_profiles" / "bursty_60s.csv")}, "output": str(tmp_path / "out"),
        "search": {"max_batch_size": {"low": 1, "high": 3_000_000_000}}}))
    (tmp_path / "profile.csv").write_text("rows,padded_len,ms\n")
    # simulate and profile too: they list (or profile) every batch size of the range before anything else
    for argv in (["tune", str(study), "--check"], ["simulate", str(study), "--profile", str(tmp_path / "profile.csv")],
                 ["profile", str(study)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"tuner: error: {study}: search.max_batch_size: max_batch_size "
                                                       f"takes 0..2147483647"), (argv, err)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["profile.csv", "study.yaml"]


def test_the_space_narrowed_to_fit_a_request_keeps_the_users_steps():
    # the points 1, 4, 7, 10 and requests of 5 rows: 7 and 10 take them (not 5 and 8, which the user never gave)
    search = SearchSettings(max_batch_size=IntRange(1, 10, step=3))
    narrowed, note = space.fit_to_rows(search, 5, where="row 2", source="s.yaml")
    assert narrowed.max_batch_size == IntRange(7, 10, step=3) and space.grid(narrowed)["max_batch_size"] == [7, 10]
    assert "low raised from 1 to 7: the traffic has requests of 5 rows (row 2)" in note
    assert space.fit_to_rows(search, 7, where="row 2", source="s.yaml")[0].max_batch_size == IntRange(7, 10, step=3)
    assert space.fit_to_rows(search, 10, where="row 2", source="s.yaml")[0].max_batch_size == IntRange(10, 10, step=3)
