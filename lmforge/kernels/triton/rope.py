"""Rotary position embeddings in Triton, forward and backward, in lmforge's "rotate_half" layout.

Reference: lmforge.model.rope.apply_rope, x·cos + rotate_half(x)·sin on x (..., T, head_dim)
with tables (T, head_dim) or (B, 1, T, head_dim): channel i pairs with channel i + head_dim/2.
Computed in fp32 and returned in x's dtype. The backward is the transposed rotation, the same
kernel with the sines swapped between halves and negated.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from lmforge.errors import LmforgeError
from lmforge.kernels.triton import interpreting

INTERPRETED = interpreting()  # as triton.jit built this module's kernels (fixed at import)


@triton.jit
def _rotate(X, COS, SIN, Y, T, D, rows_per_table, BACKWARD: tl.constexpr, BLOCK: tl.constexpr):
    # program (table row, x row among those sharing it): x row r·T + t uses table row c·T + t
    table_row = tl.program_id(0).to(tl.int64)
    c, t = table_row // T, table_row % T
    x_row = (c * rows_per_table + tl.program_id(1)) * T + t
    half = D // 2
    cols = tl.arange(0, BLOCK)
    mask = cols < half
    x_lo = tl.load(X + x_row * D + cols, mask=mask, other=0.0).to(tl.float32)
    x_hi = tl.load(X + x_row * D + half + cols, mask=mask, other=0.0).to(tl.float32)
    cos_lo = tl.load(COS + table_row * D + cols, mask=mask, other=0.0)
    cos_hi = tl.load(COS + table_row * D + half + cols, mask=mask, other=0.0)
    sin_lo = tl.load(SIN + table_row * D + cols, mask=mask, other=0.0)
    sin_hi = tl.load(SIN + table_row * D + half + cols, mask=mask, other=0.0)
    if BACKWARD:
        y_lo = x_lo * cos_lo + x_hi * sin_hi
        y_hi = x_hi * cos_hi - x_lo * sin_lo
    else:
        y_lo = x_lo * cos_lo - x_hi * sin_lo
        y_hi = x_hi * cos_hi + x_lo * sin_hi
    tl.store(Y + x_row * D + cols, y_lo.to(Y.dtype.element_ty), mask=mask)
    tl.store(Y + x_row * D + half + cols, y_hi.to(Y.dtype.element_ty), mask=mask)


def _tables(x: torch.Tensor, cos: torch.Tensor) -> int:
    """How many table rows (T each) cos holds for x: cos's leading dims, left-padded with 1s,
    must equal x's up to some dim and be 1 after it (as (T, D) and (B, 1, T, D) are)."""
    if x.dim() < 2 or x.shape[-1] % 2 or cos.dim() > x.dim() or cos.shape[-2:] != x.shape[-2:]:
        raise LmforgeError(
            f"rope needs x (..., T, head_dim) with an even head_dim and tables (..., T, head_dim), "
            f"got x {tuple(x.shape)} and cos {tuple(cos.shape)}: slice the tables to x's positions"
        )
    lead = (1,) * (x.dim() - cos.dim()) + tuple(cos.shape[:-2])
    n = len(lead)
    while n and lead[n - 1] == 1:
        n -= 1
    if lead[:n] != tuple(x.shape[:n]):
        raise LmforgeError(
            f"rope tables {tuple(cos.shape)} do not broadcast over x {tuple(x.shape)} as "
            "(T, head_dim) or (B, 1, T, head_dim): give each batch row its own tables"
        )
    return math.prod(lead[:n])


def _launch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool) -> torch.Tensor:
    tables = _tables(x, cos)
    t, d = x.shape[-2:]
    x = x.contiguous()
    y = torch.empty_like(x)
    rows_per_table = x.numel() // (t * d) // tables
    grid = (tables * t, rows_per_table)
    cos, sin = (s.float().reshape(tables * t, d).contiguous() for s in (cos, sin))
    block = triton.next_power_of_2(d // 2)
    _rotate[grid](x, cos, sin, y, t, d, rows_per_table, BACKWARD=backward, BLOCK=block)
    return y


class RopeFunction(torch.autograd.Function):
    """Rotates x by the angles whose cosines and sines are cos and sin; saves only the tables."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        return _launch(x, cos, sin, backward=False)

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        cos, sin = ctx.saved_tensors
        return _launch(dy, cos, sin, backward=True), None, None


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (..., T, head_dim) rotated by tables (T, head_dim) or (B, 1, T, head_dim), as
    lmforge.model.rope.apply_rope."""
    return RopeFunction.apply(x, cos, sin)
