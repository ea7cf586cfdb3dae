"""RMSNorm in Triton, forward and backward (dx and dweight).

Reference: lmforge.model.layers.RMSNorm, x / rms(x) · weight computed in fp32 and returned in
x's dtype. One program normalizes one row (the whole row fits one block); the backward keeps
rstd from the forward, and each program sums its rows' weight gradients in fp32 so the
weight gradient is one small (programs × dim) reduction instead of a (rows × dim) one.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lmforge.errors import LmforgeError
from lmforge.kernels.triton import interpreting

INTERPRETED = interpreting()  # as triton.jit built this module's kernels (fixed at import)

MAX_DIM = 65536


def _num_warps(block: int) -> int:
    return 4 if block < 2048 else 8 if block < 8192 else 16


@triton.jit
def _forward(X, W, Y, RSTD, N, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(X + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    tl.store(RSTD + row, rstd)
    tl.store(Y + row * N + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _backward(DY, X, W, RSTD, DX, DW_PARTIAL, M, N, rows_per_program, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
    first = pid * rows_per_program
    offsets = first.to(tl.int64) * N + cols
    for row in range(first, tl.minimum(first + rows_per_program, M)):
        x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + offsets, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row)
        x_hat = x * rstd
        g = dy * w
        dx = rstd * (g - x_hat * (tl.sum(g * x_hat, axis=0) / N))
        tl.store(DX + offsets, dx.to(DX.dtype.element_ty), mask=mask)
        dw += dy * x_hat
        offsets += N
    tl.store(DW_PARTIAL + pid * N + cols, dw, mask=mask)


class RMSNormFunction(torch.autograd.Function):
    """y = x · rsqrt(mean(x²) + eps) · weight over the last dim; saves x, weight and rstd."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).contiguous()
        m, n = x2.shape
        if n > MAX_DIM or weight.shape != (n,):
            raise LmforgeError(
                f"rms_norm got x {tuple(shape)} and weight {tuple(weight.shape)}: it needs a "
                f"weight of x's last dim, at most {MAX_DIM} (one row is one block)"
            )
        block = triton.next_power_of_2(n)
        y = torch.empty_like(x2)
        rstd = torch.empty(m, device=x.device, dtype=torch.float32)
        weight = weight.contiguous()
        if m:
            _forward[(m,)](x2, weight, y, rstd, n, eps, BLOCK_N=block, num_warps=_num_warps(block))
        ctx.save_for_backward(x2, weight, rstd)
        return y.view(shape)

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x2, weight, rstd = ctx.saved_tensors
        m, n = x2.shape
        if m == 0:
            return torch.zeros_like(dy), torch.zeros_like(weight), None
        block = triton.next_power_of_2(n)
        if INTERPRETED or x2.device.type != "cuda":
            programs = min(m, 4)
        else:
            programs = min(m, 4 * torch.cuda.get_device_properties(x2.device).multi_processor_count)
        rows_per_program = triton.cdiv(m, programs)
        programs = triton.cdiv(m, rows_per_program)
        dy2 = dy.reshape(m, n).contiguous()
        dx = torch.empty_like(x2)
        partial = torch.empty(programs, n, device=x2.device, dtype=torch.float32)
        _backward[(programs,)](
            dy2, x2, weight, rstd, dx, partial, m, n, rows_per_program,
            BLOCK_N=block, num_warps=_num_warps(block),
        )  # fmt: skip
        return dx.view(dy.shape), partial.sum(0).to(weight.dtype), None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """RMSNorm of x over its last dim with gain `weight` (lmforge.model.layers.RMSNorm)."""
    return RMSNormFunction.apply(x, weight, eps)
