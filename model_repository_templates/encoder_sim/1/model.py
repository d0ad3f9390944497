"""An EMULATED GPU running a transformer encoder (BERT-base), for tuning on a machine without a GPU.

Nothing here computes an encoder: each execution sleeps for the time the emulated GPU would take for the
batch's padded tokens (rows x longest sequence in the batch), read from a published latency table in
`parameters` (see README.md), steeper past a memory-bound point and failing like an out-of-memory past a
padded-token budget. All instances share one emulated GPU: executions are serialized across the instance
processes with an fcntl lock, while the per-request host work (pre/post-processing) runs outside it.
"""

import fcntl
import json
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


def _param(config, key, default):
    """A number from the config's `parameters` (`default` when absent); a bad value fails the load."""
    value = config.get("parameters", {}).get(key, {}).get("string_value")
    if value in (None, ""):
        return default
    try:
        return type(default)(value)
    except ValueError:
        raise pb_utils.TritonModelException(
            f"parameters.{key}: expected {type(default).__name__}, got {value!r}") from None


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


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.scale = _param(config, "time_scale", 1.0)
        self.tokens, self.ms = parse_table(_param(config, "latency_table_ms", "384:1.15,49152:29.34"))
        self.max_len = _param(config, "max_sequence_length", 512)
        self.memory_bound_tokens = _param(config, "memory_bound_tokens", 8192)
        self.slowdown = _param(config, "memory_bound_slowdown", 2.5)
        self.budget = _param(config, "max_padded_tokens", 16384)
        self.host_s = _param(config, "host_us_per_request", 20.0) * 1e-6 * self.scale
        self.oom_s = _param(config, "oom_ms", 0.5) * 1e-3 * self.scale
        # One lock file per emulated GPU: the launcher names it; otherwise one per server process.
        lock_path = os.environ.get("TUNER_EMULATED_GPU_LOCK") or os.path.join(
            tempfile.gettempdir(), f"tuner-emulated-gpu-{os.getppid()}.lock")
        self.lock_file = open(lock_path, "a")  # held for the instance's life

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

        # Host-side pre-processing: outside the GPU lock, so another instance can use the GPU meanwhile.
        _sleep_until(started + self.host_s * rows / 2)
        fcntl.flock(self.lock_file, fcntl.LOCK_EX)
        try:
            gpu_start = time.monotonic()
            if padded > self.budget:
                _sleep_until(gpu_start + self.oom_s)
            else:
                gpu_s = execute_ms(padded, self.tokens, self.ms, self.memory_bound_tokens, self.slowdown) * 1e-3
                _sleep_until(gpu_start + gpu_s * self.scale)
        finally:
            fcntl.flock(self.lock_file, fcntl.LOCK_UN)
        post_start = time.monotonic()
        if padded > self.budget:
            # Raising fails every request of the batch with this message. (Returning one error
            # response per request crashed Triton 2.51's Python backend for batches of many requests.)
            raise pb_utils.TritonModelException(
                f"CUDA out of memory (emulated): batch of {rows} rows x {longest} tokens = {padded} padded "
                f"tokens exceeds the budget of {self.budget}")

        responses = [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("EMBEDDING", _embed(x))]) for x in ids]
        _sleep_until(post_start + self.host_s * rows / 2)  # host-side post-processing
        return responses

    def finalize(self):
        self.lock_file.close()


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
