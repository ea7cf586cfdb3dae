"""Shared test setup: quiet progress bars, an isolated cache, a small real corpus and its shards."""

import os
import shutil

import pytest
import torch

os.environ.setdefault("LMFORGE_PROGRESS", "0")


@pytest.fixture(autouse=True)
def _isolate(monkeypatch, tmp_path_factory):
    torch.manual_seed(0)
    monkeypatch.setenv("LMFORGE_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory):
    """A folder of 40 real Python source files (as .txt) from the standard library."""
    from lmforge.data.documents import stdlib_root

    out = tmp_path_factory.mktemp("corpus")
    files = sorted(stdlib_root().glob("*.py"))[:40]
    for path in files:
        shutil.copyfile(path, out / (path.stem + ".txt"))
    return out


@pytest.fixture(scope="session")
def prepared(corpus_dir, tmp_path_factory):
    """The corpus deduplicated, split, tokenized (vocab 320) and sharded."""
    from lmforge.prepare import DataConfig, TokenizerConfig, prepare_corpus

    root = tmp_path_factory.mktemp("prepared")
    return prepare_corpus(
        DataConfig(path=str(corpus_dir), val_fraction=0.1, workers=1),
        TokenizerConfig(vocab_size=320),
        root,
    )
