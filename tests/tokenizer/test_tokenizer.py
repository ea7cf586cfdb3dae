"""Encoding and decoding: round trips, the rank rule, special tokens, merges, pickling."""

import itertools
import pickle
import random

import numpy as np
import pytest
import regex
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lmforge.errors import LmforgeError
from lmforge.tokenizer import GPT2_PATTERN, GPT4_PATTERN, Tokenizer, train_bpe

EOT = "<|endoftext|>"


def reference_encode(ranks, text, pattern=GPT2_PATTERN):
    """tiktoken's rule, plainly: merge the lowest-rank adjacent pair, leftmost first, until none."""
    ids = []
    for pre in regex.findall(pattern, text):
        parts = [bytes([b]) for b in pre.encode("utf-8")]
        while True:
            found = [
                (ranks[parts[i] + parts[i + 1]], i)
                for i in range(len(parts) - 1)
                if parts[i] + parts[i + 1] in ranks
            ]
            if not found:
                break
            _, i = min(found)
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        ids.extend(ranks[p] for p in parts)
    return ids


HARD_STRINGS = [
    "",
    " ",
    "   \t\t\n\n\r\n  x  ",
    "\n\n\n",
    "👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 👍🏽 thumbs",
    "日本語のテキストと中文文本",
    "e\u0301 a\u0308\u0323 Z\u0351\u0364\u0300",
    "def f(x):\n\treturn x  # ok\n",
    EOT + " not special here",
    "\x00\x01\x7f\ufeff\U0010ffff",
]


@pytest.mark.parametrize("text", HARD_STRINGS)
def test_round_trip_hard_strings(trained, text):
    assert trained.decode(trained.encode_ordinary(text)) == text


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_round_trip_any_text(trained, text):
    ids = trained.encode_ordinary(text)
    assert trained.decode(ids) == text
    assert trained.decode_bytes(ids) == text.encode("utf-8")


def test_lone_surrogate_is_replaced(trained):
    assert trained.decode(trained.encode_ordinary("a\ud800b")) == "a\ufffdb"


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="ab c\n\té😀日<|>", max_size=200))
def test_encoder_matches_reference(trained, text):
    assert trained.encode_ordinary(text) == reference_encode(trained.mergeable_ranks, text)


@pytest.mark.parametrize("seed", range(3))
def test_encoder_matches_reference_on_long_pieces(seed):
    # Pieces above 64 bytes take the heap path; they must agree with the plain rule.
    rng = random.Random(seed)
    texts = ["".join(rng.choice("aab") for _ in range(rng.randint(1, 12))) for _ in range(300)]
    tok = train_bpe(texts, 256 + 40)
    for length in (65, 200, 1000):
        text = "".join(rng.choice("aab") for _ in range(length))
        assert tok.encode_ordinary(text) == reference_encode(tok.mergeable_ranks, text)
    spaces = " " * 300 + "x"
    assert tok.encode_ordinary(spaces) == reference_encode(tok.mergeable_ranks, spaces)


def test_ranks_not_byte_order():
    # Single-byte ranks need not equal byte values (GPT-2's don't); encode goes through the dicts.
    order = list(range(256))
    random.Random(0).shuffle(order)
    ranks = {bytes([b]): r for r, b in enumerate(order)}
    ranks[b"ab"] = 256
    ranks[b"abc"] = 257
    tok = Tokenizer(ranks, {EOT: 258})
    assert tok.encode_ordinary("abc ab") == [257, ranks[b" "], 256]
    assert tok.decode([257, ranks[b" "], 256]) == "abc ab"
    assert tok.merges == [(b"a", b"b"), (b"ab", b"c")]


@pytest.fixture(scope="module")
def with_specials():
    specials = [EOT, "<|a|>", "<|a|><|b|>", "<|b|>"]
    return train_bpe(["hello <|a|> world <|b|>"] * 5, 256 + 20 + len(specials), specials)


def test_allowed_special_is_one_id(with_specials):
    tok = with_specials
    assert tok.encode(f"hi{EOT}", allowed_special={EOT}) == [*tok.encode_ordinary("hi"), tok.eot_id]
    assert tok.encode(EOT, allowed_special="all") == [tok.eot_id]


def test_disallowed_special_raises(with_specials):
    with pytest.raises(ValueError, match=r"<\|endoftext\|>.*allowed_special.*disallowed_special"):
        with_specials.encode(f"x {EOT} y")
    with pytest.raises(ValueError, match=r"<\|a\|>"):
        with_specials.encode("<|a|>", allowed_special={EOT})


