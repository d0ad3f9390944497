"""Test model for the replay's request layout: per request row, the sum of each input over the row
(FP16, FP32, INT64, UINT8 as numbers; BOOL: how many are true; STRING: the total length in bytes)."""

import os
import sys

# The Python-backend stub embeds the system Python; numpy comes from the path the launcher gives.
sys.path[:0] = [p for p in os.environ.get("TUNER_MODEL_PYTHONPATH", "").split(os.pathsep) if p]

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

NUMERIC = ("F16", "F32", "I64", "U8", "FLAG")


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            columns = []
            for name in NUMERIC:
                x = pb_utils.get_input_tensor_by_name(request, name).as_numpy()
                columns.append(x.reshape(x.shape[0], -1).astype(np.float64).sum(axis=1))
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            lengths = np.vectorize(len, otypes=[np.float64])(text) if text.size else np.zeros(text.shape)
            columns.append(lengths.reshape(text.shape[0], -1).sum(axis=1))
            sums = np.stack(columns, axis=1)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUMS", sums)]))
        return responses
