"""Test model: reads its version directory's model.json when loaded, as the vLLM backend does, and
answers every request with that file's text (ENGINE_ARGS)."""

import os
import sys

# The Python-backend stub embeds the system Python; numpy comes from the path the launcher gives.
sys.path[:0] = [p for p in os.environ.get("TUNER_MODEL_PYTHONPATH", "").split(os.pathsep) if p]

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        path = os.path.join(args["model_repository"], args["model_version"], "model.json")
        with open(path, "rb") as fh:
            self.text = fh.read()

    def execute(self, requests):
        out = np.array([self.text], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("ENGINE_ARGS", out)]) for _ in requests]
