"""Shared corpus, trained tokenizers, GPT-2's ranks (offline, from openai-whisper's data file)."""

import importlib.util
import json
from pathlib import Path

import pytest
import tiktoken

from lmforge.data.documents import stdlib_root
from lmforge.tokenizer import GPT2_PATTERN, Tokenizer, train_bpe
from lmforge.tokenizer.bytes_unicode import bytes_to_text
from lmforge.tokenizer.tiktoken_file import read_tiktoken

EOT = "<|endoftext|>"
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
    return train_bpe(CORPUS * 20, vocab_size=600, special_tokens=[EOT, "<|pad|>"])


@pytest.fixture(scope="session")
def stdlib_texts():
    """About 400 KB of real Python source (a few whole standard-library modules)."""
    names = ["argparse", "ast", "dataclasses", "functools", "inspect", "json/decoder", "typing"]
    return [(stdlib_root() / f"{name}.py").read_text(encoding="utf-8") for name in names]


@pytest.fixture(scope="session")
def gpt2_ranks():
    """GPT-2's BPE ranks, from the gpt2.tiktoken file that openai-whisper ships."""
    folder = importlib.util.find_spec("whisper").submodule_search_locations[0]
    return read_tiktoken(Path(folder) / "assets" / "gpt2.tiktoken")


@pytest.fixture(scope="session")
def gpt2_tiktoken(gpt2_ranks):
    """Exactly what tiktoken.get_encoding("gpt2") builds, without downloading."""
    return tiktoken.Encoding(
        name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=gpt2_ranks, special_tokens={EOT: 50256}
    )


@pytest.fixture(scope="session")
def gpt2_folder(gpt2_ranks, tmp_path_factory):
    """A folder holding only GPT-2's published files: vocab.json and merges.txt."""
    folder = tmp_path_factory.mktemp("gpt2")
    vocab = {bytes_to_text(t): i for t, i in gpt2_ranks.items()}
    vocab[EOT] = 50256
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    merges = Tokenizer(gpt2_ranks, {}).merges  # GPT-2's merges are exactly its ranks' splits
    lines = [f"{bytes_to_text(a)} {bytes_to_text(b)}" for a, b in merges]
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(lines) + "\n", "utf-8")
    return folder
