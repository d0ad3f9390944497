"""Test model of optional inputs only: per request row, the sum of B over the row (0 without B)."""

import os
import sys

# The Python-backend stub embeds the system Python; numpy comes from the path the launcher gives.
sys.path[:0] = [p for p in os.environ.get("TUNER_MODEL_PYTHONPATH", "").split(os.pathsep) if p]

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            given = [pb_utils.get_input_tensor_by_name(request, name) for name in ("A", "B")]
            rows = next(t.as_numpy().shape[0] for t in given if t is not None)
            b = given[1].as_numpy().reshape(rows, -1).sum(axis=1) if given[1] is not None else np.zeros(rows)
            out = b.astype(np.float32).reshape(rows, 1)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
