"""The tiny generative model: a random-weights Llama and a word-level tokenizer, made locally at first use.

Nothing is downloaded. `tiny_model()` writes, with `transformers`, a Llama config, random float32 weights
from a fixed seed and a word-level tokenizer over the words `w0 .. w{V-1}` into the tuner cache
(`$TUNER_LLM_CACHE`, else `$XDG_CACHE_HOME/tuner/llm`, else `~/.cache/tuner/llm`), and returns that
directory; later calls reuse it. The tokenizer adds no special token at the start, so a prompt of N
space-separated words is exactly N prompt tokens, the property the replay relies on to send a prompt of a
recorded length. vLLM loads the directory like any Hugging Face model (`model.json`'s "model").

The directory is made atomically: built in a temporary directory beside it and renamed into place, so two
processes making it at once never see a half-written model (the slower one discards its copy).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from tuner.files import user_cache

__all__ = ["NAME", "SHAPE", "cache_dir", "tiny_model"]

# The name model.json's "model" gives to mean this model (the llm_vllm template resolves it here).
NAME = "tuner-tiny-llama"

# Small enough to start in seconds on a CPU, shaped like a Llama (grouped-query attention, SwiGLU MLP).
SHAPE = {
    "vocab_size": 4096,          # w0 .. w4089 plus the special tokens below
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
}
SEED = 0
SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")  # ids 0..3; the words follow
# Bumped when the files change, so a cache made by an older tuner is not reused.
VERSION = 1


def cache_dir() -> Path:
    """Where tiny models are kept: $TUNER_LLM_CACHE, else the user cache (`.../tuner/llm`)."""
    return user_cache("TUNER_LLM_CACHE", "llm")


def tiny_model(cache: str | os.PathLike | None = None) -> Path:
    """The tiny model's directory (a Hugging Face model vLLM and transformers load), made at first use.

    `cache` overrides `cache_dir()`. Safe to call from several processes at once."""
    root = Path(cache) if cache is not None else cache_dir()
    target = root / f"{NAME}-v{VERSION}"
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{NAME}-", dir=root))
    try:
        _write(scratch)
        try:
            os.rename(scratch, target)  # atomic; fails when another process got there first
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from tokenizers.decoders import WordPiece
    from transformers import PreTrainedTokenizerFast

    words = [f"w{i}" for i in range(SHAPE["vocab_size"] - len(SPECIALS))]
    vocab = {token: i for i, token in enumerate([*SPECIALS, *words])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # WordPiece's decoder joins tokens with spaces (none start with "##"): streamed text reads "w1 w2".
    core.decoder = WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", pad_token="<pad>", add_bos_token=False,
                                   add_eos_token=False, model_max_length=SHAPE["max_position_embeddings"])


def _write(directory: Path) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**SHAPE, bos_token_id=1, eos_token_id=2, pad_token_id=3, tie_word_embeddings=False,
                         dtype="float32")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = LlamaForCausalLM(config)
    model.save_pretrained(directory, safe_serialization=True)
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=3).save_pretrained(directory)
    _tokenizer().save_pretrained(directory)
