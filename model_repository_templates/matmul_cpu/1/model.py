"""Real CPU work: each row goes through a few dense layers (numpy matmul + tanh) with fixed weights.

One execution pays a fixed cost (Python backend round trip, reading the weights) plus a per-row cost
that is much smaller when rows are batched (matrix-matrix instead of matrix-vector products), so
dynamic batching pays off on a CPU.
"""

import json
import os
import sys

# One BLAS thread per instance: instance_group count decides how many cores the model uses.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
# The Python backend's stub embeds the system Python; the launcher names where numpy lives.
for _path in reversed(os.environ.get("TUNER_MODEL_PYTHONPATH", "").split(os.pathsep)):
    if _path and _path not in sys.path:
        sys.path.insert(0, _path)

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402


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


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        width = _param(config, "width", 1024)
        layers = _param(config, "layers", 8)
        rng = np.random.default_rng(_param(config, "seed", 0))
        in_dim = out_dim = 256
        dims = [in_dim] + [width] * (layers - 1) + [out_dim]
        self.weights = [(rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)
                        for a, b in zip(dims[:-1], dims[1:], strict=True)]

    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy() for r in requests]
        sizes = [x.shape[0] if x.ndim == 2 else 1 for x in inputs]
        h = np.concatenate([x.reshape(-1, 256) for x in inputs]).astype(np.float32, copy=False)
        for w in self.weights:
            h = np.tanh(h @ w)
        responses, start = [], 0
        for x, n in zip(inputs, sizes, strict=True):
            out = h[start:start + n]
            start += n
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUTPUT", out if x.ndim == 2 else out[0])]))
        return responses
