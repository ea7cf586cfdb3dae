"""Cut points are exact, and encode_iterable streams ids equal to encoding the whole text."""

import random
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmforge.tokenizer import GPT2_PATTERN, GPT4_PATTERN, Tokenizer
from lmforge.tokenizer.pretokenize import cut_point, pretokens, split_special
from lmforge.tokenizer.stream import encode_stream

EOT = "<|endoftext|>"
SPECIALS = [EOT, "<|a|>", "<|a|><|b|>", "<| |>"]
PIECES = [" ", "  ", "\n", " \n", "\t", "x", "Ab", "12", "é", "'s", "'ll", "日", "(", "."]
PIECES += [*SPECIALS, "<|", "|>", "\u00a0", "\u3000", "\u0301"]
texts = st.lists(st.sampled_from(PIECES), max_size=60).map("".join)


def split_then_pretokenize(text, specials, pattern):
    out = []
    for piece, is_special in split_special(text, specials):
        out.extend([piece] if is_special else pretokens(piece, pattern))
    return out


@settings(max_examples=500, deadline=None)
@given(text=texts, end=st.integers(0, 70))
@pytest.mark.parametrize("pattern", [GPT2_PATTERN, GPT4_PATTERN])
def test_cut_point_is_exact(pattern, text, end):
    c = cut_point(text, SPECIALS, end=end)
    if c == 0:
        return
    assert 0 < c <= min(end, len(text) - 1)
    whole = split_then_pretokenize(text, SPECIALS, pattern)
    parts = split_then_pretokenize(text[:c], SPECIALS, pattern)
    parts += split_then_pretokenize(text[c:], SPECIALS, pattern)
    assert parts == whole


def test_cut_point_avoids_special_tokens():
    text = "abc def<| |>ghi"
    assert cut_point(text) == 9  # inside "<| |>", a place to cut when specials are unknown
    assert cut_point(text, ["<| |>"]) == 3
    assert cut_point("aaaa", []) == 0
    assert cut_point("a1", []) == 1


@pytest.fixture(scope="module", params=["tiktoken", "python"])
def tok(request, stdlib_texts):
    from lmforge.tokenizer import train_bpe

    trained = train_bpe(stdlib_texts[:3], 800, [EOT])
    return Tokenizer(trained.mergeable_ranks, trained.special_tokens, backend=request.param)


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(texts, max_size=30), size=st.integers(1, 40))
def test_stream_equals_whole(tok, lines, size):
    whole = "".join(lines)
    expected = tok.encode(whole, allowed_special="all")
    streamed = encode_stream(lambda t: tok.encode(t, allowed_special="all"), lines, [EOT], size)
    assert list(streamed) == expected


def test_encode_iterable_on_file_lines(tok, stdlib_texts, tmp_path):
    path = tmp_path / "source.txt"
    text = EOT.join(stdlib_texts)
    path.write_text(text, encoding="utf-8")
    with open(path, encoding="utf-8", newline="") as f:
        streamed = list(tok.encode_iterable(f, allowed_special="all"))
    assert streamed == tok.encode(text, allowed_special="all")
    with open(path, encoding="utf-8", newline="") as f, pytest.raises(ValueError, match="endoft"):
        list(tok.encode_iterable(f))


def write_generated(path, n_bytes, seed=0):
    rng = random.Random(seed)
    words = ["def", "return", "self", "x", "(", ")", ":", "日本", "😀", "123", "é", EOT]
    with open(path, "w", encoding="utf-8") as f:
        written = 0
        while written < n_bytes:
            line = " ".join(rng.choice(words) for _ in range(rng.randint(0, 12))) + "\n"
            f.write(line)
            written += len(line)


def peak_memory(tok, path):
    tracemalloc.start()
    try:
        with open(path, encoding="utf-8") as f:
            count = sum(1 for _ in tok.encode_iterable(f, allowed_special="all"))
        return tracemalloc.get_traced_memory()[1], count
    finally:
        tracemalloc.stop()


def test_encode_iterable_memory_stays_flat(tok, tmp_path):
    small, large = tmp_path / "small.txt", tmp_path / "large.txt"
    write_generated(small, 300_000)
    write_generated(large, 1_200_000)
    peak_small, n_small = peak_memory(tok, small)
    peak_large, n_large = peak_memory(tok, large)
    assert n_large > 3 * n_small
    assert peak_large < 1.5 * peak_small + 200_000
    assert peak_large < 3_000_000  # well below the file, let alone its ids as a list
