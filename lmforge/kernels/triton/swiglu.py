"""SwiGLU's gate in Triton: silu(gate) · up, forward and backward, elementwise.

Reference: `F.silu(gate) * up`, the product inside lmforge.model.layers.SwiGLU. Computed in
fp32 and stored in the inputs' dtype; the backward recomputes sigmoid(gate) from the saved
inputs instead of saving it, so only the two inputs are kept.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lmforge.errors import LmforgeError
from lmforge.kernels.triton import interpreting

INTERPRETED = interpreting()  # as triton.jit built this module's kernels (fixed at import)

BLOCK = 256 if INTERPRETED else 1024


@triton.jit
def _forward(GATE, UP, OUT, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    a = tl.load(GATE + offsets, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(UP + offsets, mask=mask, other=0.0).to(tl.float32)
    out = a * tl.sigmoid(a) * b
    tl.store(OUT + offsets, out.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _backward(DOUT, GATE, UP, DGATE, DUP, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    dout = tl.load(DOUT + offsets, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(GATE + offsets, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(UP + offsets, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(a)
    silu = a * sig
    dgate = dout * b * sig * (1.0 + a * (1.0 - sig))  # d silu(a) / da = sig · (1 + a(1 − sig))
    tl.store(DGATE + offsets, dgate.to(DGATE.dtype.element_ty), mask=mask)
    tl.store(DUP + offsets, (dout * silu).to(DUP.dtype.element_ty), mask=mask)


class SwiGLUFunction(torch.autograd.Function):
    """silu(gate) · up for same-shaped gate and up; saves both inputs."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        gate, up = gate.contiguous(), up.contiguous()
        out = torch.empty_like(gate)
        n = gate.numel()
        _forward[(triton.cdiv(n, BLOCK),)](gate, up, out, n, BLOCK=BLOCK)
        ctx.save_for_backward(gate, up)
        return out

    @staticmethod
    def backward(ctx, dout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate, up = ctx.saved_tensors
        dout = dout.contiguous()
        dgate, dup = torch.empty_like(gate), torch.empty_like(up)
        n = gate.numel()
        _backward[(triton.cdiv(n, BLOCK),)](dout, gate, up, dgate, dup, n, BLOCK=BLOCK)
        return dgate, dup


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) · up (`F.silu(gate) * up`); gate and up must have the same shape and dtype."""
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise LmforgeError(
            f"swiglu needs gate and up of one shape and dtype, got {tuple(gate.shape)} "
            f"{gate.dtype} and {tuple(up.shape)} {up.dtype}: pass the two projections' outputs"
        )
    return SwiGLUFunction.apply(gate, up)
