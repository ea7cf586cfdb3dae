"""Text in, text out: prompts encoded from a document start, completions streamed as UTF-8.

A byte-level token can end in the middle of a multi-byte character; an incremental UTF-8
decoder holds such bytes back until the character is complete, so streamed text never shows
half a character.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from typing import Any

from torch import nn

from lmforge.infer.single_prompt import stream
from lmforge.tokenizer import Tokenizer
from lmforge.tokens.encode import document_ids


class TextAssembler:
    """Bytes of generated tokens in, releasable text out, cut before the first stop string.

    Text that could still turn into a stop string (a suffix that is a proper prefix of one) is
    held back until the next token settles it, so a stop string never reaches the reader, even
    when it spans several tokens.
    """

    def __init__(self, stop: tuple[str, ...] = ()) -> None:
        self.stop = tuple(s for s in stop if s)
        self.text = ""  # everything released so far
        self.stopped = False
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._held = ""

    def push(self, data: bytes) -> str:
        """The text newly released by one token's bytes; sets `stopped` at a stop string."""
        if self.stopped:
            return ""
        held = self._held + self._decoder.decode(data)
        cuts = [i for i in (held.find(s) for s in self.stop) if i >= 0]
        if cuts:
            self.stopped = True
            return self._release(held[: min(cuts)], "")
        keep = max((_overlap(held, s) for s in self.stop), default=0)
        return self._release(held[: len(held) - keep], held[len(held) - keep :])

    def flush(self) -> str:
        """Whatever is held back, at the end of generation."""
        if self.stopped:
            return ""
        return self._release(self._held + self._decoder.decode(b"", final=True), "")

    def _release(self, text: str, held: str) -> str:
        self.text += text
        self._held = held
        return text


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of stop."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0


def prompt_ids(tokenizer: Tokenizer, prompt: str) -> list[int]:
    """A prompt starts a document, as every training document did after `<|endoftext|>`."""
    return document_ids(tokenizer, prompt)


def stream_text(
    model: nn.Module, tokenizer: Tokenizer, prompt: str, max_new_tokens: int, **sampling: Any
) -> Iterator[str]:
    """Pieces of the completion as they are generated; stops at `<|endoftext|>`."""
    stops = set(sampling.pop("stop_ids", ())) | set(tokenizer.special_tokens.values())
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for token in stream(
        model, prompt_ids(tokenizer, prompt), max_new_tokens, stop_ids=stops, **sampling
    ):
        if token in stops:
            break
        piece = decoder.decode(tokenizer.token_bytes(token))
        if piece:
            yield piece
    tail = decoder.decode(b"", final=True)
    if tail:
        yield tail


def complete(
    model: nn.Module, tokenizer: Tokenizer, prompt: str, max_new_tokens: int, **sampling: Any
) -> str:
    return "".join(stream_text(model, tokenizer, prompt, max_new_tokens, **sampling))
