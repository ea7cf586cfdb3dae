"""Which encoder runs: tiktoken's compiled core when it can be built, else the pure-Python one.

Chosen per tokenizer, once, on first use. `LMFORGE_TOKENIZER_BACKEND=python` (or `backend=` on a
Tokenizer) forces the pure-Python reference; `tiktoken` makes its absence an error.
"""

from __future__ import annotations

import os
from typing import Any

from lmforge.errors import LmforgeError

BACKENDS = ("auto", "tiktoken", "python")
ENV = "LMFORGE_TOKENIZER_BACKEND"


def requested(backend: str | None) -> str:
    """The backend asked for: the argument, else the environment, else auto."""
    choice = backend or os.environ.get(ENV) or "auto"
    if choice not in BACKENDS:
        raise LmforgeError(f"tokenizer backend {choice!r} is unknown; use one of {BACKENDS}")
    return choice


def build_tiktoken(
    ranks: dict[bytes, int], specials: dict[str, int], pattern: str, required: bool
) -> Any | None:
    """A `tiktoken.Encoding` over our ranks, or None (when not `required`) if tiktoken is missing
    or cannot compile `pattern`."""
    try:
        import tiktoken
    except ImportError:
        if required:
            raise LmforgeError("tokenizer backend 'tiktoken' needs: pip install tiktoken") from None
        return None
    try:
        return tiktoken.Encoding(
            name="lmforge", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials
        )
    except ValueError as e:  # a pattern tiktoken's regex engine does not support
        if required:
            raise LmforgeError(
                f"tiktoken cannot use this tokenizer ({e}); use backend='python'"
            ) from None
        return None
