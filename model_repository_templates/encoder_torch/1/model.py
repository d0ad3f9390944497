"""A REAL transformer encoder in PyTorch (BERT-shaped, random weights from a fixed seed; nothing is downloaded).

Each request is one or more rows of token ids (`INPUT_IDS`, any length: `allow_ragged_batch`). An
execution truncates every row to `max_sequence_length` (like a tokenizer), pads the batch to its longest
row, runs the encoder with an attention mask that hides the padding, and answers each request with its
rows' mean-pooled last hidden state (FP32), the mean taken over the row's own tokens only. So a batch
pays for its longest request, and a request's embedding does not depend on what it was batched with.

The device is the instance's: Triton resolves the config's KIND_AUTO to KIND_GPU when it sees a GPU
(the model then runs on `cuda:<model_instance_device_id>` with the `gpu_*` shape) and to KIND_CPU
otherwise (the `cpu_*` shape); KIND_MODEL takes the first GPU PyTorch sees, else the CPU.
"""

import json
import os
import sys

# The Python backend's stub embeds the system Python; the launcher names where numpy (and PyTorch) live.
for _path in reversed(os.environ.get("TUNER_MODEL_PYTHONPATH", "").split(os.pathsep)):
    if _path and _path not in sys.path:
        sys.path.insert(0, _path)

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

DTYPES = ("float32", "float16", "bfloat16")
INIT_STD = 0.02  # BERT's initializer range


def _param(config, key, default):
    """A value from the config's `parameters`, of `default`'s type (`default` when absent); a bad value
    fails the load naming the key."""
    value = config.get("parameters", {}).get(key, {}).get("string_value")
    if value in (None, ""):
        return default
    try:
        return type(default)(value)
    except ValueError:
        raise pb_utils.TritonModelException(
            f"parameters.{key}: expected {type(default).__name__}, got {value!r}") from None


def _import_torch():
    try:
        import torch
    except ImportError as exc:
        raise pb_utils.TritonModelException(
            f"encoder_torch needs PyTorch, which the Python backend's Python {sys.version.split()[0]} cannot "
            f"import ({exc}): install it into tuner's environment (pip install -e '.[torch]'), or name the "
            "site-packages directory that holds it in TUNER_MODEL_PYTHONPATH") from None
    return torch


def choose_device(torch, kind, device_id):
    """The torch device for an instance of Triton `kind` ("GPU", "CPU" or "MODEL") on `device_id`."""
    if kind == "GPU":
        if not torch.cuda.is_available():
            raise pb_utils.TritonModelException(
                f"the instance is KIND_GPU (device {device_id}), but PyTorch {torch.__version__} sees no CUDA "
                "device: install a CUDA build of PyTorch, or set the instance group's kind to KIND_CPU")
        return torch.device("cuda", int(device_id))
    if kind == "MODEL" and torch.cuda.is_available():
        return torch.device("cuda", 0)
    return torch.device("cpu")


