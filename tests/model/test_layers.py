import math

import pytest
import torch
import torch.nn.functional as F

from lmforge.model import Embedding, Linear, RMSNorm, SwiGLU


def test_linear_is_x_times_weight_transposed():
    layer = Linear(8, 5)
    x = torch.randn(3, 4, 8)
    assert layer.weight.shape == (5, 8)
    torch.testing.assert_close(layer(x), x @ layer.weight.T)


def test_embedding_is_row_indexing():
    emb = Embedding(10, 6)
    ids = torch.tensor([[1, 9, 1], [0, 3, 7]])
    torch.testing.assert_close(emb(ids), emb.weight[ids])


@pytest.mark.parametrize(
    "make, std",
    [
        (lambda: Linear(512, 256).weight, math.sqrt(2 / (512 + 256))),
        (lambda: Embedding(1024, 256).weight, 1.0),
    ],
)
def test_init_is_truncated_normal_with_target_std(make, std):
    w = make().detach()
    assert w.abs().max() <= 3 * std + 1e-6
    # truncation at ±3σ shrinks the std by a factor ≈ 0.9866
    assert w.std().item() == pytest.approx(std * 0.9866, rel=0.02)
    assert w.mean().item() == pytest.approx(0.0, abs=0.01 * std)


def test_rmsnorm_matches_formula_in_float64():
    norm = RMSNorm(16, eps=1e-5).double()
    with torch.no_grad():
        norm.weight.copy_(torch.randn(16))
    x = torch.randn(4, 16, dtype=torch.float64)
    expected = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    torch.testing.assert_close(norm(x), expected)


def test_rmsnorm_bf16_in_bf16_out_computed_in_fp32():
    norm = RMSNorm(64)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(64) + 0.5)
    x = (torch.randn(8, 64) * 3).bfloat16()
    out = norm(x)
    assert out.dtype == torch.bfloat16
    xf = x.float()
    expected = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    torch.testing.assert_close(out, expected.bfloat16(), atol=0, rtol=0)


def test_rmsnorm_gain_starts_at_one():
    assert torch.equal(RMSNorm(7).weight, torch.ones(7))


def test_swiglu_matches_manual():
    mlp = SwiGLU(12, 20)
    x = torch.randn(2, 3, 12)
    w1, w3, w2 = mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight
    expected = (F.silu(x @ w1.T) * (x @ w3.T)) @ w2.T
    torch.testing.assert_close(mlp(x), expected)
