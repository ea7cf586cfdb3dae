import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from lmforge.data import dedup
from lmforge.data.dedup import fast_text_hash, normalize, normalized_bytes, text_hash

WHITESPACE = " \t\n\r\x0b\x0c\x1c\x1f\x85\xa0\u1680\u2000\u2009\u200a\u200b\u2028\u2029\u202f\u3000"
PIECES = st.sampled_from([*WHITESPACE, "a", "Z", "é", "e\u0301", "—", "日", "\xc2", "\ud800"])


@settings(max_examples=400, deadline=None)
@given(st.lists(PIECES, max_size=40), st.integers(1, 400))
def test_normalized_bytes_equal_normalize_on_short_and_long_texts(pieces, repeat):
    # Repeating makes texts long enough for the numpy scan as well as the bytes-search one.
    text = "".join(pieces) * repeat
    assert normalized_bytes(text) == normalize(text).encode("utf-8", "surrogatepass")


def test_the_odd_space_tables_are_exactly_unicode_whitespace():
    odd = {c for c in map(chr, range(sys.maxunicode + 1)) if c.isspace()} - set(" \t\n\r")
    assert all(
        dedup._has_ascii_odd_space(bytes([c])) == (c in dedup._ASCII_ODD_SPACE) for c in range(128)
    )
    listed = set(dedup._ASCII_ODD_SPACE.decode()) | {"\x85", "\xa0"}
    listed |= {int(c).to_bytes(3, "big").decode() for c in dedup._WIDE_ODD_SPACE}
    assert listed == odd
    breaks = {c for c in map(chr, range(0x3000 + 1)) if len(f"a{c}b".splitlines()) > 1}
    assert breaks <= odd | {"\n", "\r"}


def test_nothing_below_u0300_changes_under_nfc():
    import unicodedata

    low = [chr(c) for c in range(0x300)]
    assert all(unicodedata.normalize("NFC", c) == c and not unicodedata.combining(c) for c in low)
    decompositions = (unicodedata.decomposition(chr(c)).split() for c in range(sys.maxunicode + 1))
    second = {int(d[1], 16) for d in decompositions if len(d) == 2 and not d[0].startswith("<")}
    assert min(second) >= 0x300  # so no composition pair ends with a character below U+0300


def test_fast_hash_identifies_exactly_what_normalize_identifies():
    same = ["x = 1\r\n\r\n", "x = 1   \n\n", "\n\nx = 1", "x = 1"]
    assert len({fast_text_hash(t) for t in same}) == 1
    assert len({text_hash(t) for t in same}) == 1
    assert fast_text_hash("x = 1") != fast_text_hash("x  = 1")
    assert fast_text_hash("caf\u00e9") == fast_text_hash("cafe\u0301")  # NFC
    assert len(fast_text_hash("anything")) == len(text_hash("anything")) == 16