def pad(rows, max_len):
    """Rows of token ids -> (ids, valid): int64 [rows, longest] padded with 0 and a bool mask of the real
    tokens. Each row is truncated to `max_len`; an empty row counts as one padding token (a mean over
    nothing is undefined)."""
    rows = [r[:max_len] for r in rows]
    longest = max([1, *(len(r) for r in rows)])
    ids = np.zeros((len(rows), longest), dtype=np.int64)
    valid = np.zeros((len(rows), longest), dtype=bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
        valid[i, : max(len(r), 1)] = True
    return ids, valid


def build_encoder(torch, *, layers, hidden, heads, vocab_size, max_len):
    """A BERT-shaped encoder (post-norm, GELU, feed-forward 4 x hidden): (ids, valid) -> [rows, hidden]
    FP32, the last hidden state averaged over each row's valid tokens."""
    nn = torch.nn

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = nn.Embedding(vocab_size, hidden)
            self.positions = nn.Embedding(max_len, hidden)
            self.norm = nn.LayerNorm(hidden)
            layer = nn.TransformerEncoderLayer(hidden, heads, dim_feedforward=4 * hidden, dropout=0.0,
                                               activation="gelu", batch_first=True)
            # no nested tensors: the padding is computed, as in a padded BERT deployment
            self.layers = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

        def forward(self, ids, valid):
            positions = torch.arange(ids.shape[1], device=ids.device)
            x = self.norm(self.tokens(ids) + self.positions(positions))
            x = self.layers(x, src_key_padding_mask=~valid)
            weights = valid.unsqueeze(-1).to(torch.float32)
            return (x.float() * weights).sum(dim=1) / weights.sum(dim=1)

    encoder = Encoder()
    # Every layer its own weights (TransformerEncoder starts them as copies of one), BERT's initializer.
    for name, p in encoder.named_parameters():
        if p.dim() > 1:
            nn.init.normal_(p, std=INIT_STD)
        elif "norm" in name and name.endswith("weight"):
            nn.init.ones_(p)
        else:
            nn.init.zeros_(p)
    return encoder


class TritonPythonModel:
    def initialize(self, args):
        torch = self.torch = _import_torch()
        config = json.loads(args["model_config"])
        self.device = choose_device(torch, args["model_instance_kind"], args["model_instance_device_id"])
        on = "gpu" if self.device.type == "cuda" else "cpu"
        defaults = {"gpu": (24, 1024, 16, "float16"), "cpu": (2, 128, 2, "float32")}[on]
        layers, hidden, heads, dtype = (_param(config, f"{on}_{key}", d) for key, d in
                                        zip(("layers", "hidden", "heads", "dtype"), defaults, strict=True))
        if min(layers, hidden, heads) < 1 or hidden % heads:
            raise pb_utils.TritonModelException(
                f"parameters.{on}_hidden must be a positive multiple of parameters.{on}_heads, and "
                f"{on}_layers positive, but got (layers={layers}, hidden={hidden}, heads={heads})")
        if dtype not in DTYPES:
            raise pb_utils.TritonModelException(
                f"parameters.{on}_dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
        self.vocab_size = _param(config, "vocab_size", 30522)
        self.max_len = _param(config, "max_sequence_length", 512)
        if min(self.vocab_size, self.max_len) < 1:
            raise pb_utils.TritonModelException(
                f"parameters.vocab_size and max_sequence_length must be positive, but got "
                f"(vocab_size={self.vocab_size}, max_sequence_length={self.max_len})")
        if on == "cpu":
            # one thread per instance by default: instances are processes, and they share the cores
            torch.set_num_threads(max(1, _param(config, "cpu_threads", 1)))
        else:
            torch.cuda.set_device(self.device)
        torch.manual_seed(_param(config, "seed", 0))
        with torch.device(self.device):
            encoder = build_encoder(torch, layers=layers, hidden=hidden, heads=heads,
                                    vocab_size=self.vocab_size, max_len=self.max_len)
        self.encoder = encoder.to(getattr(torch, dtype)).eval().requires_grad_(False)
        params = sum(p.numel() for p in self.encoder.parameters())
        pb_utils.Logger.log_info(
            f"encoder_torch ({args['model_instance_name']}): {layers} layers x {hidden} ({heads} heads, {dtype}), "
            f"{params / 1e6:.1f} M parameters on {self.device}, PyTorch {torch.__version__}")

    def execute(self, requests):
        torch = self.torch
        per_request = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT_IDS").as_numpy()
            rows = 1 if x.ndim == 1 else x.shape[0]
            per_request.append(x.reshape(rows, x.size // rows if rows else 0))
        ids, valid = pad([row for x in per_request for row in x], self.max_len)
        try:
            with torch.inference_mode():
                ids_t = torch.from_numpy(ids).to(self.device, non_blocking=True).remainder_(self.vocab_size)
                valid_t = torch.from_numpy(valid).to(self.device, non_blocking=True)
                embeddings = self.encoder(ids_t, valid_t).cpu().numpy()
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            # Raising fails every request of the batch with this message (see encoder_sim).
            raise pb_utils.TritonModelException(
                f"CUDA out of memory: batch of {ids.shape[0]} rows x {ids.shape[1]} tokens on {self.device}") from None
        responses, start = [], 0
        for x in per_request:
            out = np.ascontiguousarray(embeddings[start:start + x.shape[0]])
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("EMBEDDING", out)]))
            start += x.shape[0]
        return responses

    def finalize(self):
        self.encoder = None
