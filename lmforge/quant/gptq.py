"""GPTQ (Frantar et al. 2022): quantize a Linear column by column, feeding each column's rounding
error back into the columns not yet quantized, weighted by the inverse Hessian of the layer's
output error on calibration inputs.

The Hessian is H = 2·XᵀX/n over calibration inputs X (n, in). Work is done in float64 so that
the blocked algorithm (lazy batch updates of the columns beyond each block) gives the same codes
as the plain per-column loop it reorganises.
"""

from __future__ import annotations

import torch

from lmforge.errors import LmforgeError
from lmforge.model.transformer import Transformer
from lmforge.quant.calibration import block_linears, block_passes, check_inputs
from lmforge.quant.schemes import (
    INT8_MAX,
    QuantizedWeight,
    check_shape,
    int4_codes,
    int4_params,
    int4_weight,
    int8_scales,
)


def gptq_quantize(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    scheme: str,
    group_size: int | None,
    block_size: int = 128,
    damp: float = 0.01,
    act_order: bool = False,
) -> QuantizedWeight:
    """Quantize weight (out, in) with GPTQ given the Hessian (in, in) of its inputs.

    int8: per-row scales from the whole row first. int4: each group's scale and zero are
    computed when the group's first column comes up, from the error-updated weights; with
    act_order (columns in order of decreasing Hessian diagonal) they come from the original
    weights instead, so groups stay contiguous in the stored layout. block_size is rounded up
    to a multiple of group_size so that a group never straddles two blocks.
    """
    out, cols = weight.shape
    if hessian.shape != (cols, cols):
        raise LmforgeError(
            f"GPTQ hessian {tuple(hessian.shape)} does not match weight {tuple(weight.shape)}: "
            f"pass an ({cols}, {cols}) Hessian of the layer's inputs"
        )
    check_shape((out, cols), scheme, group_size)
    if scheme == "int4":
        block_size = -(-block_size // group_size) * group_size
    w = weight.detach().to(torch.float64).clone()
    h = hessian.detach().to(torch.float64).clone()
    dead = h.diagonal() == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0  # no input ever reaches these columns
    static = act_order and scheme == "int4"
    n_groups = cols // group_size if scheme == "int4" else 1
    scales = torch.zeros(out, n_groups, dtype=torch.float32, device=w.device)
    zeros = torch.zeros_like(scales)
    if static:
        scales, zeros = int4_params(w.float(), group_size)
    row_scale = int8_scales(w) if scheme == "int8" else None
    perm = torch.argsort(h.diagonal(), descending=True) if act_order else torch.arange(cols)
    w, h = w[:, perm], h[perm][:, perm]
    h += damp * h.diagonal().mean() * torch.eye(cols, dtype=h.dtype, device=h.device)
    hinv = _upper_cholesky_inverse(h)
    codes = torch.zeros(out, cols, dtype=torch.int16, device=w.device)

    for b0 in range(0, cols, block_size):
        b1 = min(b0 + block_size, cols)
        wb = w[:, b0:b1].clone()
        errs = torch.zeros_like(wb)
        hb = hinv[b0:b1, b0:b1]
        for i in range(b1 - b0):
            c = b0 + i
            col = wb[:, i]
            if scheme == "int8":
                code = torch.clamp(torch.round(col / row_scale.double()), -INT8_MAX, INT8_MAX)
                q = code * row_scale.double()
            else:
                g = int(perm[c]) // group_size if static else c // group_size
                if not static and c % group_size == 0:
                    sc, ze = int4_params(wb[:, i : i + group_size].float(), group_size)
                    scales[:, g], zeros[:, g] = sc[:, 0], ze[:, 0]
                sc = scales[:, g : g + 1]
                ze = zeros[:, g : g + 1]
                code = int4_codes(col[:, None].float(), sc, ze, 1)[:, 0].to(torch.float64)
                q = (code - ze[:, 0].double()) * sc[:, 0].double()
            codes[:, c] = code.to(torch.int16)
            err = (col - q) / hb[i, i]
            wb[:, i:] -= err[:, None] * hb[i, i:][None, :]
            errs[:, i] = err
        w[:, b1:] -= errs @ hinv[b0:b1, b1:]

    codes = codes[:, torch.argsort(perm)]
    if scheme == "int4":
        return int4_weight(codes.to(torch.uint8), scales, zeros, group_size)
    return QuantizedWeight("int8", codes.to(torch.int8), row_scale, None, None, (out, cols))


def _upper_cholesky_inverse(h: torch.Tensor) -> torch.Tensor:
    """U with UᵀU = H⁻¹ (upper Cholesky factor of the inverse), as GPTQ's updates need."""
    lower, info = torch.linalg.cholesky_ex(h)
    if info.item() != 0:
        raise LmforgeError(
            "GPTQ Hessian is not positive definite even after dampening: raise damp "
            "(e.g. 0.1) or use more calibration data"
        )
    return torch.linalg.cholesky(torch.cholesky_inverse(lower), upper=True)


@torch.no_grad()
def gptq_quantize_model(
    model: Transformer,
    calibration: torch.Tensor,
    scheme: str,
    group_size: int | None,
    **kw: object,
) -> dict[str, QuantizedWeight]:
    """GPTQ for every block's attention and SwiGLU Linears, keyed like "layers.0.attn.q_proj".

    Sequential: each block's Hessians come from inputs computed by the blocks before it with
    their weights already quantized. The model's weights are left as they were. MoE experts are
    skipped (they stay round-to-nearest) and so are the embedding and output head.
    """
    check_inputs(model, calibration, scheme, group_size)
    result: dict[str, QuantizedWeight] = {}
    for i, block, run in block_passes(model, calibration):
        linears = block_linears(block)
        hessians = {
            n: torch.zeros(
                lin.in_features, lin.in_features, dtype=torch.float64, device=lin.weight.device
            )
            for n, lin in linears.items()
        }
        counts = dict.fromkeys(linears, 0)

        def accumulate(
            name: str, x: torch.Tensor, hessians: dict = hessians, counts: dict = counts
        ) -> None:
            x = x.to(torch.float64)
            hessians[name] += 2.0 * x.T @ x
            counts[name] += len(x)

        run(accumulate)
        originals = {}
        for name, linear in linears.items():
            qw = gptq_quantize(
                linear.weight, hessians[name] / counts[name], scheme, group_size, **kw
            )
            result[f"layers.{i}.{name}"] = qw
            originals[name] = linear.weight.detach().clone()
            linear.weight.copy_(qw.dequantize(linear.weight.dtype))
        run()
        for name, linear in linears.items():
            linear.weight.copy_(originals[name])
    return result
