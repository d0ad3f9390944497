"""Every Triton setting is modelled by the batcher simulation or refused by name (tuner/simulate/_support.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tuner import modelconfig
from tuner.errors import UnmodelledError
from tuner.modelconfig import ModelConfig
from tuner.simulate import DECIDED, WALKED, check_modelled, equal_shapes_of, unmodelled

ROOT = Path(__file__).resolve().parent.parent

# A config using only what the simulation models: the tuned knobs, ragged variable dims, fixed dims, and
# settings that do not change batching (warm-up, parameters, outputs, kind).
MODELLED = """
name: "m" backend: "python" max_batch_size: 16
input [ { name: "IDS" data_type: TYPE_INT32 dims: [ -1 ] allow_ragged_batch: true },
        { name: "MASK" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 500
                   default_queue_policy { max_queue_size: 32 } preserve_ordering: true }
instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]
parameters { key: "p" value { string_value: "1" } }
model_warmup [ { name: "w" batch_size: 1 inputs { key: "IDS" value { data_type: TYPE_INT32 dims: [ 4 ] zero_data: true } } } ]
response_cache { enable: false }
"""

# Each refused setting, the smallest config that uses it, and the name the refusal must give.
REFUSED = [
    ("dynamic_batching { priority_levels: 2 default_priority_level: 1 }", "dynamic_batching.priority_levels"),
    ("dynamic_batching { priority_levels: 2 default_priority_level: 1 }", "dynamic_batching.default_priority_level"),
    ("dynamic_batching { priority_queue_policy { key: 1 value { max_queue_size: 4 } } }",
     "dynamic_batching.priority_queue_policy"),
    ("dynamic_batching { preserve_ordering: true } instance_group [ { count: 2 } ]",
     "dynamic_batching.preserve_ordering with 2 instances"),
    ("dynamic_batching { preserve_ordering: true } instance_group [ { count: 1 }, { count: 1 } ]",
     "dynamic_batching.preserve_ordering with 2 instances"),
    ("response_cache { enable: true }", "response_cache.enable"),
    ("sequence_batching { }", "sequence_batching"),
    ('platform: "ensemble" ensemble_scheduling { step [ { model_name: "a" model_version: -1 } ] }',
     "ensemble_scheduling"),
    ('input [ { name: "S" data_type: TYPE_INT32 dims: [ 1 ] is_shape_tensor: true } ]', "input.is_shape_tensor"),
    ('instance_group [ { rate_limiter { resources [ { name: "r" count: 1 } ] } } ]', "instance_group.rate_limiter"),
    ("instance_group [ { passive: true } ]", "instance_group.passive"),
    ("instance_group [ { gpus: [ 0, 1 ] } ]", "instance_group.gpus more than one GPU in a group"),
    ("optimization { eager_batching: true }", "optimization.eager_batching"),
    ("model_transaction_policy { decoupled: true }", "model_transaction_policy.decoupled"),
]


def config(text: str) -> ModelConfig:
    return modelconfig.parse(f'name: "m" max_batch_size: 8 {text}')


def test_a_config_using_only_modelled_settings_is_accepted():
    assert unmodelled(modelconfig.parse(MODELLED)) == []
    check_modelled(modelconfig.parse(MODELLED), source="m/config.pbtxt")  # no error


@pytest.mark.parametrize(("text", "name"), REFUSED)
def test_each_refused_setting_is_named(text, name):
    assert name in "; ".join(unmodelled(config(text)))
    with pytest.raises(UnmodelledError) as raised:
        check_modelled(config(text), source="m/config.pbtxt")
    message = str(raised.value)
    assert message.startswith("m/config.pbtxt: ") and name in message and "\n" not in message
    assert raised.value.exit_code == 2


def test_variable_dims_without_ragged_batching_are_modelled_as_equal_shape_batching():
    fixed = config('input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] } ]')
    ragged = config('input [ { name: "A" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]')
    equal = config('input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, '
                   '{ name: "B" data_type: TYPE_FP32 dims: [ 2, -1 ] } ]')
    assert [unmodelled(c) for c in (fixed, ragged, equal)] == [[], [], []]
    assert [equal_shapes_of(c) for c in (fixed, ragged, equal)] == [False, False, True]


def test_settings_at_their_defaults_are_not_used():
    assert unmodelled(config("dynamic_batching { priority_levels: 0 default_queue_policy { "
                             "default_timeout_microseconds: 0 timeout_action: REJECT } } response_cache { }"
                             " optimization { eager_batching: false }")) == []


def test_preserve_ordering_is_refused_when_the_space_tries_more_than_one_instance():
    one = config("dynamic_batching { preserve_ordering: true } instance_group [ { count: 1 } ]")
    assert unmodelled(one) == []
    assert unmodelled(one, instances=3) == ["dynamic_batching.preserve_ordering with 3 instances"]


def test_every_refused_setting_of_one_config_is_named_once_in_one_line():
    text = ('input [ { name: "S" data_type: TYPE_INT32 dims: [ 1 ] is_shape_tensor: true } ] '
            'response_cache { enable: true } dynamic_batching { priority_levels: 2 } '
            'optimization { eager_batching: true }')
    found = unmodelled(config(text))
    assert found == ["input.is_shape_tensor", "optimization.eager_batching", "dynamic_batching.priority_levels",
                     "response_cache.enable"]


def _fields(descriptor, prefix=""):
    for field in descriptor.fields:
        path = prefix + field.name
        if path in WALKED:
            yield from _fields(field.message_type, f"{path}.")
        else:
            yield path


def test_every_field_of_tritons_schema_is_decided():
    """Walked over the installed schema: a field Triton adds must be decided in _support (and the README)."""
    assert sorted(set(_fields(ModelConfig.DESCRIPTOR)) - set(DECIDED)) == []
    assert sorted(set(DECIDED) - set(_fields(ModelConfig.DESCRIPTOR))) == []  # no stale entry


def test_a_field_not_decided_is_refused(monkeypatch):
    from tuner.simulate import _support

    warmed = config('model_warmup [ { name: "w" batch_size: 1 } ]')
    assert unmodelled(warmed) == []
    monkeypatch.delitem(_support.IGNORED, "model_warmup")  # as if a newer schema had added it
    assert unmodelled(warmed) == ["model_warmup"]


@pytest.mark.parametrize("model", ["encoder_sim", "encoder_torch", "matmul_cpu"])
def test_the_templates_use_only_modelled_settings(model):
    assert unmodelled(modelconfig.load(ROOT / "model_repository_templates" / model / "config.pbtxt")) == []


def test_the_readme_table_lists_every_setting_with_its_verdict():
    readme = (ROOT / "README.md").read_text()
    listed = {}
    for cell, verdict in re.findall(r"^\| (`[^|]+) \| (modelled|ignored|refused) \|", readme, flags=re.M):
        for path in re.findall(r"`([a-z_.]+)`", cell):
            assert path not in listed, f"{path} listed twice"
            listed[path] = verdict
    assert listed == {path: verdict for path, (verdict, _) in DECIDED.items()}


def test_a_queue_timeout_is_modelled_and_read_into_the_simulated_batcher():
    from tuner.simulate import BatcherConfig, batcher_config, queue_policy_of

    timed = config("dynamic_batching { default_queue_policy { default_timeout_microseconds: 1000 "
                   "timeout_action: DELAY allow_timeout_override: true } }")
    assert unmodelled(timed) == []
    policy = queue_policy_of(timed)
    assert policy == {"default_timeout_microseconds": 1000, "timeout_action": "delay", "allow_timeout_override": True}
    batcher = batcher_config({"max_batch_size": 8}, queue_policy=policy)
    assert batcher == BatcherConfig(max_batch_size=8, default_timeout_microseconds=1000, timeout_action="delay",
                                    allow_timeout_override=True)
    assert not batcher.prefetching  # any queue policy: no batches formed ahead (PriorityQueue::PriorityQueue)


def test_several_instance_groups_are_refused_one_group_of_any_count_is_modelled():
    """Triton runs every group's instances; the simulation one group's (it read the first group's count
    and simulated two groups of one instance as one instance)."""
    base = modelconfig.load(ROOT / "model_repository_templates" / "encoder_sim" / "config.pbtxt")
    two = modelconfig.load(ROOT / "model_repository_templates" / "encoder_sim" / "config.pbtxt")
    del two.instance_group[:]
    two.instance_group.add(count=1)
    two.instance_group.add(count=1)
    assert unmodelled(two) == ["instance_group (2 groups: the simulation runs one group's instances)"]
    with pytest.raises(UnmodelledError, match=r"does not model instance_group \(2 groups"):
        check_modelled(two, source="config.pbtxt")
    one = modelconfig.load(ROOT / "model_repository_templates" / "encoder_sim" / "config.pbtxt")
    del one.instance_group[:]
    one.instance_group.add(count=2)
    assert unmodelled(one) == [] and unmodelled(base) == []
