"""Which of a model's config.pbtxt settings the batcher simulation models, and which it does not (pure).

Every field of Triton's `ModelConfig` is decided here: MODELLED (the tuned knobs, `tuner.space.KNOBS`,
and what the simulation reads besides them), IGNORED (no effect on which requests batch together or
when: the profile times the model as configured) or REFUSED. The schema is walked field by field
(`ModelConfig.DESCRIPTOR`), so a field a newer Triton adds is refused until it is decided here.
A field at its default value is not "used" and never refused.

    unmodelled(config, instances=) -> list[str]   the settings used that the simulation does not model
    equal_shapes_of(config) -> bool                whether Triton batches only requests of equal shape
    check_modelled(config, source=, instances=)   UnmodelledError naming them, in one line
    queue_policy_of(config) -> dict                 its queue timeout settings, as BatcherConfig names them
    DECIDED                                        every field path and its verdict (the README's table)
    WALKED                                         the messages whose fields are decided one by one
"""

from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from tuner import space
from tuner.errors import UnmodelledError
from tuner.modelconfig import ModelConfig

__all__ = ["DECIDED", "IGNORED", "MODELLED", "REFUSED", "WALKED", "check_modelled", "equal_shapes_of",
           "queue_policy_of", "unmodelled"]

# Messages walked into: each of their fields is decided on its own.
WALKED = ("input", "optimization", "dynamic_batching", "dynamic_batching.default_queue_policy",
           "instance_group", "model_transaction_policy", "response_cache")

MODELLED: dict[str, str] = {
    **{knob.path: "a tuned knob" for knob in space.KNOBS},
    "input.allow_ragged_batch": "requests of different lengths batch together, padded to the longest",
    "input.dims": "fixed dims; variable (-1) with allow_ragged_batch batches any lengths, padded to the "
                  "longest; without it only equal lengths batch together (`BatcherConfig.equal_shapes`)",
    "dynamic_batching.preserve_ordering": "with one instance (responses leave in order anyway)",
    "instance_group.gpus": "one GPU per group (Triton makes `count` instances on each GPU listed)",
    "dynamic_batching.default_queue_policy.default_timeout_microseconds":
        "a request queued longer is rejected (an error) or delayed behind the others, as `timeout_action` says",
    "dynamic_batching.default_queue_policy.timeout_action": "REJECT (an error) or DELAY",
    "dynamic_batching.default_queue_policy.allow_timeout_override":
        "the replay sets no request timeout; like any queue policy it stops batches forming ahead",
}

IGNORED: dict[str, str] = {
    **{name: "which model and backend run: the profile times them" for name in (
        "name", "platform", "backend", "runtime", "default_model_filename", "cc_model_filenames")},
    "version_policy": "which versions load; the study sends to one",
    "output": "what the model returns",
    "batch_input": "tensors Triton builds from a formed batch; they do not change which requests batch",
    "batch_output": "how a batch's output is split back; not batching",
    **{f"input.{name}": "the tensor's name, type and layout; not batching" for name in (
        "name", "data_type", "format", "reshape", "is_non_linear_format_io")},
    "input.optional": "the replay sends every input",
    **{f"optimization.{name}": "how an execution runs: the profile times it as configured" for name in (
        "graph", "priority", "cuda", "execution_accelerators", "input_pinned_memory", "output_pinned_memory",
        "gather_kernel_buffer_threshold")},
    **{f"instance_group.{name}": "where an instance runs: the profile is measured there" for name in (
        "name", "kind", "secondary_devices", "profile", "host_policy")},
    **{name: "not batching" for name in (
        "metric_tags", "parameters", "model_warmup", "model_operations", "model_repository_agents",
        "model_metrics")},
}

REFUSED: dict[str, str] = {
    "input.is_shape_tensor": "Triton batches only requests with equal shape-tensor values",
    "optimization.eager_batching": "forms the next batch before an instance is free",
    "dynamic_batching.priority_levels": "priority queues",
    "dynamic_batching.default_priority_level": "priority queues",
    "dynamic_batching.priority_queue_policy": "priority queues",
    "sequence_batching": "the sequence batcher, not the dynamic one",
    "ensemble_scheduling": "an ensemble: its steps are other models' batchers",
    "instance_group.rate_limiter": "instances wait for the rate limiter's resources",
    "instance_group.passive": "a passive instance takes no requests",
    "model_transaction_policy.decoupled": "responses are not one per request",
    "response_cache.enable": "a cached response skips the batcher",
}

