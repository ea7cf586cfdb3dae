"""GPTQ: the blocked algorithm with lazy batch updates gives the codes of the plain per-column
loop it reorganises; it reconstructs a layer's outputs better than RTN (int4 and int8); and the
sequential whole-model pass quantizes every block Linear and beats RTN on the model's outputs.
"""

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.quant.gptq import gptq_quantize, gptq_quantize_model
from lmforge.quant.schemes import fake_quantize, int4_codes, int4_params, int8_scales
from tests.quant.test_awq import calibration, counting_batch, outlier_model, rtn, trained_model


def layer(out: int = 24, cols: int = 128, n: int = 400, seed: int = 0):
    """A weight and correlated inputs with a few outlier channels; H = 2XᵀX/n."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, cols, generator=g)
    x = torch.randn(n, cols // 4, generator=g) @ torch.randn(cols // 4, cols, generator=g)
    x = x + 0.3 * torch.randn(n, cols, generator=g)
    x[:, :5] *= 8.0
    return w, x, 2.0 * x.double().T @ x.double() / n


def reference(w, h, scheme, group_size, damp=0.01):
    """Plain GPTQ: one column at a time, updating every later column right away."""
    w, h = w.double().clone(), h.double().clone()
    cols = w.shape[1]
    h += damp * h.diagonal().mean() * torch.eye(cols, dtype=h.dtype)
    u = torch.linalg.cholesky(torch.linalg.inv(h), upper=True)
    q_all = torch.zeros_like(w)
    row_scale = int8_scales(w.float()).double()
    for c in range(cols):
        if scheme == "int4" and c % group_size == 0:
            sc, ze = int4_params(w[:, c : c + group_size].float(), group_size)
        if scheme == "int4":
            code = int4_codes(w[:, c : c + 1].float(), sc, ze, 1)[:, 0].double()
            q = (code - ze[:, 0].double()) * sc[:, 0].double()
        else:
            q = torch.clamp(torch.round(w[:, c] / row_scale), -127, 127) * row_scale
        q_all[:, c] = q
        err = (w[:, c] - q) / u[c, c]
        w[:, c:] -= err[:, None] * u[c, c:][None, :]
    return q_all


def out_error(q, w, x):
    return (x @ (q.float() - w).T).pow(2).sum().item()


@pytest.mark.parametrize(("scheme", "group_size"), [("int4", 32), ("int4", 64), ("int8", 32)])
def test_blocked_equals_per_column_reference(scheme, group_size):
    w, _, h = layer()
    got = gptq_quantize(w, h, scheme, group_size, block_size=32).dequantize(torch.float64)
    torch.testing.assert_close(got, reference(w, h, scheme, group_size), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("scheme", "group_size", "act_order"),
    [("int4", 32, False), ("int4", 128, False), ("int4", 32, True), ("int8", 32, False)],
)
def test_gptq_beats_rtn_on_layer_outputs(scheme, group_size, act_order):
    w, x, h = layer()
    q = gptq_quantize(w, h, scheme, group_size, act_order=act_order)
    assert tuple(q.shape) == tuple(w.shape)
    assert out_error(q.dequantize(torch.float32), w, x) < 0.8 * out_error(
        fake_quantize(w, scheme, group_size), w, x
    )


def test_dead_columns_and_bad_hessian():
    w, _, h = layer()
    h[:, 7] = 0.0
    h[7, :] = 0.0
    q = gptq_quantize(w, h, "int4", 32).dequantize(torch.float32)
    assert torch.isfinite(q).all() and q[:, 7].abs().max() < 1e-6
    with pytest.raises(LmforgeError, match="hessian"):
        gptq_quantize(w, h[:10, :10], "int4", 32)
    with pytest.raises(LmforgeError, match="scheme"):
        gptq_quantize(w, h, "int3", 32)


def test_sequential_model_pass_beats_rtn():
    model, ids = outlier_model(), calibration()
    weights = {n: p.clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        ref = model(ids)
    result = gptq_quantize_model(model, ids, "int4", 32)
    names = [
        f"layers.{i}.{m}"
        for i in range(2)
        for m in (
            "attn.q_proj",
            "attn.k_proj",
            "attn.v_proj",
            "attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        )
    ]
    assert sorted(result) == sorted(names)
    assert all(torch.equal(p, weights[n]) for n, p in model.named_parameters())  # untouched
    plain = rtn(outlier_model(), "int4", 32)
    with torch.no_grad():
        err_rtn = (plain(ids) - ref).pow(2).mean().item()
        for name, qw in result.items():
            model.get_submodule(name).weight.copy_(qw.dequantize(torch.float32))
        err_gptq = (model(ids) - ref).pow(2).mean().item()
    assert err_gptq < 0.7 * err_rtn


def test_gptq_beats_rtn_on_a_briefly_trained_model():
    ids, cal = counting_batch(1)[:, :32], counting_batch(2)[:, :32]
    model = trained_model()
    with torch.no_grad():
        ref = model(ids)
    plain = rtn(trained_model(), "int4", 32)
    result = gptq_quantize_model(model, cal, "int4", 32)
    with torch.no_grad():
        for name, qw in result.items():
            model.get_submodule(name).weight.copy_(qw.dequantize(torch.float32))
        assert (model(ids) - ref).pow(2).mean() < 0.9 * (plain(ids) - ref).pow(2).mean()
