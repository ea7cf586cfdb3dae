"""Pre-tokenization: the split patterns and the special-token split that run before any BPE.

Training and encoding must cut text identically, so both call these functions.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator

import regex

# tiktoken's gpt2 pat_str.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# tiktoken's cl100k_base pat_str.
GPT4_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
    r"""|\s*[\r\n]|\s+(?!\S)|\s+"""
)
PATTERNS = {"gpt2": GPT2_PATTERN, "gpt4": GPT4_PATTERN}


@functools.lru_cache(maxsize=32)
def compile_pattern(pattern: str) -> regex.Pattern:
    return regex.compile(pattern)


@functools.lru_cache(maxsize=256)
def special_regex(specials: frozenset[str]) -> regex.Pattern:
    """One alternation over `specials`, longest first, so the longest match at a position wins."""
    ordered = sorted(specials, key=lambda s: (-len(s), s))
    return regex.compile("|".join(regex.escape(s) for s in ordered))


def split_special(text: str, specials: Iterable[str]) -> Iterator[tuple[str, bool]]:
    """Yield `(piece, is_special)` in order; ordinary pieces are non-empty."""
    specials = frozenset(specials)
    if not specials:
        if text:
            yield text, False
        return
    start = 0
    for m in special_regex(specials).finditer(text):
        if m.start() > start:
            yield text[start : m.start()], False
        yield m.group(), True
        start = m.end()
    if start < len(text):
        yield text[start:], False


def pretokens(text: str, pattern: str = GPT2_PATTERN) -> list[str]:
    """The pre-tokens of ordinary text (no special-token handling); they concatenate to `text`."""
    return compile_pattern(pattern).findall(text)
