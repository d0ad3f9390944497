"""The prompt text of exactly N tokens, for a generative replay.

A generative request is replayed with a prompt of exactly its `prompt_tokens` tokens. The text is
words ("pieces") that are one token each, separated by spaces, taken in turn from a starting piece:
- the tiny model (`tuner.llm.tiny`): its tokenizer is word-level over `w0 .. w{V-1}` and adds no
  special token, so N words `w<k>` are N tokens (no tokenizer needed);
- another model: pieces are words of its own tokenizer (transformers' AutoTokenizer, read from a local
  directory) that are one token each, and every length is checked once by encoding the text again as
  the server does (special tokens such as BOS included: they count as prompt tokens).

`start` picks the first piece: requests with different starts share no prompt prefix (a prefix cache
cannot serve one from another), requests with the same start share the shorter one's whole prompt.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tuner.errors import InputError

__all__ = ["TINY_WORDS", "Prompts", "compose"]

# Words w0 .. w999: inside the tiny model's vocabulary (its w0 .. w4091), one token each, at most 4
# characters and a space: vLLM refuses a prompt of more characters than 5 per token of its context
# before tokenizing it ("more than 10240 characters" at 2,048), so longer words would fail the longest
# prompts that fit.
TINY_WORDS = 1000
_WORD = re.compile(r"^[a-z][a-z0-9]{1,11}$")  # "w17", "the": plain words, no punctuation
_MAX_PIECES = 4000


class Prompts:
    """Prompt texts of exactly N tokens: `text(n, start=0)`. `Prompts()` is the tiny model's;
    `Prompts(tokenizer_dir)` builds them from that model's tokenizer. `pieces` and `special` are what
    a load generator needs to make the same texts without the tokenizer (`compose`)."""

    def __init__(self, tokenizer_dir: str | os.PathLike | None = None):
        self._tokenizer = None
        self._checked: dict[int, str] = {}
        if tokenizer_dir is None:
            self.pieces = [f"w{i}" for i in range(TINY_WORDS)]
            self.special = 0
            return
        self._tokenizer = _load(Path(tokenizer_dir))
        self.special = len(self._encode(""))
        self.pieces = _single_token_words(self._tokenizer)
        if len(self.pieces) < 16:
            raise InputError(f"{tokenizer_dir}: the tokenizer has too few one-token words "
                             f"({len(self.pieces)}) to build prompts of a given length")

    def text(self, n: int, start: int = 0) -> str:
        """A prompt of exactly `n` tokens, from piece `start` (checked by re-encoding once per n when a
        tokenizer is given; the texts of one n differ only in which pieces they hold)."""
        if n < max(1, self.special):
            raise InputError(f"a prompt of {n} tokens is shorter than the {self.special} special "
                             "tokens the tokenizer adds")
        text = compose(self.pieces, n - self.special, start)
        if self._tokenizer is not None and n not in self._checked:
            got = len(self._encode(compose(self.pieces, n - self.special, 0)))
            if got != n:
                raise InputError(f"the prompt built for {n} tokens encodes to {got} tokens with this "
                                 "tokenizer")
            self._checked[n] = text
        return text

    def _encode(self, text: str) -> list[int]:
        return self._tokenizer(text, add_special_tokens=True)["input_ids"]


def compose(pieces: list[str], count: int, start: int = 0) -> str:
    """`count` pieces from `start` (wrapping around), separated by spaces."""
    size = len(pieces)
    start %= size
    if start + count <= size:
        return " ".join(pieces[start:start + count])
    out = pieces[start:]
    count -= len(out)
    out = out + pieces * (count // size) + pieces[:count % size]
    return " ".join(out)


def _load(path: Path):
    """The tokenizer saved in a model's directory; a clear error when there is none."""
    if not path.is_dir():
        raise InputError(f"{path}: no such directory (a model's tokenizer is read from its directory)")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise InputError("building prompts from a tokenizer needs transformers "
                         "(pip install 'triton-tuner[llm]')") from None
    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise InputError(f"{path}: no tokenizer could be read ({first})") from None


def _single_token_words(tokenizer) -> list[str]:
    """Lower-case words of the vocabulary that encode, after a space, to exactly one token; kept in
    id order, at most _MAX_PIECES, and only those that stay one token each once joined."""
    words = []
    for token_id in sorted(tokenizer.get_vocab().values()):
        word = tokenizer.decode([token_id]).strip()
        if not _WORD.match(word):
            continue
        if len(tokenizer(" " + word, add_special_tokens=False)["input_ids"]) == 1:
            words.append(word)
            if len(words) >= _MAX_PIECES:
                break
    # a word may merge with its neighbour once joined: keep it only when the joined text agrees
    joined = tokenizer(" ".join(words), add_special_tokens=False)["input_ids"]
    return words if len(joined) == len(words) else [
        w for w in words if len(tokenizer(f"{words[0]} {w} {words[0]}", add_special_tokens=False)["input_ids"]) == 3]
