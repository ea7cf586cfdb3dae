import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.infer import KVCache
from lmforge.model import ModelConfig, Transformer


@pytest.fixture
def model() -> Transformer:
    config = ModelConfig(vocab_size=100, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2)
    return Transformer(config).eval()


@torch.no_grad()
def test_prefill_then_token_by_token_matches_full_forward(model):
    ids = torch.randint(0, 100, (2, 20))
    full = model(ids)
    cache = KVCache.for_model(model, batch_size=2, max_seq_len=20)
    steps = [model(ids[:, :8], cache)]
    steps += [model(ids[:, t : t + 1], cache) for t in range(8, 20)]
    assert cache.pos == 20
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_chunked_prefill_at_nonzero_position_matches_full_forward(model):
    ids = torch.randint(0, 100, (1, 20))
    full = model(ids)
    cache = KVCache.for_model(model, batch_size=1)
    chunks = [model(ids[:, a:b], cache) for a, b in [(0, 5), (5, 12), (12, 13), (13, 20)]]
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_reset_starts_over(model):
    ids = torch.randint(0, 100, (1, 6))
    cache = KVCache.for_model(model, 1, max_seq_len=6)
    first = model(ids, cache)
    cache.reset()
    assert cache.pos == 0
    torch.testing.assert_close(model(ids, cache), first)


def test_cache_defaults_follow_config_and_weights(model):
    cache = KVCache.for_model(model, 3)
    assert cache.k[0].shape == (3, 2, model.config.max_seq_len, 8)
    assert len(cache.k) == len(cache.v) == 2
    assert cache.k[0].dtype == torch.float32
    assert KVCache.for_model(model, 1, dtype=torch.bfloat16).v[1].dtype == torch.bfloat16


@torch.no_grad()
def test_cache_overflow_is_an_error(model):
    cache = KVCache.for_model(model, 1, max_seq_len=8)
    model(torch.zeros(1, 6, dtype=torch.long), cache)
    with pytest.raises(LmforgeError, match="overflow"):
        model(torch.zeros(1, 3, dtype=torch.long), cache)
    assert cache.pos == 6


@torch.no_grad()
def test_wrong_batch_size_is_an_error(model):
    cache = KVCache.for_model(model, 2)
    with pytest.raises(LmforgeError, match="batch_size=1"):
        model(torch.zeros(1, 3, dtype=torch.long), cache)
