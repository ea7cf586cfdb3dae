"""The compiled (tiktoken) and pure-Python encoders give identical ids; choosing between them."""

import pickle
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmforge.errors import LmforgeError
from lmforge.tokenizer import Tokenizer, train_bpe
from lmforge.tokenizer import tokenizer as tokenizer_module

EOT = "<|endoftext|>"
SPECIALS = [EOT, "<|a|>", "<|a|><|b|>", "<|b|>"]


def both(tok):
    ranks, specials, pattern = tok.mergeable_ranks, tok.special_tokens, tok.pattern
    fast = Tokenizer(ranks, specials, pattern, backend="tiktoken")
    slow = Tokenizer(ranks, specials, pattern, backend="python")
    assert (fast.backend, slow.backend) == ("tiktoken", "python")
    return fast, slow


@pytest.fixture(scope="module", params=["gpt2", "gpt4"])
def pair(request, stdlib_texts):
    return both(train_bpe(stdlib_texts, 2000, [EOT, "<|pad|>"], request.param))


def random_corpus(seed, n=300):
    """Random strings over pieces that stress pre-tokenization and BPE."""
    rng = random.Random(seed)
    pieces = [" ", "  ", "\n", "\r\n", "\t", "'s", "'LL", "123456", "é", "日本", "😀", "x", "Def"]
    pieces += ["(", "):", "__init__", "\u00a0", "\u3000", "\u0301", "\ud800", "ſ", "K"]
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 80))) for _ in range(n)]


def test_identical_on_real_text(pair, stdlib_texts):
    fast, slow = pair
    for text in stdlib_texts:
        assert fast.encode_ordinary(text) == slow.encode_ordinary(text)


def test_identical_on_random_corpus(pair):
    fast, slow = pair
    for text in random_corpus(0):
        assert fast.encode_ordinary(text) == slow.encode_ordinary(text), repr(text)


@settings(max_examples=400, deadline=None)
@given(text=st.text())
def test_identical_on_any_text(pair, text):
    fast, slow = pair
    assert fast.encode_ordinary(text) == slow.encode_ordinary(text)
    assert fast.encode(text, allowed_special="all") == slow.encode(text, allowed_special="all")


@pytest.fixture(scope="module")
def overlapping():
    return both(train_bpe(["hello <|a|> world <|b|>"] * 5, 256 + 20 + len(SPECIALS), SPECIALS))


@settings(max_examples=150, deadline=None)
@given(text=st.lists(st.sampled_from([*SPECIALS, "<|", "a|>", "b", " ", "x"])).map("".join))
def test_overlapping_specials_longest_wins_on_both(overlapping, text):
    fast, slow = overlapping
    for allowed in ("all", {"<|a|>", "<|b|>"}, {"<|a|><|b|>"}):
        options = {"allowed_special": allowed, "disallowed_special": ()}
        expected = slow.encode(text, **options)
        assert fast.encode(text, **options) == expected
        assert slow.decode(expected) == text


def test_environment_forces_python(monkeypatch, trained):
    monkeypatch.setenv("LMFORGE_TOKENIZER_BACKEND", "python")
    tok = Tokenizer(trained.mergeable_ranks, trained.special_tokens)
    assert tok.backend == "python"
    monkeypatch.setenv("LMFORGE_TOKENIZER_BACKEND", "nonsense")
    with pytest.raises(LmforgeError, match="backend"):
        Tokenizer(trained.mergeable_ranks, trained.special_tokens)


def test_falls_back_when_tiktoken_cannot_compile(trained):
    # \X (a grapheme cluster): Python's regex module knows it, tiktoken's engine does not.
    pattern = r"\s+|\X"
    tok = Tokenizer(trained.mergeable_ranks, trained.special_tokens, pattern)
    assert tok.backend == "python"
    assert tok.decode(tok.encode_ordinary("ab  cd!")) == "ab  cd!"
    forced = Tokenizer(trained.mergeable_ranks, trained.special_tokens, pattern, backend="tiktoken")
    with pytest.raises(LmforgeError, match="backend='python'"):
        forced.encode_ordinary("x")


def test_pickle_keeps_backend_not_core(pair):
    fast, slow = pair
    fast.encode_ordinary("warm the core")
    clone = pickle.loads(pickle.dumps(fast))
    assert clone.backend == "tiktoken"
    assert pickle.loads(pickle.dumps(slow)).backend == "python"
    assert len(pickle.dumps(fast)) < 2 * len(pickle.dumps(fast.mergeable_ranks))


def test_to_tiktoken_is_same_encoding(pair, stdlib_texts):
    _, slow = pair
    encoding = slow.to_tiktoken()
    assert encoding.encode_ordinary(stdlib_texts[0]) == slow.encode_ordinary(stdlib_texts[0])
    assert encoding.n_vocab == slow.vocab_size


def test_encode_batch_equals_serial(pair, stdlib_texts, monkeypatch):
    fast, slow = pair
    texts = [t[:3000] + EOT + "tail" for t in stdlib_texts] + ["", "x"]  # small: no load-bound test
    expected = [fast.encode(t, allowed_special="all") for t in texts]
    assert fast.encode_batch(texts, workers=2, allowed_special="all") == expected
    assert slow.encode_batch(texts, workers=1, allowed_special="all") == expected
    monkeypatch.setattr(tokenizer_module, "PROCESS_MIN_CHARS", 0)  # use worker processes
    assert slow.encode_batch(texts, workers=2, allowed_special="all") == expected
    with pytest.raises(ValueError, match="disallowed"):
        fast.encode_batch(texts, workers=2)
