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
agree with the str ones; text without characters from U+0300 on is NFC already. Text with lone
surrogates is encoded with "surrogatepass" rather than raising.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Iterable, Iterator

import numpy as np
import xxhash

from lmforge.data.documents import Document

_ASCII_ODD_SPACE = b"\x0b\x0c\x1c\x1d\x1e\x1f"
"""ASCII characters that str.isspace() or str.splitlines() treat as whitespace, besides the
four that bytes and str methods agree on (tab, newline, carriage return, space)."""
_NUMPY_FROM_BYTES = 8192
"""Longer ASCII texts are scanned with numpy, and only the ragged ones split into lines; shorter
ones are split into lines at once, which costs less than the scan."""
_PLAIN, _RAGGED, _ODD = 0, 1, 2


def normalize(text: str) -> str:
    text = unicodedata.normalize("NFC", text)
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def normalized_bytes(text: str) -> bytes:
    """`normalize(text)` as UTF-8 bytes, computed on bytes where that gives the same result."""
    if text.isascii():
        data = text.encode("ascii")
        if len(data) < _NUMPY_FROM_BYTES:
            if _has_ascii_odd_space(data):
                return normalize(text).encode("ascii")
            return _rstrip_lines(data)
        kind = _scan(data, True)
    else:
        data = text.encode("utf-8", "surrogatepass")
        if _may_compose(data):
            nfc = unicodedata.normalize("NFC", text)
            if nfc is not text:  # the same object when it was NFC already
                text, data = nfc, nfc.encode("utf-8", "surrogatepass")
        kind = _scan(data, False)
    if kind == _PLAIN:
        return data.strip()
    if kind == _RAGGED:
        return _rstrip_lines(data)
    return normalize(text).encode("utf-8", "surrogatepass")


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


def _has_ascii_odd_space(data: bytes) -> bool:
    return (
        b"\x0b" in data
        or b"\x0c" in data
        or b"\x1c" in data
        or b"\x1d" in data
        or b"\x1e" in data
        or b"\x1f" in data
    )


def _may_compose(data: bytes) -> bool:
    """Whether UTF-8 `data` has a character from U+0300 on (lead byte 0xCC or more): below it,
    no character changes under NFC or combines with its neighbour."""
    return bool((np.frombuffer(data, dtype=np.uint8) >= 0xCC).any())


def _rstrip_lines(data: bytes) -> bytes:
    return b"\n".join(map(bytes.rstrip, data.strip().splitlines()))


def _scan(data: bytes, ascii: bool) -> int:
    r"""_ODD when UTF-8 `data` holds whitespace or a line break other than \t \n \r and space:
    \x0b \x0c \x1c-\x1f, U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F
    or U+3000 (what str.isspace() accepts, the line breaks of str.splitlines() among them); else
    _RAGGED when it has \r or a space or tab before a newline; else _PLAIN."""
    if _has_ascii_odd_space(data):
        return _ODD
    if not ascii:
        if b"\xc2" in data and _has_pair(data, (0x85C2, 0xA0C2)):
            return _ODD
        if (b"\xe1" in data or b"\xe2" in data or b"\xe3" in data) and _has_wide_odd_space(data):
            return _ODD
    return _RAGGED if b"\r" in data or _has_pair(data, (0x0A20, 0x0A09)) else _PLAIN


def _has_pair(data: bytes, pairs: tuple[int, ...]) -> bool:
    """Whether two consecutive bytes x, y of `data` make one of the `pairs` (as y << 8 | x)."""
    for offset in (0, 1):
        u = np.frombuffer(data, dtype="<u2", count=(len(data) - offset) // 2, offset=offset)
        if any((u == p).any() for p in pairs):
            return True
    return False


def _has_wide_odd_space(data: bytes) -> bool:
    b = np.frombuffer(data, dtype=np.uint8)
    at = np.flatnonzero((b[:-2] >= 0xE1) & (b[:-2] <= 0xE3))
    wide = (b[at].astype(np.int32) << 16) | (b[at + 1].astype(np.int32) << 8) | b[at + 2]
    return bool((wide[:, None] == _WIDE_ODD_SPACE).any())


_WIDE_ODD_SPACE = np.array(
    [
        int.from_bytes(chr(c).encode(), "big")
        for c in (0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000)
    ],
    dtype=np.int32,
)
