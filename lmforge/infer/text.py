"""Text in, text out: prompts encoded from a document start, completions streamed as UTF-8
(lmforge.infer.text_assembler holds back half characters and stop strings)."""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from typing import Any

from torch import nn

from lmforge.infer.single_prompt import stream
from lmforge.tokenizer import Tokenizer
from lmforge.tokens.encode import document_ids


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
