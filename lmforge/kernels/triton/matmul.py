"""Tiled matmul in Triton with autotuned block sizes, forward and backward.

Reference: `torch.matmul(a, b)` for a (..., K) and b (K, N) (a linear layer's x @ Wᵀ is
`matmul(x, w.t())`). Each program computes one (BLOCK_M, BLOCK_N) tile of the output, walking
K in BLOCK_K steps with an fp32 accumulator; programs are ordered in groups of GROUP_M row
tiles so that neighbours share their A rows and B columns in L2 (the grouped ordering of
Triton's matmul tutorial). Strides are arguments, so the backward's transposed operands
(dA = dC Bᵀ, dB = Aᵀ dC) are read in place, never copied. fp32 runs IEEE fp32 dots unless
torch allows tf32 (`torch.backends.cuda.matmul.allow_tf32`), as torch.matmul does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lmforge.errors import LmforgeError
from lmforge.kernels.triton import configs, interpreting

INTERPRETED = interpreting()  # as triton.jit built this module's kernels (fixed at import)

_GPU = [
    triton.Config(
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_warps=w, num_stages=s
    )
    for bm, bn, bk, w, s in (
        (128, 256, 64, 8, 3),
        (256, 128, 64, 8, 3),
        (128, 128, 64, 4, 4),
        (128, 128, 32, 4, 4),
        (64, 128, 64, 4, 4),
        (128, 64, 32, 4, 4),
        (64, 64, 32, 4, 5),
    )
]
# one config, blocks small enough that tiny test shapes span several tiles in every dim
_INTERPRETER_CONFIGS = [
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2}, num_warps=1)
]


@triton.autotune(configs=configs(_GPU, _INTERPRETER_CONFIGS), key=["M", "N", "K", "PRECISION"])
@triton.jit
def _matmul(A, B, C, M, N, K, sam, sak, sbk, sbn, scm, scn, PRECISION: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
            GROUP_M: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_m = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_m
    pid_n = (pid % per_group) // group_m
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = A + offs_m[:, None] * sam + offs_k[None, :] * sak
    b_ptrs = B + offs_k[:, None] * sbk + offs_n[None, :] * sbn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * sak
        b_ptrs += BLOCK_K * sbk
    c_ptrs = C + offs_m[:, None] * scm + offs_n[None, :] * scn
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (M, K) @ b (K, N) for any strides, into a new contiguous (M, N) in a's dtype."""
    (m, k), n = a.shape, b.shape[1]
    c = torch.empty(m, n, device=a.device, dtype=a.dtype)
    if m == 0 or n == 0:
        return c
    if k == 0:
        return c.zero_()
    allow_tf32 = a.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
    precision = "tf32" if allow_tf32 or a.dtype != torch.float32 else "ieee"

    def grid(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    _matmul[grid](
        a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        c.stride(0), c.stride(1), PRECISION=precision,
    )  # fmt: skip
    return c


class MatmulFunction(torch.autograd.Function):
    """a (..., K) @ b (K, N); saves a and b."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a2 = a.reshape(-1, a.shape[-1])
        ctx.save_for_backward(a2, b)
        ctx.a_shape = a.shape
        return _mm(a2, b).view(*a.shape[:-1], b.shape[1])

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        a2, b = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])
        da = _mm(g, b.t()).view(ctx.a_shape) if ctx.needs_input_grad[0] else None
        db = _mm(a2.t(), g) if ctx.needs_input_grad[1] else None
        return da, db


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`torch.matmul(a, b)` for a (..., K) and b (K, N) of one float dtype and device."""
    if a.dim() < 1 or b.dim() != 2 or a.shape[-1] != b.shape[0]:
        raise LmforgeError(
            f"matmul needs a (..., K) and b (K, N), got {tuple(a.shape)} and {tuple(b.shape)}: "
            "for a linear layer pass (x, weight.t())"
        )
    if a.dtype != b.dtype or a.device != b.device or not a.is_floating_point():
        raise LmforgeError(
            f"matmul needs a and b of one float dtype and device, got {a.dtype} on {a.device} "
            f"and {b.dtype} on {b.device}: convert one of them"
        )
    if a.dim() == 1:
        return MatmulFunction.apply(a[None], b)[0]
    return MatmulFunction.apply(a, b)
