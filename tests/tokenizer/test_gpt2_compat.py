"""GPT-2's published files load to ids equal to tiktoken's gpt2 encoding, on any input."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmforge.tokenizer import GPT2_PATTERN, Tokenizer

EOT = "<|endoftext|>"
BACKENDS = ["tiktoken", "python"]

SPECIAL_CASES = [
    EOT,
    f"a{EOT}b",
    f"{EOT}{EOT} {EOT}\n",
    "<|endoftext|",
    "<|endoftext|><|endoftext",
    f"x <{EOT}> y",
    "no specials at all",
]


@pytest.fixture(scope="module", params=BACKENDS)
def gpt2(request, gpt2_folder):
    return Tokenizer.load(gpt2_folder, backend=request.param)


def test_folder_is_gpt2(gpt2, gpt2_tiktoken):
    assert gpt2.vocab_size == 50257
    assert gpt2.special_tokens == {EOT: 50256}
    assert gpt2.eot_id == 50256
    assert gpt2.pattern == GPT2_PATTERN
    assert gpt2.mergeable_ranks == gpt2_tiktoken._mergeable_ranks
    assert len(gpt2.merges) == 50000


@settings(max_examples=300, deadline=None)
@given(text=st.text())
def test_any_text_matches_tiktoken(gpt2_folder, gpt2_tiktoken, text):
    for backend in BACKENDS:
        tok = _cached(gpt2_folder, backend)
        assert tok.encode_ordinary(text) == gpt2_tiktoken.encode_ordinary(text)


@settings(max_examples=150, deadline=None)
@given(
    text=st.lists(st.sampled_from(["<|", "endoftext", "|>", EOT, " ", "\n", "é", "x"])).map("".join)
)
def test_special_token_handling_matches_tiktoken(gpt2_folder, gpt2_tiktoken, text):
    for backend in BACKENDS:
        tok = _cached(gpt2_folder, backend)
        for kwargs in ({"allowed_special": "all"}, {"disallowed_special": ()}):
            assert tok.encode(text, **kwargs) == gpt2_tiktoken.encode(text, **kwargs)
        assert tok.encode(text, allowed_special={EOT}) == gpt2_tiktoken.encode(
            text, allowed_special={EOT}
        )


def test_real_source_matches_tiktoken(gpt2, gpt2_tiktoken, stdlib_texts):
    for text in stdlib_texts:
        assert gpt2.encode_ordinary(text) == gpt2_tiktoken.encode_ordinary(text)
        assert gpt2.decode(gpt2.encode_ordinary(text)) == text


@pytest.mark.parametrize("text", SPECIAL_CASES)
def test_special_cases_match_tiktoken(gpt2, gpt2_tiktoken, text):
    assert gpt2.encode(text, allowed_special="all") == gpt2_tiktoken.encode(
        text, allowed_special="all"
    )
    assert gpt2.encode(text, disallowed_special=()) == gpt2_tiktoken.encode(
        text, disallowed_special=()
    )
    if EOT in text:
        # Both refuse a disallowed special token by default.
        with pytest.raises(ValueError):
            gpt2_tiktoken.encode(text)
        with pytest.raises(ValueError, match="endoftext"):
            gpt2.encode(text)
    else:
        assert gpt2.encode(text) == gpt2_tiktoken.encode(text)


def test_batch_matches_tiktoken(gpt2, gpt2_tiktoken, stdlib_texts):
    texts = [t[:5000] + EOT for t in stdlib_texts]
    expected = gpt2_tiktoken.encode_batch(texts, allowed_special="all")
    assert gpt2.encode_batch(texts, workers=2, allowed_special="all") == expected


_loaded: dict = {}


def _cached(folder, backend):
    if (folder, backend) not in _loaded:
        _loaded[folder, backend] = Tokenizer.load(folder, backend=backend)
    return _loaded[folder, backend]
