"""Exact deduplication: drop documents whose normalized text was already seen.

Normalization ignores what does not change meaning for a duplicate check: Unicode form,
trailing whitespace on lines and blank lines at the ends. The first occurrence is kept.

    normalize(text) -> str          # the definition: NFC, strip, rstrip every line, join by "\n"
    normalized_bytes(text) -> bytes # == normalize(text).encode("utf-8"), several times faster
    fast_text_hash(text) -> bytes   # 16-byte xxh3-128 of normalized_bytes: the hash to dedup by
    text_hash(text) -> bytes        # 16-byte blake2b of the same bytes (stable, slower)
    ExactDedup()(docs)              # streaming filter, keyed by fast_text_hash

`normalized_bytes` works on bytes when that provably gives the same result: when the text has no
whitespace but tab, newline, carriage return and space, byte-level `strip`/`splitlines`/`rstrip`
agree with the str ones, and ASCII text is already NFC. Text with lone surrogates is encoded
with "surrogatepass" rather than raising.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Iterable, Iterator

import numpy as np
import xxhash

from lmforge.data.documents import Document

_ASCII_ODD_SPACE = (b"\x0b", b"\x0c", b"\x1c", b"\x1d", b"\x1e", b"\x1f")
"""ASCII characters that str.isspace() or str.splitlines() treat as whitespace, besides the
four that bytes and str methods agree on (tab, newline, carriage return, space)."""


def normalize(text: str) -> str:
    text = unicodedata.normalize("NFC", text)
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def normalized_bytes(text: str) -> bytes:
    """`normalize(text)` as UTF-8 bytes, computed on bytes where that gives the same result."""
    if text.isascii():
        data = text.encode("ascii")
        if any(c in data for c in _ASCII_ODD_SPACE):
            return normalize(text).encode("ascii")
    else:
        text = unicodedata.normalize("NFC", text)
        data = text.encode("utf-8", "surrogatepass")
        if _has_odd_space(data):
            return normalize(text).encode("utf-8", "surrogatepass")
    data = data.strip()
    if b" \n" in data or b"\t\n" in data or b"\r" in data:
        data = b"\n".join(line.rstrip() for line in data.splitlines())
    return data


def fast_text_hash(text: str) -> bytes:
    return xxhash.xxh3_128_digest(normalized_bytes(text))


def text_hash(text: str) -> bytes:
    return hashlib.blake2b(normalized_bytes(text), digest_size=16).digest()


class ExactDedup:
    """A streaming filter; `removed` counts the duplicates dropped so far."""

    def __init__(self) -> None:
        self.seen: set[bytes] = set()
        self.removed = 0

    def __call__(self, docs: Iterable[Document]) -> Iterator[Document]:
        for doc in docs:
            key = fast_text_hash(doc.text)
            if key in self.seen:
                self.removed += 1
                continue
            self.seen.add(key)
            yield doc


def _has_odd_space(data: bytes) -> bool:
    r"""Whether UTF-8 `data` holds whitespace or a line break other than \t \n \r and space:
    \x0b \x0c \x1c-\x1f, U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F
    or U+3000 (what str.isspace() accepts, the line breaks of str.splitlines() among them)."""
    b = np.frombuffer(data, dtype=np.uint8)
    if ((b < 0x20) & (b != 0x09) & (b != 0x0A) & (b != 0x0D)).any():
        return True
    follow = b[np.flatnonzero(b[:-1] == 0xC2) + 1]
    if ((follow == 0x85) | (follow == 0xA0)).any():
        return True
    at = np.flatnonzero((b[:-2] >= 0xE1) & (b[:-2] <= 0xE3))
    code = (b[at].astype(np.int32) << 16) | (b[at + 1].astype(np.int32) << 8) | b[at + 2]
    return bool((code[:, None] == _WIDE_ODD_SPACE).any())


_WIDE_ODD_SPACE = np.array(
    [
        int.from_bytes(chr(c).encode(), "big")
        for c in (0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000)
    ],
    dtype=np.int32,
)
