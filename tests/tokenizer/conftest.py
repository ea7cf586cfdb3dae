"""Shared corpus and trained tokenizer for the tokenizer tests."""

import pytest

from lmforge.tokenizer import train_bpe

CORPUS = [
    "def main(argv):\n    for i in range(10):\n        print(f'hello {i}')\n    return 0\n",
    "The quick brown fox jumps over the lazy dog. It's 2024, isn't it? We'll see.\n",
    "class Foo:\n\tdef __init__(self, x: int) -> None:\n\t\tself.x = x  # comment\n",
    "日本語のテキストと中文文本。 Ελληνικά κείμενα. Привет, мир! café naïve résumé\n",
    "emoji 😀👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 and math ∑∫√ and spaces   \t\t\n\n\n  end",
]


@pytest.fixture(scope="session")
def corpus():
    return list(CORPUS)


@pytest.fixture(scope="module")
def trained():
    """A tokenizer trained on a small mixed corpus."""
    return train_bpe(CORPUS * 20, vocab_size=600, special_tokens=["<|endoftext|>", "<|pad|>"])
