"""Text normalization before near-duplicate shingling: copies that differ only in form match.

    normalizer = TextNormalizer()                    # every step on (the near-dedup default)
    normalizer("“Café”,\u00a0CAFÉ!")                 # -> "cafe cafe"
    TextNormalizer(strip_accents=False)              # choose: keep accents, do the rest
    resolve_normalizer(True | False | TextNormalizer(...)) -> TextNormalizer | None

The steps, in order, each one a field that turns it off:

- `nfkc`: Unicode NFKC, so compatibility forms meet their plain ones (ﬁ → fi, full-width Ａ → A,
  ² → 2, no-break and other typographic spaces → space);
- `casefold`: `str.casefold` (Unicode case-insensitive: ß → ss, Σ/ς → σ);
- `strip_accents`: decompose and drop the combining diacritics of the Latin, Greek and Cyrillic
  blocks (U+0300-036F and their supplements), so é → e, ñ → n; marks that carry meaning in
  other scripts (Devanagari vowel signs, Hebrew and Arabic points) are left alone;
- `punctuation`: every Unicode punctuation character (categories P*: , . ! ? “ ” ‘ ’ « » — – …)
  becomes a space, so `word,` matches `word` and `end.Start` splits into two words;
- `whitespace`: invisible format characters (soft hyphen, zero-width joiners, BOM) are dropped,
  a zero-width space counts as a space, and every run of Unicode whitespace becomes one space.

Symbols, digits and letters are kept. The result only feeds the shingler, never the output text.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass
from typing import NamedTuple

_COMBINING_DIACRITICS = re.compile(
    "[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]"
)
_ASTRAL = re.compile("[\U00010000-\U0010ffff]")
_ASCII_PUNCTUATION = bytes(c for c in range(128) if unicodedata.category(chr(c))[0] == "P")
_UPPER, _LOWER = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", b"abcdefghijklmnopqrstuvwxyz"
_ASCII_TABLES = {  # (casefold, punctuation) -> bytes.translate table
    (True, True): bytes.maketrans(_UPPER + _ASCII_PUNCTUATION, _LOWER + b" " * 23),
    (True, False): bytes.maketrans(_UPPER, _LOWER),
    (False, True): bytes.maketrans(_ASCII_PUNCTUATION, b" " * 23),
}


@dataclass(frozen=True)
class TextNormalizer:
    """Maps text to the form near-duplicate shingles are taken from; each step can be turned off."""

    nfkc: bool = True
    casefold: bool = True
    strip_accents: bool = True
    punctuation: bool = True  # punctuation becomes a space
    whitespace: bool = True  # format characters dropped, whitespace runs become one space

    def __call__(self, text: str) -> str:
        if text.isascii():  # nothing to compose or strip: one bytes.translate at most
            table = _ASCII_TABLES.get((self.casefold, self.punctuation))
            if table is not None:
                text = text.encode("ascii").translate(table).decode("ascii")
            return " ".join(text.split()) if self.whitespace else text
        if self.nfkc:
            text = unicodedata.normalize("NFKC", text)
        if self.casefold:
            text = text.casefold()
        if self.strip_accents:
            decomposed = unicodedata.normalize("NFD", text)
            stripped = _COMBINING_DIACRITICS.sub("", decomposed)
            if len(stripped) != len(decomposed):
                text = unicodedata.normalize("NFC", stripped)
        patterns = _patterns()
        if self.punctuation:  # ASCII marks by bytes.translate (UTF-8 keeps ASCII bytes as is)
            data = text.encode("utf-8", "surrogatepass").translate(_ASCII_TABLES[False, True])
            text = patterns.punctuation.sub(" ", data.decode("utf-8", "surrogatepass"))
        if self.whitespace:
            text = patterns.format.sub("", text.replace("\u200b", " "))
        if (self.punctuation or self.whitespace) and _ASTRAL.search(text):
            flags = (self.punctuation, self.whitespace)
            text = _ASTRAL.sub(lambda m: _astral(m.group(), *flags), text)
        if self.whitespace:
            text = " ".join(text.split())
        return text


def resolve_normalizer(normalize: bool | TextNormalizer | None) -> TextNormalizer | None:
    """True: every step (`TextNormalizer()`); False or None: none; a `TextNormalizer`: itself."""
    if isinstance(normalize, TextNormalizer):
        return normalize
    if normalize is None or isinstance(normalize, bool):
        return TextNormalizer() if normalize else None
    raise TypeError(
        f"normalize must be True, False or a TextNormalizer, got {normalize!r}: "
        "pass TextNormalizer(strip_accents=False) etc. to choose steps"
    )


class _Patterns(NamedTuple):
    punctuation: re.Pattern[str]  # non-ASCII, in the BMP
    format: re.Pattern[str]  # in the BMP, all but the zero-width space (which counts as a space)


@functools.cache
def _patterns() -> _Patterns:
    """Character classes of non-ASCII punctuation and of format characters in the BMP, built on
    first use (about 0.2 s). A class of BMP characters compiles to one bitmap test per character;
    one holding astral characters would scan its ranges, so those are looked up one by one."""
    classes: dict[bool, list[str]] = {True: [], False: []}
    for c in range(0x80, 0x10000):
        category = unicodedata.category(chr(c))
        if category[0] == "P" or (category == "Cf" and c != 0x200B):
            classes[category[0] == "P"].append(chr(c))
    punctuation, format_chars = ("".join(classes[key]) for key in (True, False))
    return _Patterns(
        re.compile(f"[{re.escape(punctuation)}]"), re.compile(f"[{re.escape(format_chars)}]")
    )


@functools.lru_cache(maxsize=4096)
def _astral(char: str, punctuation: bool, whitespace: bool) -> str:
    """What an astral character becomes: a space (punctuation), nothing (format) or itself."""
    category = unicodedata.category(char)
    if punctuation and category[0] == "P":
        return " "
    return "" if whitespace and category == "Cf" else char
