"""An EMULATED GPU running a transformer encoder (BERT-base), for tuning on a machine without a GPU.

Nothing here computes an encoder: each execution sleeps for the time the emulated GPU would take for the
batch's padded tokens (rows x longest sequence in the batch), read from a published latency table in
`parameters` (see README.md), steeper past a memory-bound point and failing like an out-of-memory past a
padded-token budget. All instances share one emulated GPU: executions are serialized across the instance
processes with an fcntl lock, while the per-request host work (pre/post-processing) runs outside it (or,
with the `gpus` parameter, instances take N emulated GPUs in turn, as Triton spreads KIND_GPU instances).

What a real GPU does over time is emulated too (README.md gives the formulas): a cold start (an instance's
first executions after its load are slower, and so is the first execution of each new shape bucket),
optionally memory fragmentation (the padded-token budget shrinks and compute time creeps up with the
model's executions since load) and a compute time that never settles.
"""

import fcntl
import json
import math
import os
import sys
import tempfile
import time

# The Python backend's stub embeds the system Python; the launcher names where numpy lives.
for _path in reversed(os.environ.get("TUNER_MODEL_PYTHONPATH", "").split(os.pathsep)):
    if _path and _path not in sys.path:
        sys.path.insert(0, _path)

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

EMBEDDING_DIM = 8
_COUNTER = 8  # bytes of the model's shared execution counter (little-endian unsigned)


def _param(config, key, default, minimum=None):
    """A number from the config's `parameters` (`default` when absent); a bad value fails the load."""
    value = config.get("parameters", {}).get(key, {}).get("string_value")
    if value in (None, ""):
        return default
    try:
        number = type(default)(value)
    except ValueError:
        raise pb_utils.TritonModelException(
            f"parameters.{key}: expected {type(default).__name__}, got {value!r}") from None
    if minimum is not None and not number >= minimum:  # `not >=` also refuses nan
        raise pb_utils.TritonModelException(f"parameters.{key}: must be >= {minimum}, got {value!r}")
    return number


def parse_table(text):
    """"tokens:ms,tokens:ms,..." -> two increasing arrays."""
    points = sorted((float(t), float(ms)) for t, ms in (p.split(":") for p in text.replace(" ", "").split(",") if p))
    tokens, ms = zip(*points, strict=True)
    return np.array(tokens), np.array(ms)


def execute_ms(padded_tokens, tokens, ms, memory_bound_tokens, slowdown):
    """Emulated GPU time (unscaled ms) for a batch of `padded_tokens`: the table, linearly interpolated
    (extrapolated along its last segment), with every token past `memory_bound_tokens` costing `slowdown`
    times the table's marginal cost (the table's batch sizes stop before the memory-bound regime)."""

    def table(x):
        if x <= tokens[-1]:
            return float(np.interp(x, tokens, ms, left=ms[0] * x / tokens[0]))
        slope = (ms[-1] - ms[-2]) / (tokens[-1] - tokens[-2])
        return float(ms[-1] + slope * (x - tokens[-1]))

    if padded_tokens <= memory_bound_tokens:
        return table(padded_tokens)
    knee = table(memory_bound_tokens)
    return knee + slowdown * (table(padded_tokens) - knee)


def cold_start_factor(k, *, factor, half_life):
    """The compute-time factor of an instance's execution after `k` successful ones since its load:
    1 + (factor - 1) * 2 ** (-k / half_life) (`factor` at the first, halving its excess every `half_life`)."""
    if factor <= 1 or half_life <= 0:
        return 1.0
    return 1.0 + (factor - 1.0) * 2.0 ** (-k / half_life)


def cold_start_executions(tolerance, *, factor, half_life):
    """How many successful executions an instance needs before its cold-start factor is within
    `tolerance` (0.01: 1%) of warm: the smallest k with factor(k) <= 1 + tolerance."""
    if factor <= 1 + tolerance or half_life <= 0:
        return 0
    return math.ceil(half_life * math.log2((factor - 1.0) / tolerance))