# What makes a conditionally modelled field refused (the MODELLED entry says when it is modelled).
_WHEN_REFUSED = {
    "dynamic_batching.preserve_ordering": "with {instances} instances",
    "instance_group.gpus": "more than one GPU in a group",
}

DECIDED: dict[str, tuple[str, str]] = {
    **{path: ("modelled", why) for path, why in MODELLED.items()},
    **{path: ("ignored", why) for path, why in IGNORED.items()},
    **{path: ("refused", why) for path, why in REFUSED.items()},
}


def unmodelled(config: ModelConfig, *, instances: int | None = None) -> list[str]:
    """The settings `config` uses that the simulation does not model, each as config.pbtxt spells it
    (a field path, with what makes it unmodelled when that depends on its value). `instances`: the most
    instances per group a simulated configuration runs (the instance count a trial writes into every
    group), which `preserve_ordering` depends on; the config's own counts count as well."""
    groups = config.instance_group
    own = sum(max(group.count, 1) for group in groups) if groups else 1  # count 0 is Triton's default, 1
    instances = max(own, (instances or 0) * max(len(groups), 1))
    # several groups: the simulation runs one group's instances (a trial's count, or the first group's)
    found = [f"instance_group ({len(groups)} groups: the simulation runs one group's instances)"] if len(groups) > 1 else []
    _walk(config, prefix="", found=found, instances=instances)
    return list(dict.fromkeys(found))  # one mention per setting, in the schema's order


def check_modelled(config: ModelConfig, *, source: str, instances: int | None = None) -> None:
    """Raise UnmodelledError (exit 2) naming, in one line, each setting of `config` (read from
    `source`) that the simulation does not model."""
    found = unmodelled(config, instances=instances)
    if found:
        raise UnmodelledError(
            f"{source}: the batcher simulation does not model {'; '.join(found)}: search.strategy model, "
            f"tuner simulate and tuner profile refuse this config (search.strategy measure tunes it)")


def equal_shapes_of(config: ModelConfig) -> bool:
    """Whether Triton batches only requests of equal shape: an input with a variable dim (-1) and no
    `allow_ragged_batch` (the dynamic batcher's `enforce_equal_shape_tensors_`)."""
    return any(-1 in i.dims and not i.allow_ragged_batch for i in config.input)


def queue_policy_of(config: ModelConfig) -> dict:
    """The timeout settings of `config`'s `dynamic_batching.default_queue_policy`, as `BatcherConfig`
    names them (`max_queue_size` is a tuned knob, read with the others)."""
    policy = config.dynamic_batching.default_queue_policy
    return {"default_timeout_microseconds": int(policy.default_timeout_microseconds),
            "timeout_action": "delay" if policy.timeout_action == type(policy).DELAY else "reject",
            "allow_timeout_override": bool(policy.allow_timeout_override)}


def _walk(message: Message, *, prefix: str, found: list[str], instances: int) -> None:
    for field in message.DESCRIPTOR.fields:
        path = prefix + field.name
        if path in IGNORED or not _used(message, field):
            continue
        values = list(getattr(message, field.name)) if _repeated(field) else [getattr(message, field.name)]
        if path in WALKED:
            for value in values:
                _walk(value, prefix=f"{path}.", found=found, instances=instances)
        elif path in _WHEN_REFUSED:
            if _refused_here(path, message, instances):
                found.append(f"{path} {_WHEN_REFUSED[path].format(instances=instances)}")
        elif path not in MODELLED:  # refused, or a field not decided yet (a newer schema)
            found.append(path)


def _refused_here(path: str, message: Message, instances: int) -> bool:
    if path == "dynamic_batching.preserve_ordering":
        return instances > 1
    return len(message.gpus) > 1  # instance_group.gpus


def _repeated(field: FieldDescriptor) -> bool:
    flag = getattr(field, "is_repeated", None)  # protobuf >= 5.29, which deprecates `label`
    return flag if isinstance(flag, bool) else field.label == FieldDescriptor.LABEL_REPEATED


def _used(message: Message, field: FieldDescriptor) -> bool:
    """Whether a field is set away from its default: a list or map not empty, a message present (an
    empty `sequence_batching { }` turns the sequence batcher on), a scalar not its default."""
    value = getattr(message, field.name)
    if _repeated(field):
        return len(value) > 0
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return message.HasField(field.name)
    return value != field.default_value
