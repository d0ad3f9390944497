"""Test model: answers each request with its length, and its stub process exits (os._exit, as a crash in
native code ends it) after as many executions as its `executions` parameter says (default 30)."""

import json
import os
import sys

# The Python-backend stub embeds the system Python; numpy comes from the path the launcher gives.
sys.path[:0] = [p for p in os.environ.get("TUNER_MODEL_PYTHONPATH", "").split(os.pathsep) if p]

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.limit = int(parameters.get("executions", {}).get("string_value", "30"))
        self.executions = 0

    def execute(self, requests):
        self.executions += 1
        if self.executions > self.limit:
            os._exit(1)
        responses = []
        for request in requests:
            ids = pb_utils.get_input_tensor_by_name(request, "INPUT_IDS").as_numpy()
            length = np.full((ids.shape[0], 1), ids.shape[1], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("LENGTH", length)]))
        return responses
