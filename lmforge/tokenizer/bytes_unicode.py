"""GPT-2's byte-to-unicode mapping, which lets vocab.json and merges.txt hold raw bytes as text.

Printable Latin-1 bytes map to themselves; the rest (control bytes, space, ...) map to code points
from 256 up, so every token becomes a printable string without spaces.
"""

from __future__ import annotations


def _build() -> dict[int, str]:
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    mapping = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return dict(sorted(mapping.items()))


BYTE_TO_UNICODE: dict[int, str] = _build()
UNICODE_TO_BYTE: dict[str, int] = {c: b for b, c in BYTE_TO_UNICODE.items()}
# str.translate tables (C speed): bytes <-> text through Latin-1. Latin-1 characters outside the
# mapping go to a character Latin-1 cannot encode, so text_to_bytes rejects them.
_TO_TEXT = {b: c for b, c in BYTE_TO_UNICODE.items()}
_TO_LATIN1 = {c: 0xFFFF for c in range(256)} | {ord(c): b for c, b in UNICODE_TO_BYTE.items()}


def bytes_to_text(token: bytes) -> str:
    return token.decode("latin-1").translate(_TO_TEXT)


def text_to_bytes(text: str) -> bytes:
    """Inverse of `bytes_to_text`; raises KeyError on a character outside the mapping."""
    try:
        return text.translate(_TO_LATIN1).encode("latin-1")
    except UnicodeEncodeError:
        raise KeyError(text) from None
