"""What a generative replay sends: one streaming generate request per traffic row. Parent side.

Generative request = a row with `prompt_tokens` and `output_tokens` (optionally `prefix_id`),
replayed as one streaming request due at its time, a prompt of exactly that many tokens, generation
forced to exactly that many tokens (`ignore_eos`; max_tokens = min_tokens = output_tokens). The model
is generative when its config takes `text_input` (the vLLM backend's interface); it must be decoupled
(streaming). Prompts come from `tuner.llm.prompts.Prompts`: rows of one `prefix_id` start from the
same piece (they share their prompts' beginning, as a prefix cache expects), every other row from its
own (no two share a prefix).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tuner.errors import ServerSetupError, TrafficError, traffic_row
from tuner.llm.prompts import Prompts
from tuner.replay._plan import _positive_ints

__all__ = ["GeneratePlan", "is_generative_model", "plan_generate"]

TEXT_INPUT = "text_input"
PROMPT_TOKENS, OUTPUT_TOKENS, PREFIX_ID = "prompt_tokens", "output_tokens", "prefix_id"


@dataclass(frozen=True, kw_only=True)
class GeneratePlan:
    """Every distinct request: `requests[shape_ids[i]]` = [prompt tokens, output tokens, first piece]."""

    model: str
    requests: list[list[int]]
    shape_ids: np.ndarray
    pieces: list[str]
    special: int

    def to_json(self) -> dict:
        """The plan as the load generator's spec reads it."""
        return {"model": self.model,
                "generate": {"pieces": self.pieces, "special": self.special, "requests": self.requests}}


def is_generative_model(config: dict) -> bool:
    """Whether the model takes generate requests: an input named `text_input` (the vLLM backend's)."""
    return any(i.get("name") == TEXT_INPUT for i in config.get("input", []))


def plan_generate(config: dict, traffic: pd.DataFrame, prompts: Prompts | None = None) -> GeneratePlan:
    """The requests of every traffic row for a generative model (see the module doc); TrafficError
    when the traffic has no token columns, ServerSetupError when the model does not stream."""
    model = config.get("name", "?")
    if not (config.get("model_transaction_policy") or {}).get("decoupled"):
        raise ServerSetupError(f"model '{model}' takes text_input but is not decoupled: a generative replay "
                               "streams its tokens (model_transaction_policy { decoupled: true })")
    missing = [c for c in (PROMPT_TOKENS, OUTPUT_TOKENS) if c not in traffic.columns]
    if missing:
        raise TrafficError(f"model '{model}' generates text and the traffic has no {' or '.join(map(repr, missing))} "
                           "column: each request needs its prompt and output lengths (tuner traffic import "
                           "azure fills both; a CSV maps them with --map prompt_tokens=... --map output_tokens=...)")
    prompts = prompts or Prompts()
    prompt = _positive_ints(traffic[PROMPT_TOKENS], PROMPT_TOKENS, traffic).astype(np.int64)
    output = _positive_ints(traffic[OUTPUT_TOKENS], OUTPUT_TOKENS, traffic).astype(np.int64)
    short = prompt < max(1, prompts.special)
    if short.any():
        i = int(np.argmax(short))
        raise TrafficError(f"{traffic_row(traffic, i)}: prompt_tokens={prompt[i]} is fewer than the "
                           f"{prompts.special} special tokens the model's tokenizer adds")
    size = len(prompts.pieces)
    start = np.arange(len(traffic), dtype=np.int64) % size
    if PREFIX_ID in traffic.columns:
        ids = traffic[PREFIX_ID]
        shared = ids.notna().to_numpy()
        start[shared] = [zlib.crc32(str(v).encode()) % size for v in ids[shared]]
    table = np.stack([prompt, output, start], axis=1)
    unique, shape_ids = np.unique(table, axis=0, return_inverse=True)
    for n in np.unique(prompt).tolist():  # each length built and checked once, before the start
        prompts.text(int(n))
    return GeneratePlan(model=model, requests=unique.tolist(), shape_ids=np.asarray(shape_ids).reshape(-1),
                        pieces=list(prompts.pieces), special=prompts.special)
