"""Exact deduplication: drop documents whose normalized text was already seen.

Normalization ignores what does not change meaning for a duplicate check: Unicode form,
trailing whitespace on lines and blank lines at the ends. The first occurrence is kept.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Iterable, Iterator

from lmforge.data.documents import Document


def normalize(text: str) -> str:
    text = unicodedata.normalize("NFC", text)
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def text_hash(text: str) -> bytes:
    return hashlib.blake2b(normalize(text).encode("utf-8"), digest_size=16).digest()


class ExactDedup:
    """A streaming filter; `removed` counts the duplicates dropped so far."""

    def __init__(self) -> None:
        self.seen: set[bytes] = set()
        self.removed = 0

    def __call__(self, docs: Iterable[Document]) -> Iterator[Document]:
        for doc in docs:
            key = text_hash(doc.text)
            if key in self.seen:
                self.removed += 1
                continue
            self.seen.add(key)
            yield doc
