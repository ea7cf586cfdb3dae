"""Branched rows: a context (the trunk) and continuations (branches) packed in one row compute
what each context + continuation computes alone."""

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.model import ModelConfig, Transformer
from lmforge.model.attention import document_mask, segment_positions
from lmforge.model.cache import KVCache


def model(max_seq_len: int = 16) -> Transformer:
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=max_seq_len
    )
    return Transformer(config).eval()


def test_branch_positions_continue_the_trunk_of_their_own_document():
    segments = torch.tensor([[0, 0, 0, 0, 0, 0, 1, 1, 1, 1]])
    branches = torch.tensor([[0, 0, 1, 1, 2, 2, 0, 0, 0, 1]])
    assert segment_positions(segments, branches).tolist() == [[0, 1, 2, 3, 2, 3, 0, 1, 2, 3]]
    assert segment_positions(segments).tolist() == [[0, 1, 2, 3, 4, 5, 0, 1, 2, 3]]


def test_a_branch_sees_its_trunk_and_itself_only():
    segments = torch.zeros(1, 6, dtype=torch.long)
    branches = torch.tensor([[0, 0, 1, 1, 2, 2]])
    mask = document_mask(segments, branches)[0, 0].int().tolist()
    assert mask == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],
        [1, 1, 0, 0, 1, 1],
    ]


def test_branched_row_computes_each_continuation_as_if_alone():
    m = model()
    context, tails = [3, 4, 5, 6, 7], [[8, 9, 10], [11], [12, 13]]
    row = context + [t for tail in tails for t in tail]
    branches = [0] * len(context) + [b for b, tail in enumerate(tails, 1) for _ in tail]
    with torch.no_grad():
        packed = m(torch.tensor([row]), branches=torch.tensor([branches]))[0]
        at = len(context)
        for tail in tails:
            alone = m(torch.tensor([context + tail]))[0]
            torch.testing.assert_close(packed[: len(context)], alone[: len(context)])
            torch.testing.assert_close(packed[at : at + len(tail)], alone[len(context) :])
            at += len(tail)


def test_a_row_may_exceed_the_window_while_its_positions_do_not():
    m = model(max_seq_len=8)
    context, tails = [1, 2, 3, 4, 5, 6], [[7, 8], [9, 10], [11, 12]]  # 12 tokens, positions < 8
    row = torch.tensor([context + [t for tail in tails for t in tail]])
    branches = torch.tensor([[0] * 6 + [1, 1, 2, 2, 3, 3]])
    with torch.no_grad():
        packed = m(row, branches=branches, logits_at=torch.tensor([[5, 6, 7, 8, 9, 10, 11]]))
        alone = m(torch.tensor([context + tails[2]]))[0]
    assert packed.shape == (1, 7, 50)
    torch.testing.assert_close(packed[0, 0], alone[5])
    torch.testing.assert_close(packed[0, 5:], alone[6:])
    too_far = torch.tensor([[0] * 9 + [1, 1, 1]])  # a trunk of 9 passes position 7
    with pytest.raises(LmforgeError, match="past model.max_seq_len=8"):
        m(row, branches=too_far)


@pytest.mark.parametrize("per_row", [False, True])
def test_a_tree_after_a_kv_cache_computes_what_the_whole_tree_does(per_row):
    """The cache holds the context's first tokens; the rest of the context and the branches
    come as one tree (a scored context whose beginning was cached)."""
    m = model()
    context, tails = [3, 4, 5, 6, 7], [[8, 9, 10], [11], [12, 13]]
    cached = 3
    tree = context[cached:] + [t for tail in tails for t in tail]
    branches = [0] * (len(context) - cached) + [b for b, t in enumerate(tails, 1) for _ in t]
    whole_branches = [0] * cached + branches
    cache = KVCache(2, 1, 2, 16, 8)
    with torch.no_grad():
        whole = m(torch.tensor([context[:cached] + tree]), branches=torch.tensor([whole_branches]))
        m(torch.tensor([context[:cached]]), cache)
        if per_row:
            cache.pos = torch.tensor([cache.pos])
        after = m(torch.tensor([tree]), cache, branches=torch.tensor([branches]))
    torch.testing.assert_close(after[0], whole[0, cached:])
