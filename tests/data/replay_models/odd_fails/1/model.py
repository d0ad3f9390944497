"""Test model for the replay: raises (a multi-line error, as a Python exception is) when a batch holds a
request of odd length, so that Triton fails the whole execution; else answers each request with its length."""

import os
import sys
import time

# The Python-backend stub embeds the system Python; numpy comes from the path the launcher gives.
sys.path[:0] = [p for p in os.environ.get("TUNER_MODEL_PYTHONPATH", "").split(os.pathsep) if p]

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.002)
        shapes = [pb_utils.get_input_tensor_by_name(r, "INPUT_IDS").as_numpy().shape for r in requests]
        odd = [length for _, length in shapes if length % 2]
        if odd:
            raise pb_utils.TritonModelException(f"odd length {odd[0]}")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("LENGTH", np.full((rows, 1), length, dtype=np.int32))])
                for rows, length in shapes]
