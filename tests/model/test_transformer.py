import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.model import ModelConfig, Transformer

TINY = dict(vocab_size=100, d_model=32, n_layers=2, n_heads=4, max_seq_len=32)


def test_logits_shape():
    model = Transformer(ModelConfig(**TINY))
    assert model(torch.randint(0, 100, (3, 9))).shape == (3, 9, 100)


def test_default_ffn_dim_rounds_eight_thirds_up_to_64():
    assert ModelConfig(d_model=256).ffn_dim == 704  # 682.7 → 704
    assert ModelConfig(d_model=96).ffn_dim == 256  # 256 exactly
    assert ModelConfig(d_model=96, d_ff=100).ffn_dim == 100


@pytest.mark.parametrize("n_kv_heads, tie", [(None, False), (2, False), (1, True)])
def test_num_params_matches_hand_count(n_kv_heads, tie):
    c = ModelConfig(**TINY, n_kv_heads=n_kv_heads, tie_embeddings=tie, d_ff=48)
    v, d, f, hd = 100, 32, 48, 8
    kv = (n_kv_heads or 4) * hd
    per_layer = d * d + 2 * d * kv + d * d + 3 * d * f + 2 * d  # q, k+v, o, mlp, two norms
    head = 0 if tie else v * d
    expected = v * d + 2 * per_layer + d + head
    model = Transformer(c)
    assert model.num_params() == expected
    assert model.num_params(exclude_embeddings=True) == expected - head
    n = expected - head
    assert model.flops_per_token(32) == 6 * n + 12 * 2 * 32 * 32


def test_tied_embeddings_share_one_parameter():
    model = Transformer(ModelConfig(**TINY, tie_embeddings=True))
    assert model.output.weight is model.tok_embeddings.weight
    assert sum(1 for _ in model.parameters()) == len(list(model.state_dict())) - 1
    untied = Transformer(ModelConfig(**TINY))
    assert untied.output.weight is not untied.tok_embeddings.weight


@pytest.mark.parametrize(
    "overrides, word",
    [
        (dict(d_model=30), "n_heads dividing d_model"),
        (dict(n_kv_heads=3), "n_kv_heads dividing n_heads"),
        (dict(d_model=36, n_heads=4), "odd"),
        (dict(vocab_size=0), "vocab_size"),
        (dict(n_layers=-1), "n_layers"),
        (dict(d_ff=0), "d_ff"),
        (dict(rope_theta=0.0), "rope_theta"),
    ],
)
def test_validate_names_the_problem(overrides, word):
    with pytest.raises(LmforgeError, match=word):
        Transformer(ModelConfig(**{**TINY, **overrides}))


def test_too_long_input_is_an_error():
    model = Transformer(ModelConfig(**TINY))
    with pytest.raises(LmforgeError, match="max_seq_len"):
        model(torch.zeros(1, 33, dtype=torch.long))
