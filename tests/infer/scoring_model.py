"""The seeded tiny model the scoring tests (test_score.py, test_cached_score.py) score with."""

import torch

from lmforge.model import ModelConfig, Transformer


def scoring_model(max_seq_len: int = 48, n_kv_heads: int = 2) -> Transformer:
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=97,
        d_model=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=n_kv_heads,
        max_seq_len=max_seq_len,
    )
    return Transformer(config).eval()