def shape_bucket(rows, longest, *, bucket_tokens):
    """The shape bucket a batch is compiled/autotuned for: (rows, longest rounded up to `bucket_tokens`)."""
    return rows, -(-max(longest, 1) // bucket_tokens) * bucket_tokens


def fragmentation(n, *, max_padded_tokens, per_1k_executions, slowdown):
    """(padded-token budget, compute-time factor) after `n` executions of the model since its load:
    a fraction lost(n) = min(1, per_1k_executions * n / 1000) of the budget is gone, and compute time is
    1 + slowdown * lost(n) times its fresh value."""
    lost = min(1.0, per_1k_executions * n / 1000.0)
    return max_padded_tokens * (1.0 - lost), 1.0 + slowdown * lost


def first_failing_execution(padded_tokens, *, max_padded_tokens, per_1k_executions):
    """The first n (the model's executions since load) at which a batch of `padded_tokens` runs out of
    memory, since budget(n) < padded_tokens: 0 if it never fits, None if it always does."""
    if padded_tokens > max_padded_tokens:
        return 0
    if per_1k_executions <= 0 or padded_tokens <= 0:
        return None
    n = math.floor(1000.0 * (1.0 - padded_tokens / max_padded_tokens) / per_1k_executions) + 1

    def fits(k):
        return padded_tokens <= fragmentation(k, max_padded_tokens=max_padded_tokens,
                                              per_1k_executions=per_1k_executions, slowdown=0.0)[0]

    # the same floating-point comparison as an execution makes, at the boundary
    while n > 0 and not fits(n - 1):
        n -= 1
    while fits(n):
        n += 1
    return n


def drift_factor(k, *, per_execution):
    """The compute-time factor after `k` successful executions of an instance when compute time never
    settles: (1 + per_execution) ** k (each execution `per_execution` slower than the one before)."""
    return (1.0 + per_execution) ** k if per_execution else 1.0


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.scale = _param(config, "time_scale", 1.0, minimum=0.0)
        self.tokens, self.ms = parse_table(_param(config, "latency_table_ms", "384:1.15,49152:29.34"))
        self.max_len = _param(config, "max_sequence_length", 512, minimum=1)
        self.memory_bound_tokens = _param(config, "memory_bound_tokens", 8192)
        self.slowdown = _param(config, "memory_bound_slowdown", 2.5)
        self.budget = _param(config, "max_padded_tokens", 16384)
        self.host_s = _param(config, "host_us_per_request", 20.0) * 1e-6 * self.scale
        self.oom_s = _param(config, "oom_ms", 0.5) * 1e-3 * self.scale
        # Over time (absent parameters leave each effect off; README.md has the formulas).
        self.cold_factor = _param(config, "cold_start_factor", 1.0, minimum=1.0)
        self.cold_half_life = _param(config, "cold_start_half_life", 4.0, minimum=0.0)
        self.new_shape_s = _param(config, "new_shape_ms", 0.0, minimum=0.0) * 1e-3 * self.scale
        self.bucket_tokens = _param(config, "shape_bucket_tokens", 64, minimum=1)
        self.frag_rate = _param(config, "fragmentation_per_1k_executions", 0.0, minimum=0.0)
        self.frag_slowdown = _param(config, "fragmentation_slowdown", 0.5, minimum=0.0)
        self.drift = _param(config, "compute_drift_per_execution", 0.0, minimum=0.0)
        self.executions = 0  # this instance's successful executions: a new instance process starts cold
        self.buckets = set()  # the shape buckets this instance has run successfully
        # One lock file per emulated GPU: the launcher names it; otherwise one per server process.
        lock_path = os.environ.get("TUNER_EMULATED_GPU_LOCK") or os.path.join(
            tempfile.gettempdir(), f"tuner-emulated-gpu-{os.getppid()}.lock")
        gpus = _param(config, "gpus", 1, minimum=1)  # an int: the default's type
        if gpus > 1:  # instance k on GPU k mod N ("<model>_<group>_<k>": the Python backend's instance name)
            index = str(args.get("model_instance_name", "")).rsplit("_", 1)[-1]
            lock_path = f"{lock_path}.gpu{int(index) % gpus if index.isdigit() else 0}"
        self.lock_file = open(lock_path, "a")  # held for the instance's life
        self.counter_fd = None
        if self.frag_rate > 0:
            # The model's executions since its load, shared by its instances (the GPU's memory is shared):
            # a file next to the GPU lock, changed only under that lock. An instance starting means a
            # (re)load of the model: its memory starts unfragmented.
            name = args.get("model_name") or config.get("name", "model")
            self.counter_fd = os.open(f"{lock_path}.{name}.executions", os.O_RDWR | os.O_CREAT, 0o600)
            with _locked(self.lock_file):
                os.pwrite(self.counter_fd, bytes(_COUNTER), 0)

    def execute(self, requests):
        started = time.monotonic()
        ids, rows = [], 0
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT_IDS").as_numpy()
            x = x.reshape(1, -1) if x.ndim == 1 else x.reshape(x.shape[0], -1)
            x = x[:, : self.max_len]  # truncate like a tokenizer with a maximum length
            ids.append(x)
            rows += x.shape[0]
        longest = max((x.shape[1] for x in ids), default=0)
        padded = rows * max(longest, 1)
        bucket = shape_bucket(rows, longest, bucket_tokens=self.bucket_tokens)

        # Host-side pre-processing: outside the GPU lock, so another instance can use the GPU meanwhile.
        _sleep_until(started + self.host_s * rows / 2)
        with _locked(self.lock_file):
            gpu_start = time.monotonic()
            budget, fragmented = self.budget, 1.0
            if self.counter_fd is not None:
                model_executions = self._model_executions()
                budget, fragmented = fragmentation(model_executions, max_padded_tokens=self.budget,
                                                   per_1k_executions=self.frag_rate, slowdown=self.frag_slowdown)
                os.pwrite(self.counter_fd, (model_executions + 1).to_bytes(_COUNTER, "little"), 0)
            out_of_memory = padded > budget
            if out_of_memory:
                _sleep_until(gpu_start + self.oom_s)
            else:
                gpu_ms = execute_ms(padded, self.tokens, self.ms, self.memory_bound_tokens, self.slowdown)
                gpu_ms *= (cold_start_factor(self.executions, factor=self.cold_factor, half_life=self.cold_half_life)
                           * drift_factor(self.executions, per_execution=self.drift) * fragmented)
                new_shape_s = self.new_shape_s if bucket not in self.buckets else 0.0
                _sleep_until(gpu_start + gpu_ms * 1e-3 * self.scale + new_shape_s)
                self.executions += 1
                self.buckets.add(bucket)
        post_start = time.monotonic()
        if out_of_memory:
            # Raising fails every request of the batch with this message. (Returning one error
            # response per request crashed Triton 2.51's Python backend for batches of many requests.)
            shrunk = f" (fragmented from {self.budget})" if budget < self.budget else ""
            raise pb_utils.TritonModelException(
                f"CUDA out of memory (emulated): batch of {rows} rows x {longest} tokens = {padded} padded "
                f"tokens exceeds the budget of {budget:.0f}{shrunk}")

        responses = [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("EMBEDDING", _embed(x))]) for x in ids]
        _sleep_until(post_start + self.host_s * rows / 2)  # host-side post-processing
        return responses

    def _model_executions(self):
        return int.from_bytes(os.pread(self.counter_fd, _COUNTER, 0).ljust(_COUNTER, b"\0"), "little")

    def finalize(self):
        if self.counter_fd is not None:
            os.close(self.counter_fd)
        self.lock_file.close()


class _locked:
    """`with _locked(file):` the emulated GPU, exclusively (an fcntl lock: shared across processes)."""

    def __init__(self, file):
        self.file = file

    def __enter__(self):
        fcntl.flock(self.file, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        fcntl.flock(self.file, fcntl.LOCK_UN)


def _embed(ids):
    """A cheap deterministic stand-in for an embedding: depends on each row's tokens."""
    lengths = (ids != 0).sum(axis=1, keepdims=True).astype(np.float32)
    mean = ids.mean(axis=1, keepdims=True, dtype=np.float64).astype(np.float32)
    k = np.arange(EMBEDDING_DIM, dtype=np.float32)
    return np.cos(mean * 1e-3 * (k + 1) + lengths * 1e-2).astype(np.float32)


def _sleep_until(deadline):
    remaining = deadline - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)