def test_special_as_plain_text(with_specials):
    tok = with_specials
    plain = tok.encode_ordinary(f"x{EOT}")
    assert tok.eot_id not in plain
    assert len(plain) > 2
    assert tok.encode(f"x{EOT}", disallowed_special=()) == plain
    assert tok.decode(plain) == f"x{EOT}"


def test_longest_special_wins(with_specials):
    tok = with_specials
    sp = tok.special_tokens
    ids = tok.encode("x<|a|><|b|>y<|a|> <|b|>", allowed_special="all")
    assert ids == [
        *tok.encode_ordinary("x"),
        sp["<|a|><|b|>"],
        *tok.encode_ordinary("y"),
        sp["<|a|>"],
        *tok.encode_ordinary(" "),
        sp["<|b|>"],
    ]


def test_properties(trained):
    ids = [*trained.mergeable_ranks.values(), *trained.special_tokens.values()]
    assert sorted(ids) == list(range(trained.vocab_size))
    assert trained.pattern == GPT2_PATTERN
    assert set(trained.special_tokens) == {EOT, "<|pad|>"}
    for i in range(trained.vocab_size):
        assert trained.decode_bytes([i]) == trained.token_bytes(i)


def test_derived_merges_equal_trained_merges(trained):
    derived = Tokenizer(trained.mergeable_ranks, trained.special_tokens).merges
    assert derived == trained.merges
    assert len(derived) == len(trained.mergeable_ranks) - 256


def test_missing_bytes_raise():
    with pytest.raises(LmforgeError, match="256 bytes"):
        Tokenizer({b"a": 0}, {})


def test_pickle_round_trip(trained):
    text = "def f(x):\n    return x + 1  # 😀"
    trained.encode_ordinary(text)  # fill the cache; it must not travel
    clone = pickle.loads(pickle.dumps(trained))
    assert clone.encode_ordinary(text) == trained.encode_ordinary(text)
    assert clone.fingerprint() == trained.fingerprint()
    assert clone.merges == trained.merges
    assert len(pickle.dumps(trained)) == len(pickle.dumps(clone))


def test_gpt4_pattern_round_trip(corpus):
    tok = train_bpe(corpus, 400, pattern=GPT4_PATTERN)
    for text in [*corpus, *HARD_STRINGS]:
        assert tok.decode(tok.encode_ordinary(text)) == text
        expected = reference_encode(tok.mergeable_ranks, text, GPT4_PATTERN)
        assert tok.encode_ordinary(text) == expected


def test_fingerprint_changes_with_content(trained):
    ranks = trained.mergeable_ranks
    specials = trained.special_tokens
    base = Tokenizer(ranks, specials).fingerprint()
    assert base == trained.fingerprint()
    assert Tokenizer(ranks, specials, GPT4_PATTERN).fingerprint() != base
    assert Tokenizer(ranks, {EOT: specials[EOT]}).fingerprint() != base
    top = max(ranks, key=ranks.get)
    assert Tokenizer({t: r for t, r in ranks.items() if t != top}, specials).fingerprint() != base


def test_decoding_unknown_ids_raises_clearly(trained):
    for bad in ([trained.vocab_size], [0, -1], [10**9], [None]):
        with pytest.raises(LmforgeError, match=r"cannot decode token id .* 0\.\.525"):
            trained.decode(bad)
    with pytest.raises(LmforgeError, match="cannot decode"):
        trained.token_bytes(trained.vocab_size)


def test_decoding_a_split_character_gives_replacement(trained):
    ids = trained.encode_ordinary("日本")
    byte_ids = [trained.mergeable_ranks[bytes([b])] for b in "日本".encode()]
    assert trained.decode(byte_ids[:2]) == "\ufffd"
    assert trained.decode(byte_ids[1:]) == "\ufffd\ufffd本"
    assert trained.decode(ids) == "日本"
    with pytest.raises(UnicodeDecodeError):
        trained.decode(byte_ids[:2], errors="strict")


def test_decode_accepts_arrays(trained):
    ids = trained.encode_ordinary("def f(x): return x")
    assert trained.decode(np.array(ids, dtype=np.int64)) == "def f(x): return x"
    assert trained.decode(torch.tensor(ids)) == "def f(x): return x"


def test_bad_special_tokens_raise(trained):
    with pytest.raises(LmforgeError, match="empty"):
        Tokenizer(trained.mergeable_ranks, {"": trained.vocab_size})
    with pytest.raises(LmforgeError, match="not unique"):
        Tokenizer(trained.mergeable_ranks, {EOT: 0})


def test_encode_iterable_yields_lazily(trained):
    def endless():
        while True:
            yield "def f(x):\n    return x\n"

    first = list(itertools.islice(trained.encode_iterable(endless()), 12))
    assert first == trained.encode_ordinary("def f(x):\n    return x\n" * 3)[:12]
