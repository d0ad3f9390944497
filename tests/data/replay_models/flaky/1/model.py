"""Test model for the replay: answers every request with its sequence length, and fails every
10th request it receives (so a replay must show a 10% error rate)."""

import os
import sys

# The Python-backend stub embeds the system Python; numpy comes from the path the launcher gives.
sys.path[:0] = [p for p in os.environ.get("TUNER_MODEL_PYTHONPATH", "").split(os.pathsep) if p]

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        self.seen = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            self.seen += 1
            if self.seen % 10 == 0:
                responses.append(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(f"request {self.seen} fails on purpose")
                    )
                )
                continue
            ids = pb_utils.get_input_tensor_by_name(request, "INPUT_IDS").as_numpy()
            length = np.full((ids.shape[0], 1), ids.shape[1], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("LENGTH", length)]))
        return responses
