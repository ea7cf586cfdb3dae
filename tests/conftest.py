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
    """The corpus deduplicated, split, tokenized (vocab 320) and sharded.

    The corpus is named by a path relative to its parent: document ids hold the path they were
    read from, so this gives every session the same validation split (hashed from the ids),
    hence the same tokenizer, shards and training runs.
    """
    from lmforge.prepare import DataConfig, TokenizerConfig, prepare_corpus

    root = tmp_path_factory.mktemp("prepared")
    cwd = os.getcwd()
    os.chdir(corpus_dir.parent)
    try:
        return prepare_corpus(
            DataConfig(path=corpus_dir.name, val_fraction=0.1, workers=1),
            TokenizerConfig(vocab_size=320),
            root,
        )
    finally:
        os.chdir(cwd)
