"""Pre-tokenization: the patterns split as GPT-2/GPT-4 do; special tokens split longest first."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lmforge.tokenizer import GPT2_PATTERN, GPT4_PATTERN, PATTERNS
from lmforge.tokenizer.pretokenize import pretokens, split_special


def test_patterns_table():
    assert PATTERNS == {"gpt2": GPT2_PATTERN, "gpt4": GPT4_PATTERN}


def test_gpt2_splits():
    assert pretokens("Hello world, it's 2024!\n\n  x") == [
        "Hello",
        " world",
        ",",
        " it",
        "'s",
        " 2024",
        "!",
        "\n\n ",
        " x",
    ]


def test_gpt4_splits():
    # Digits come in groups of at most three; contractions are case-insensitive.
    assert pretokens("IT'S 12345 ok\n", GPT4_PATTERN) == ["IT", "'S", " ", "123", "45", " ok", "\n"]


@given(st.text())
@pytest.mark.parametrize("pattern", [GPT2_PATTERN, GPT4_PATTERN])
def test_pretokens_cover_text(pattern, text):
    assert "".join(pretokens(text, pattern)) == text


def test_split_special_longest_wins():
    specials = ["<|a|>", "<|a|><|b|>", "<|b|>"]
    assert list(split_special("x<|a|><|b|>y<|a|><|b", specials)) == [
        ("x", False),
        ("<|a|><|b|>", True),
        ("y", False),
        ("<|a|>", True),
        ("<|b", False),
    ]


def test_split_special_without_specials():
    assert list(split_special("a<|b|>", [])) == [("a<|b|>", False)]
    assert list(split_special("", ["<|b|>"])) == []
