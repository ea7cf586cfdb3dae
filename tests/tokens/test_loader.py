import json

import numpy as np
import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.tokens import (
    DataSource,
    ShardMeta,
    TokenLoader,
    load_doc_starts,
    load_tokens,
    token_dtype,
    write_meta,
    write_shard,
)

VOCAB = 2**20  # uint32 ids, so a token's value can be its own offset


def _counting_shard(path, n_tokens, offset=0, doc_len=37):
    """A shard whose token at offset i is `offset + i`, cut into documents of doc_len."""
    ids = list(range(offset, offset + n_tokens))
    docs = [ids[i : i + doc_len] for i in range(0, n_tokens, doc_len)]
    counts = write_shard(path, "train", docs, VOCAB)
    write_meta(path, ShardMeta(token_dtype(VOCAB).str, VOCAB, "fp", {"train": counts}))
    return path


@pytest.fixture
def shard(tmp_path):
    return _counting_shard(tmp_path / "a", 8 * 100 + 1)  # 100 windows of seq_len 8


def _batches(loader, n):
    return [loader.next_batch() for _ in range(n)]


def _same(a, b):
    return len(a) == len(b) and all(
        all(torch.equal(s, t) for s, t in zip(x, y, strict=True)) for x, y in zip(a, b, strict=True)
    )


