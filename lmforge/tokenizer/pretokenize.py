"""Pre-tokenization: the split patterns, the special-token split, and safe places to cut text.

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

# Places where both patterns always start a new pre-token, whatever surrounds them: before a space
# that follows a non-space, and between a letter and a digit. Cutting text there and
# pre-tokenizing the parts gives exactly the pre-tokens of the whole. Searched backwards.
_CUT = regex.compile(r"(?r)(?:\S(?= )|\p{L}(?=\p{N})|\p{N}(?=\p{L}))")


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


def cut_point(
    text: str, specials: Iterable[str] = (), start: int = 0, end: int | None = None
) -> int:
    """The last index `c`, `start < c <= end` (default: the last character), at which `text` can
    be cut so that pre-tokenizing the two parts, special tokens included, gives exactly the
    pre-tokens of the whole; 0 when there is none.

    `c` lies inside no occurrence of a special token. When more text may follow, pass an `end`
    at least the longest special token's length before the end of `text`. Exact for the GPT-2
    and GPT-4 patterns; for other patterns a good guess.
    """
    specials = [s for s in specials if s]
    end = len(text) - 1 if end is None else min(end, len(text) - 1)
    while end > start:
        m = _CUT.search(text, start, end + 1)
        if m is None:
            return 0
        c = m.end()
        inside = [at for s in specials if 0 <= (at := _occurrence_start(text, s, c)) < c]
        if not inside:
            return c
        end = min(inside)  # a special token covers c: look before it
    return 0


def _occurrence_start(text: str, special: str, c: int) -> int:
    """Start of the first occurrence of `special` that could cover index `c`, or -1."""
    return text.find(special, max(0, c - len(special) + 1), c + len(special) - 1)
