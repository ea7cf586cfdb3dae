"""Shared test setup: quiet progress bars, an isolated cache, a small real corpus and its shards."""

import os
import shutil

import pytest

os.environ.setdefault("LMFORGE_PROGRESS", "0")
# Set before torch loads OpenMP (here and in every process a test starts): OpenMP's threads
# sleep at a barrier instead of spinning. The 2 workers' threads outnumber 2 cores, and a
# spinning thread holds the core the thread it waits for needs: a tiny model's training step
# took 10x longer in wall time, and 14x the CPU, with two such processes side by side.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Inductor compiles the C++ kernels in this process, one after another. Otherwise, with triton
# installed, the first compile in each process starts a pool of compile workers (a sidecar and
# one process per core, each importing torch) that CPU kernels never use: 3 to 10 s of CPU per
# test process that compiles, taken from the other worker.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


@pytest.fixture(autouse=True)
def _isolate(monkeypatch, tmp_path_factory):
    import torch

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
