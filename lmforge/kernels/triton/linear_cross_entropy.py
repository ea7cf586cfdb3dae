"""Fused linear + cross-entropy with a Triton softmax: the (tokens × vocab) logits never
exist whole.

Reference: `F.cross_entropy(hidden @ weight.T, targets, ignore_index=-100)` (mean over the
targets not ignored; all ignored gives nan with zero gradients, as torch), which the PyTorch
chunked path lmforge.kernels.linear_cross_entropy also equals. The forward walks the tokens in
chunks: torch computes a chunk's logits, one Triton program per row turns them in place into
the row's loss and its logit gradient (softmax − one-hot, over the count of targets kept), and
torch multiplies that gradient into the hidden and weight gradients at once, as Liger-Kernel
does. The backward only scales the stored gradients by the incoming one.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lmforge.errors import LmforgeError
from lmforge.kernels.triton import interpreting

INTERPRETED = interpreting()  # as triton.jit built this module's kernels (fixed at import)

MAX_BLOCK = 64 if INTERPRETED else 8192


@triton.jit
def _loss_and_grad(LOGITS, TARGETS, LOSS, V, ignore_index, scale, BLOCK: tl.constexpr):
    """Row r of LOGITS (r, V) becomes its gradient; LOSS[r] its loss (0 when ignored)."""
    row = tl.program_id(0).to(tl.int64)
    logits = LOGITS + row * V
    target = tl.load(TARGETS + row)
    keep = target != ignore_index
    m = float("-inf")
    total = 0.0
    for start in range(0, V, BLOCK):  # online log-sum-exp over the row, one block at a time
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(logits + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        total = total * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    lse = m + tl.log(total)
    x_target = tl.load(logits + target, mask=keep, other=0.0).to(tl.float32)
    tl.store(LOSS + row, tl.where(keep, lse - x_target, 0.0))
    row_scale = tl.where(keep, scale, 0.0)
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(logits + cols, mask=cols < V, other=0.0).to(tl.float32)
        grad = tl.exp(x - lse) - tl.where(cols == target, 1.0, 0.0)
        tl.store(logits + cols, (grad * row_scale).to(LOGITS.dtype.element_ty), mask=cols < V)


def default_chunk_size(tokens: int, vocab: int, dim: int) -> int:
    """Liger's choice: chunks whose logits are about as large as the hidden states."""
    return triton.next_power_of_2(triton.cdiv(tokens, triton.cdiv(vocab, dim)))


class LinearCrossEntropyFunction(torch.autograd.Function):
    """Mean cross-entropy of hidden @ weightᵀ against targets; saves the two input gradients."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, ignore_index, chunk_size, compute_dtype):
        h = hidden.reshape(-1, hidden.shape[-1])
        t = targets.reshape(-1).contiguous()
        (n, d), vocab = h.shape, weight.shape[0]
        keep = t != ignore_index
        if bool((keep & ((t < 0) | (t >= vocab))).any()):  # the kernel would read past the row
            raise LmforgeError(
                f"linear_cross_entropy: a target is outside the vocabulary 0..{vocab - 1}: "
                f"check the tokenizer's vocab size or use ignore_index={ignore_index}"
            )
        kept = int(keep.sum())
        scale = 1.0 / kept if kept else float("nan")  # as torch: no kept target, loss nan, grads 0
        chunk = chunk_size or default_chunk_size(n, vocab, d)
        block = min(MAX_BLOCK, triton.next_power_of_2(vocab))
        warps = 4 if block < 2048 else 8 if block < 8192 else 16
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        w = weight.to(compute_dtype)
        grad_h = torch.empty_like(h) if need_h else None
        grad_w = torch.zeros(vocab, d, device=h.device, dtype=torch.float32) if need_w else None
        losses = torch.empty(n, device=h.device, dtype=torch.float32)
        for start in range(0, n, chunk):
            end = min(start + chunk, n)
            h_chunk = h[start:end].to(compute_dtype)
            logits = (h_chunk @ w.t()).contiguous()
            _loss_and_grad[(end - start,)](
                logits, t[start:end], losses[start:end], vocab, ignore_index, scale,
                BLOCK=block, num_warps=warps,
            )  # fmt: skip
            if need_h:
                grad_h[start:end] = logits @ w
            if need_w and logits.dtype == torch.float32:
                grad_w.addmm_(logits.t(), h_chunk)
            elif need_w:
                grad_w += (logits.t() @ h_chunk).float()
        ctx.save_for_backward(
            grad_h.view(hidden.shape) if need_h else None,
            grad_w.to(weight.dtype) if need_w else None,
        )
        return losses.sum() * scale

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_h, grad_w = ctx.saved_tensors
        grad_h = grad_h * grad.to(grad_h.dtype) if grad_h is not None else None
        grad_w = grad_w * grad.to(grad_w.dtype) if grad_w is not None else None
        return grad_h, grad_w, None, None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int = -100,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """`F.cross_entropy((hidden @ weight.T).float(), targets, ignore_index=ignore_index)`
    without the whole logits matrix: hidden (..., d), weight (vocab, d), targets
    hidden.shape[:-1]; chunk_size tokens per chunk (None: Liger's choice). The loss is fp32.
    Under autocast the matmuls run in its dtype, as F.linear's would, and the weight gradient
    is summed in fp32 and returned in the weight's dtype."""
    if (
        targets.shape != hidden.shape[:-1]
        or weight.dim() != 2
        or weight.shape[1] != hidden.shape[-1]
    ):
        raise LmforgeError(
            f"linear_cross_entropy got hidden {tuple(hidden.shape)}, weight "
            f"{tuple(weight.shape)}, targets {tuple(targets.shape)}: it needs hidden "
            "(..., d), weight (vocab, d) and one target per hidden row"
        )
    device = hidden.device.type
    autocast = torch.is_autocast_enabled(device)
    if hidden.device != weight.device or (hidden.dtype != weight.dtype and not autocast):
        raise LmforgeError(
            f"linear_cross_entropy got hidden {hidden.dtype} on {hidden.device} and weight "
            f"{weight.dtype} on {weight.device}: cast them to one dtype and device"
        )
    compute = torch.get_autocast_dtype(device) if autocast else hidden.dtype
    with torch.autocast(device, enabled=False):
        return LinearCrossEntropyFunction.apply(
            hidden, weight, targets, ignore_index, chunk_size, compute
        )
