"""tuner.llm.prompts: prompt texts of exactly N tokens, counted by real tokenizers (transformers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.errors import InputError
from tuner.llm.prompts import TINY_WORDS, Prompts, compose

pytest.importorskip("transformers")


@pytest.fixture(autouse=True, scope="module")
def engine_files_take_turns():
    """This file starts no vLLM engine: it does not wait for the engine lock that tests/llm/conftest.py's
    fixture of this name takes for every file here (in CI that wait was this file's whole setup time)."""
    yield


def _save(tokenizer, path: Path, *, bos: bool) -> Path:
    """`tokenizer` (a tokenizers.Tokenizer) saved as a transformers tokenizer in `path`."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    if bos:  # the Llama convention: <s> before every text
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tokenizer.token_to_id("<s>"))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>")
    fast.save_pretrained(path)
    return path


def word_level(path: Path, *, bos: bool = False) -> Path:
    """The tiny model's kind of tokenizer: word-level over w0 .. w4089 and its special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(["<unk>", "<s>", "</s>", *[f"w{i}" for i in range(4090)]])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return _save(tokenizer, path, bos=bos)


def byte_pair(path: Path) -> Path:
    """A byte-level BPE (GPT-2's kind: a word's leading space is part of its token), trained here on
    a small English text, BOS before every text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    words = ("the quick brown fox jumps over lazy dog while seven wizards quietly hex bold jackals "
             "under pale moonlight across rivers mountains forests valleys") .split()
    text = [" ".join(words[i:] + words[:i]) for i in range(len(words))] * 20
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(text, trainer)
    return _save(tokenizer, path, bos=True)


def count(path: Path, text: str) -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(str(path))(text)["input_ids"])


def test_the_tiny_model_s_prompt_is_n_words():
    prompts = Prompts()
    assert prompts.text(3) == "w0 w1 w2" and prompts.text(2, start=7) == "w7 w8"
    assert prompts.text(3, start=TINY_WORDS - 1) == f"w{TINY_WORDS - 1} w0 w1"  # wraps around
    assert len(prompts.text(9000).split()) == 9000 and prompts.special == 0
    with pytest.raises(InputError, match="a prompt of 0 tokens"):
        prompts.text(0)


@pytest.mark.parametrize("n", [1, 2, 17, 512, 4090, 9001])
def test_the_tiny_words_are_n_tokens_to_the_tiny_tokenizer(n, tmp_path):
    path = word_level(tmp_path)
    assert count(path, Prompts().text(n, start=n)) == n
    assert count(path, Prompts(path).text(n, start=3)) == n


@pytest.mark.parametrize("n", [2, 3, 50, 700])
def test_another_tokenizer_s_prompt_is_n_tokens_bos_included(n, tmp_path):
    path = byte_pair(tmp_path)
    prompts = Prompts(path)
    assert prompts.special == 1 and len(prompts.pieces) >= 16
    for start in (0, 5):
        assert count(path, prompts.text(n, start=start)) == n
    assert count(word_level(tmp_path / "w", bos=True), Prompts(tmp_path / "w").text(n)) == n


def test_prompts_of_different_starts_share_no_beginning_and_of_one_start_share_it():
    prompts = Prompts()
    assert prompts.text(50, start=4).split()[0] != prompts.text(50, start=5).split()[0]
    assert prompts.text(80, start=4).startswith(prompts.text(50, start=4))
    assert compose(["a", "b", "c"], 7, start=2) == "c a b c a b c"


def test_a_prompt_shorter_than_the_special_tokens_or_no_tokenizer_is_one_line(tmp_path):
    prompts = Prompts(byte_pair(tmp_path))
    with pytest.raises(InputError, match="shorter than the 1 special tokens"):
        prompts.text(0)
    with pytest.raises(InputError, match="no such directory"):
        Prompts(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no tokenizer could be read"):
        Prompts(tmp_path / "empty")


def test_the_tiny_models_prompts_stay_within_vllms_five_characters_a_token():
    """vLLM refuses a prompt of more than 5 characters per token of its context before tokenizing it:
    the longest prompt that fits the tiny model's 2,048 tokens must pass that check from any start."""
    from tuner.llm.prompts import Prompts

    prompts = Prompts()
    for start in (0, 7, 999, 12345):
        assert len(prompts.text(2048, start=start)) <= 5 * 2048
