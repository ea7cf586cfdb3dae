"""Training: equal to a naive reference trainer, tie rule, special tokens, sizes, determinism."""

import random
import subprocess
import sys
from collections import Counter
from itertools import pairwise

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from lmforge.errors import LmforgeError
from lmforge.tokenizer import GPT2_PATTERN, GPT4_PATTERN, train_bpe

EOT = "<|endoftext|>"


def reference_train(texts, vocab_size, specials, pattern=GPT2_PATTERN):
    """Naive BPE training: recount every pair each merge; ties go to the greatest byte pair."""
    split = regex.compile("|".join(regex.escape(s) for s in sorted(specials, key=len)[::-1]))
    words = Counter()
    for text in texts:
        for piece in split.split(text) if specials else [text]:
            for pre in regex.findall(pattern, piece):
                words[tuple(bytes([b]) for b in pre.encode("utf-8"))] += 1
    vocab = [bytes([b]) for b in range(256)]
    merges = []
    while len(vocab) + len(specials) < vocab_size:
        pairs = Counter()
        for word, freq in words.items():
            for pair in pairwise(word):
                pairs[pair] += freq
        if not pairs:
            break
        a, b = max(pairs, key=lambda p: (pairs[p], p))
        merged_words = Counter()
        for word, freq in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged_words[tuple(out)] += freq
        words = merged_words
        if a + b not in vocab:
            vocab.append(a + b)
            merges.append((a, b))
    return vocab, merges


def ranks_of(vocab):
    return {token: i for i, token in enumerate(vocab)}


@settings(max_examples=60, deadline=None)
@given(
    texts=st.lists(st.text(alphabet="aab c\n\té<|>", max_size=40), max_size=8),
    extra=st.integers(1, 60),
)
def test_matches_reference_trainer_small_alphabet(texts, extra):
    vocab_size = 256 + extra + 1
    tok = train_bpe(texts, vocab_size, special_tokens=[EOT])
    vocab, merges = reference_train(texts, vocab_size, [EOT])
    assert tok.merges == merges
    assert tok.mergeable_ranks == ranks_of(vocab)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("pattern", [GPT2_PATTERN, GPT4_PATTERN])
def test_matches_reference_trainer_random_corpora(seed, pattern):
    rng = random.Random(seed)
    words = ["def", "self", " the", "  ", "\n", "x", "ab", "ba", "aaa", EOT, "123", "é", "日本"]
    texts = ["".join(rng.choice(words) for _ in range(rng.randint(0, 60))) for _ in range(30)]
    specials = [EOT, "<|pad|>"]
    tok = train_bpe(texts, 256 + 80 + len(specials), specials, pattern)
    vocab, merges = reference_train(texts, 256 + 80 + len(specials), specials, pattern)
    assert tok.merges == merges
    assert tok.mergeable_ranks == ranks_of(vocab)


def test_tie_break_prefers_greatest_pair():
    # "ab" and "cd" occur once each: (c, d) > (a, b), so it merges first.
    tok = train_bpe(["ab", "cd"], 256 + 2 + 1)
    assert tok.merges == [(b"c", b"d"), (b"a", b"b")]
    # (b, c) occurs 4 times; then (a, bc) and (a, b) tie once each; b"bc" > b"b".
    tok = train_bpe(["bc", "bc", "bc", "abc", "ab"], 256 + 2 + 1)
    assert tok.merges == [(b"b", b"c"), (b"a", b"bc")]


def test_vocab_size_exact_and_special_ids(corpus):
    specials = [EOT, "<|pad|>", "<|im_start|>"]
    tok = train_bpe(corpus, 300, specials)
    assert tok.vocab_size == 300
    assert len(tok.mergeable_ranks) == 300 - len(specials)
    assert sorted(tok.mergeable_ranks.values()) == list(range(297))
    assert all(tok.mergeable_ranks[bytes([b])] == b for b in range(256))
    assert tok.special_tokens == {s: 297 + i for i, s in enumerate(specials)}
    assert tok.eot_id == 297


def test_stops_early_when_no_pairs_left():
    tok = train_bpe(["abab"], 1000)
    assert tok.merges == [(b"a", b"b"), (b"ab", b"ab")]
    assert tok.vocab_size == 256 + 2 + 1


def test_never_merges_across_special_tokens():
    texts = [f"x{EOT}x{EOT}y<|pad|>y"] * 50
    tok = train_bpe(texts, 400, [EOT, "<|pad|>"])
    assert not any(b"<" in t or b">" in t for t in tok.mergeable_ranks if len(t) > 1)
    ids = tok.encode(texts[0], allowed_special="all")
    assert ids.count(tok.eot_id) == 2
    assert tok.special_tokens["<|pad|>"] in ids
    assert tok.decode(ids) == texts[0]


def test_too_small_vocab_raises():
    with pytest.raises(LmforgeError, match="vocab_size"):
        train_bpe(["abc"], 256, [EOT])


def test_deterministic_across_processes(corpus):
    code = (
        "from lmforge.tokenizer import train_bpe\n"
        f"print(train_bpe({corpus!r} * 3, 500).fingerprint())\n"
    )
    runs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "LMFORGE_PROGRESS": "0"},
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert runs == {train_bpe(corpus * 3, 500).fingerprint()}
