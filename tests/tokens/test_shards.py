import json

import numpy as np
import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.tokens import (
    ShardMeta,
    WindowSampler,
    get_batch,
    load_doc_starts,
    load_tokens,
    read_meta,
    token_dtype,
    write_meta,
    write_shard,
)


def _write(tmp_path, docs, vocab_size):
    counts = write_shard(tmp_path, "train", docs, vocab_size)
    write_meta(
        tmp_path, ShardMeta(token_dtype(vocab_size).str, vocab_size, "fp", {"train": counts})
    )
    return counts


@pytest.mark.parametrize("vocab_size,itemsize", [(4096, 2), (65536, 2), (100_000, 4)])
def test_shard_round_trip_with_smallest_dtype(tmp_path, vocab_size, itemsize):
    docs = [[1, 2, 3], [vocab_size - 1], [], [7, 8]]
    counts = _write(tmp_path, docs, vocab_size)
    assert counts == {"tokens": 6, "documents": 4}
    tokens = load_tokens(tmp_path, "train")
    assert isinstance(tokens, np.memmap) and tokens.dtype.itemsize == itemsize
    assert tokens.tolist() == [1, 2, 3, vocab_size - 1, 7, 8]
    assert load_doc_starts(tmp_path, "train").tolist() == [0, 3, 4, 4]
    assert (tmp_path / "train.bin").stat().st_size == 6 * itemsize
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["vocab_size"] == vocab_size and read_meta(tmp_path).tokens == 6
    assert not list(tmp_path.glob("*.tmp"))


def test_missing_meta_or_shard_is_a_clear_error(tmp_path):
    with pytest.raises(LmforgeError, match="lmforge tokenize"):
        read_meta(tmp_path)
    _write(tmp_path, [[1, 2]], 300)
    with pytest.raises(LmforgeError, match="no shard 'val'"):
        load_tokens(tmp_path, "val")


def test_get_batch_targets_are_inputs_shifted_by_one():
    data = np.arange(1000, dtype=np.uint16)
    x, y = get_batch(data, 8, 16, "cpu", np.random.default_rng(0))
    assert x.shape == y.shape == (8, 16) and x.dtype == torch.int64
    assert torch.equal(y[:, :-1], x[:, 1:])
    assert torch.equal(y, x + 1)  # consecutive ids: each window is contiguous
    assert int(y.max()) <= 999


def test_get_batch_covers_the_whole_range_and_rejects_short_data():
    data = np.arange(20, dtype=np.uint16)
    x, _ = get_batch(data, 4000, 4, "cpu", np.random.default_rng(1))
    assert set(x[:, 0].tolist()) == set(range(16))  # every legal start is drawn
    with pytest.raises(LmforgeError, match="only 20 tokens"):
        get_batch(data, 1, 20)


def test_window_sampler_is_a_pure_function_of_seed_and_step():
    data = np.arange(10_000, dtype=np.uint16)
    a, b = WindowSampler(data, 4, 32, seed=5), WindowSampler(data, 4, 32, seed=5)
    assert torch.equal(a.batch(7)[0], b.batch(7)[0])
    assert torch.equal(a.batch(7, micro_step=1)[0], b.batch(7, micro_step=1)[0])
    assert not torch.equal(a.batch(7)[0], a.batch(8)[0])
    assert not torch.equal(a.batch(7)[0], a.batch(7, micro_step=1)[0])
    assert not torch.equal(a.batch(7)[0], WindowSampler(data, 4, 32, seed=6).batch(7)[0])
