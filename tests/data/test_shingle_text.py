"""Near-dedup text normalization: each step does its one thing and can be turned off."""

import unicodedata

import pytest

from lmforge.data.shingle_text import TextNormalizer, resolve_normalizer

ALL = TextNormalizer()


def test_every_step_on():
    assert ALL("“Café”,\u00a0CAFÉ! ﬁne Ａ²  straße — ok…") == "cafe cafe fine a2 strasse ok"
    assert ALL("Hello, World!\n\tit's $5 + tax_rate") == "hello world it s $5 + tax rate"
    assert ALL("") == "" and ALL(" \u3000\u2028 ") == ""


def test_accents_go_whether_precomposed_or_combining():
    nfc, nfd = "crème brûlée", unicodedata.normalize("NFD", "crème brûlée")
    assert nfc != nfd and ALL(nfc) == ALL(nfd) == "creme brulee"
    assert ALL("Ελληνικά Ёлка") == "ελληνικα елка"
    assert ALL("हिन्दी") == "हिन्दी"  # Devanagari vowel signs and virama are not accents
    assert TextNormalizer(strip_accents=False)("Café") == "café"


def test_whitespace_and_invisible_characters():
    spaced = "a\u00a0b\u202fc\u2009d\u3000e\u200bf\u0085g"
    assert ALL(spaced) == "a b c d e f g"
    assert ALL("soft\u00adhyphen zero\u200dwidth\ufeff") == "softhyphen zerowidth"
    # Without NFKC the whitespace step alone still collapses every Unicode space.
    assert TextNormalizer(nfkc=False)(spaced) == "a b c d e f g"
    assert TextNormalizer(whitespace=False)("a\u00a0\u00a0b") == "a  b"  # NFKC made them spaces
    assert TextNormalizer(nfkc=False, whitespace=False)("a\u00a0b") == "a\u00a0b"


def test_punctuation_is_every_unicode_p_category_and_nothing_else():
    assert ALL("end.Start «quoted» ¿qué? 「引用」。") == "end start quoted que 引用"
    assert ALL("𐄀x") == "x"  # an astral punctuation mark (Aegean word separator)
    assert ALL("1+1=2 <b> 50% #tag ©") == "1+1=2 <b> 50 tag ©"  # symbols stay: +=<>©
    kept = TextNormalizer(punctuation=False)
    assert kept("Hello, World!") == "hello, world!"
    for c in map(chr, range(128)):  # the ASCII fast path agrees with the general one
        assert ALL(c + "x") == ALL(c + "x\u00e9")[:-1].rstrip(), repr(c)


def test_each_step_can_be_turned_off():
    text = "Ｆull-width CAFÉ, ok"
    assert TextNormalizer(nfkc=False)(text) == "ｆull width cafe ok"
    assert TextNormalizer(casefold=False)(text) == "Full width CAFE ok"
    assert TextNormalizer(False, False, False, False, False)(text) == text
    assert TextNormalizer(casefold=False)("ASCII, Only") == "ASCII Only"
    assert TextNormalizer(punctuation=False)("ASCII, Only") == "ascii, only"


def test_resolve():
    assert resolve_normalizer(True) == TextNormalizer()
    assert resolve_normalizer(False) is None and resolve_normalizer(None) is None
    mine = TextNormalizer(casefold=False)
    assert resolve_normalizer(mine) is mine
    with pytest.raises(TypeError, match="True, False or a TextNormalizer"):
        resolve_normalizer("nfkc")
