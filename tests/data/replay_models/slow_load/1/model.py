"""Test model: loads for as long as its `load_s` parameter says (a model whose weights take a while),
then answers each request with its length."""

import json
import os
import sys
import time

# The Python-backend stub embeds the system Python; numpy comes from the path the launcher gives.
sys.path[:0] = [p for p in os.environ.get("TUNER_MODEL_PYTHONPATH", "").split(os.pathsep) if p]

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        time.sleep(float(parameters.get("load_s", {}).get("string_value", "40")))

    def execute(self, requests):
        responses = []
        for request in requests:
            ids = pb_utils.get_input_tensor_by_name(request, "INPUT_IDS").as_numpy()
            length = np.full((ids.shape[0], 1), ids.shape[1], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("LENGTH", length)]))
        return responses