@pytest.mark.parametrize("chunk", [1, 3])
def test_an_epoch_visits_every_window_once_in_chunks(shard, chunk):
    with TokenLoader([DataSource(shard)], 10, 8, seed=5, chunk_sequences=chunk) as loader:
        x, y = (torch.cat(t) for t in zip(*_batches(loader, 10), strict=True))
    starts = x[:, 0].numpy()
    assert sorted(starts.tolist()) == list(range(0, 800, 8))  # windows every seq_len tokens
    assert torch.equal(x + 1, y) and torch.equal(x, x[:, :1] + torch.arange(8))
    assert starts.tolist() != sorted(starts.tolist())
    windows = starts // 8
    chunks = windows // chunk
    runs = np.split(windows, np.flatnonzero(np.diff(chunks)) + 1)
    assert len(runs) == -(-100 // chunk)  # each chunk's windows come together...
    assert all(np.array_equal(r, np.arange(r[0], r[0] + len(r))) for r in runs)  # ...in order


def test_epochs_reshuffle_deterministically_by_seed(shard):
    def epochs(seed):
        with TokenLoader([DataSource(shard)], 20, 8, seed=seed, prefetch=0) as loader:
            x = torch.cat([b[0][:, 0] for b in _batches(loader, 10)])
        return x[:100].tolist(), x[100:].tolist()

    first, second = epochs(1)
    assert sorted(first) == sorted(second) and first != second
    assert epochs(1) == (first, second)
    assert epochs(2)[0] != first


@pytest.mark.parametrize("prefetch", [0, 3])
def test_resume_mid_epoch_is_exact(shard, prefetch):
    def loader():
        return TokenLoader([DataSource(shard)], 6, 8, seed=3, prefetch=prefetch, chunk_sequences=4)

    with loader() as reference:
        expected = _batches(reference, 40)  # 240 windows: crosses two epoch boundaries
    for k in (7, 17, 33):
        with loader() as first:
            assert _same(_batches(first, k), expected[:k])
            state = json.loads(json.dumps(first.state_dict()))
        assert state["batches"] == k and state["taken"] == [6 * k]  # consumed, not prefetched
        with loader() as resumed:
            resumed.load_state_dict(state)
            assert _same(_batches(resumed, 40 - k), expected[k:])


def test_load_state_drops_prefetched_batches(shard):
    with TokenLoader([DataSource(shard)], 4, 8, seed=0, prefetch=4) as loader:
        start = loader.state_dict()
        first = _batches(loader, 3)
        loader.load_state_dict(start)
        assert _same(_batches(loader, 3), first)


def test_prefetch_gives_the_same_batches(shard, tmp_path):
    other = _counting_shard(tmp_path / "b", 500, offset=10_000)
    sources = [DataSource(shard, weight=2.0), DataSource(other, weight=1.0)]
    with (
        TokenLoader(sources, 6, 8, seed=1, prefetch=0, segments=True) as sync,
        TokenLoader(sources, 6, 8, seed=1, prefetch=2, segments=True) as ahead,
    ):
        assert _same(_batches(sync, 30), _batches(ahead, 30))


@pytest.mark.parametrize("world_size", [2, 4])
def test_data_parallel_ranks_split_the_single_rank_batch(shard, tmp_path, world_size):
    other = _counting_shard(tmp_path / "b", 500, offset=10_000)
    sources = [DataSource(shard, weight=0.7), DataSource(other, weight=0.3)]
    with TokenLoader(sources, 8, 8, seed=2, segments=True) as single:
        expected = _batches(single, 12)
    ranks = [
        TokenLoader(sources, 8, 8, seed=2, rank=r, world_size=world_size, segments=True)
        for r in range(world_size)
    ]
    per_rank = [_batches(r, 12) for r in ranks]
    for step in range(12):
        parts = [per_rank[r][step] for r in range(world_size)]
        assert all(p[0].shape == (8 // world_size, 8) for p in parts)
        joined = tuple(torch.cat(t) for t in zip(*parts, strict=True))
        assert _same([joined], [expected[step]])
        starts = [set(p[0][:, 0].tolist()) for p in parts]
        assert sum(len(s) for s in starts) == 8 and len(set.union(*starts)) == 8
    assert all(r.state_dict() == single.state_dict() for r in ranks)  # state is global
    for r in ranks:
        r.close()


def test_state_resumes_under_another_world_size(shard):
    with TokenLoader([DataSource(shard)], 8, 8, seed=4) as single:
        _batches(single, 5)
        state = single.state_dict()
        expected = single.next_batch()
    halves = []
    for rank in range(2):
        with TokenLoader([DataSource(shard)], 8, 8, seed=4, rank=rank, world_size=2) as loader:
            loader.load_state_dict(state)
            halves.append(loader.next_batch())
    assert _same([tuple(torch.cat(t) for t in zip(*halves, strict=True))], [expected])


def test_blend_realises_the_weights_deterministically(shard, tmp_path):
    other = _counting_shard(tmp_path / "b", 300, offset=10_000)  # small: it repeats epochs
    sources = [DataSource(shard, weight=0.7), DataSource(other, weight=0.3, name="code")]
    with (
        TokenLoader(sources, 16, 8, seed=9) as loader,
        TokenLoader(sources, 16, 8, seed=9) as again,
    ):
        batches = _batches(loader, 200)
        assert _same(batches, _batches(again, 200))
        mixture = loader.mixture()
    from_b = sum(int((b[0][:, 0] >= 10_000).sum()) for b in batches)
    assert list(mixture) == ["a/train", "code"]
    assert mixture["code"] == from_b / 3200
    assert abs(mixture["a/train"] - 0.7) < 0.002 and abs(mixture["code"] - 0.3) < 0.002
    assert loader.epochs()["code"] > 25  # 37 windows per epoch, 960 drawn
    first = [int((b[0][:, 0] >= 10_000).sum()) for b in batches[:50]]
    assert all(4 <= n <= 6 for n in first)  # smooth: every batch near 30 % of 16


def test_segments_follow_the_document_index(shard):
    starts = load_doc_starts(shard, "train")
    with TokenLoader([DataSource(shard)], 10, 8, seed=0, segments=True) as loader:
        for x, _, seg in _batches(loader, 10):
            assert seg.dtype == torch.int32 and seg.shape == x.shape
            doc = np.searchsorted(starts, x.numpy(), side="right") - 1  # token value = offset
            assert np.array_equal(seg.numpy(), doc - doc[:, :1])  # no empty documents here


def test_segments_start_where_the_real_corpus_has_separators(prepared):
    tokens = load_tokens(prepared.shard_dir, "train")
    eot = int(tokens[0])  # every document starts with <|endoftext|>
    with TokenLoader([DataSource(prepared.shard_dir)], 8, 64, seed=0, segments=True) as loader:
        for x, _, seg in _batches(loader, 20):
            new_doc = seg[:, 1:] != seg[:, :-1]
            assert torch.equal(new_doc, x[:, 1:] == eot)
            assert torch.all(seg[:, 1:] - seg[:, :-1] >= 0)


def test_pinning_follows_cuda_availability(shard):
    """Pinned host memory only pays off for CUDA copies; on a CPU-only machine it stays off."""
    with TokenLoader([DataSource(shard)], 4, 8, seed=0) as loader:
        assert loader.pin_memory == torch.cuda.is_available()
        x, y = loader.next_batch("cpu")
    assert torch.equal(x + 1, y)


def test_mismatched_state_and_bad_layouts_are_clear_errors(shard, tmp_path):
    with TokenLoader([DataSource(shard)], 4, 8, seed=0) as loader:
        state = loader.state_dict()
    with (
        TokenLoader([DataSource(shard)], 4, 8, seed=1) as other,
        pytest.raises(LmforgeError, match="seed"),
    ):
        other.load_state_dict(state)
    with pytest.raises(LmforgeError, match="multiple of the data-parallel size"):
        TokenLoader([DataSource(shard)], 6, 8, world_size=4)
    with pytest.raises(LmforgeError, match="fewer than one window"):
        TokenLoader([DataSource(_counting_shard(tmp_path / "tiny", 8))], 4, 8)
    with pytest.raises(LmforgeError, match="distinct name"):
        TokenLoader([DataSource(shard), DataSource(shard)], 4, 8)
