"""The sparse MoE layer: token dispatch equals the dense reference, and the model wires it in."""

import torch

from lmforge.model import ModelConfig, Transformer
from lmforge.model.moe import MoE


def dense_reference(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """Every expert on every token, weighted by the routing weights (zero off the top-k)."""
    flat = x.reshape(-1, x.shape[-1])
    experts, weights = moe.route(flat)
    dense = torch.zeros(flat.shape[0], len(moe.experts), dtype=x.dtype)
    dense.scatter_(1, experts, weights)
    outs = torch.stack([expert(flat) for expert in moe.experts], dim=1)  # (N, E, d)
    return (dense[..., None] * outs).sum(1).reshape(x.shape)


def test_dispatch_matches_dense_reference_forward_and_backward():
    moe = MoE(d_model=32, d_ff=48, n_experts=4, top_k=2)
    x = torch.randn(3, 10, 32, requires_grad=True)
    y = moe(x)
    ref = dense_reference(moe, x)
    torch.testing.assert_close(y, ref)
    (g,) = torch.autograd.grad(y.square().sum(), x)
    (g_ref,) = torch.autograd.grad(ref.square().sum(), x)
    torch.testing.assert_close(g, g_ref)


def test_routing_weights_are_softmax_over_top_k_logits():
    moe = MoE(d_model=16, d_ff=16, n_experts=8, top_k=2)
    x = torch.randn(5, 16)
    experts, weights = moe.route(x)
    logits = moe.router(x)
    assert torch.equal(experts, logits.topk(2).indices)
    torch.testing.assert_close(weights, logits.gather(1, experts).softmax(-1))
    torch.testing.assert_close(weights.sum(-1), torch.ones(5))


def test_transformer_builds_moe_blocks_with_mixtral_names():
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_experts=4)
    model = Transformer(cfg)
    names = {n for n, _ in model.named_parameters()}
    assert "layers.1.mlp.router.weight" in names
    assert "layers.0.mlp.experts.3.down_proj.weight" in names
    logits = model(torch.randint(0, 64, (2, 8)))
    assert logits.shape == (2, 8, 64)
    idle = 2 * (4 - 2) * 3 * 32 * cfg.ffn_dim
    dense_n = model.num_params(exclude_embeddings=True) - idle
    assert model.flops_per_token(8) == 6 * dense_n + 12 * 2 * 32 * 8
