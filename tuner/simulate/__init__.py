"""Simulate Triton's dynamic batcher on recorded traffic with a model profile, and rank a space (pure).

    simulate(requests, config, profile) -> BatchRun       one schedule through the batcher (_batcher)
    Simulator(traffic, profile, ...) / .for_study(...)    a study's steps, trials and ranking (_study)
        .step(config, speed) -> Measurement               what a real step at that speed measures
        .capacity(config) -> Capacity                     tuner.trial.find_capacity on simulated steps
        .trial(config) -> TrialResult                     feasibility at load, capacity, both scores
        .rank(configs) -> DataFrame                       a whole space, best first
    batcher_config(params, ...) -> BatcherConfig          from trial parameters (dicts) (_batcher)
    unmodelled(config) -> list[str]                       the config's settings not modelled (_support)
    check_modelled(config, source=)                       UnmodelledError naming them, in one line
    equal_shapes_of(config) -> bool                       only equal lengths batch (no ragged batching)
    queue_policy_of(config) -> dict                       its queue timeout settings (batcher_config's queue_policy)

The batcher's rules, with the Triton core functions they come from, are in `_batcher`'s docstring;
the profile (execution time by rows and padded length) is `Profile` (_profile: the data and its CSV,
`read_profile`, `write_profile`, its first line `FORMAT_LINE`; `tuner.profiler` measures one).
"""

from tuner.simulate._batcher import (
    OK,
    OUT_OF_MEMORY,
    QUEUE_FULL,
    STATUS_NAMES,
    TIMEOUT,
    TOO_LARGE,
    BatcherConfig,
    BatchRun,
    Requests,
    batcher_config,
    simulate,
)
from tuner.simulate._profile import (
    FORMAT_LINE,
    ExecutionSize,
    Profile,
    ProfilePoint,
    profile_text,
    read_profile,
    write_profile,
)
from tuner.simulate._study import (
    CONFIG_KEYS,
    SimStep,
    Simulator,
    config_row,
    length_column,
    measurement,
    study_space,
)
from tuner.simulate._support import (
    DECIDED,
    WALKED,
    check_modelled,
    equal_shapes_of,
    queue_policy_of,
    unmodelled,
)

__all__ = [
    "CONFIG_KEYS",
    "config_row",
    "ExecutionSize",
    "FORMAT_LINE",
    "Profile",
    "ProfilePoint",
    "profile_text",
    "read_profile",
    "write_profile",
    "OK",
    "OUT_OF_MEMORY",
    "QUEUE_FULL",
    "STATUS_NAMES",
    "TIMEOUT",
    "TOO_LARGE",
    "BatchRun",
    "BatcherConfig",
    "Requests",
    "SimStep",
    "Simulator",
    "batcher_config",
    "length_column",
    "measurement",
    "study_space",
    "simulate",
    "DECIDED",
    "WALKED",
    "check_modelled",
    "equal_shapes_of",
    "queue_policy_of",
    "unmodelled",
]
