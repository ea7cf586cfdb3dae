"""Fused linear + cross-entropy in plain PyTorch: the loss of `x @ weight.T` against targets
without ever holding the whole (tokens × vocab) logits.

Reference: `F.cross_entropy((x @ weight.T).float(), targets, ignore_index=ignore_index)`. The
forward walks the tokens in chunks; for each it computes the chunk's logits, their
log-softmax in fp32, the rows' losses and at once the logit gradient (softmax − one-hot, over
the count of kept targets), and multiplies that gradient into dx (this chunk's rows) and dW
(accumulated in fp32), as Liger-Kernel does. Only dx and dW are saved; the backward scales
them by the incoming gradient. So memory is two chunk-sized buffers plus dx and dW, and the
three matmuls are the plain path's three.

Behaviour that differs from a plain autograd graph, on purpose:
- no double backward (the saved gradients are constants to autograd);
- every target ignored: as torch, the mean is nan (0/0) and the sum 0, and the gradients 0;
- under autocast the matmuls run in the autocast dtype, as F.linear would, but dW is
  accumulated in fp32 and returned in weight's dtype, so fp32 master weights get an fp32
  gradient (the plain path rounds it through bf16);
- targets outside 0..vocab-1 (and not ignored) raise LmforgeError on CPU; on other devices the
  check would make the host wait, so there the gather's own device assert reports it.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from lmforge.errors import LmforgeError

CHUNK_BYTES = 32 << 20  # fp32 logits per chunk; see default_chunk_size
MIN_CHUNK, MAX_CHUNK = 128, 4096
REDUCTIONS = ("mean", "sum")


def default_chunk_size(vocab: int) -> int:
    """Tokens per chunk: a chunk's fp32 logits take about CHUNK_BYTES (32 MiB: 256 tokens at
    vocab 32,768), within MIN_CHUNK..MAX_CHUNK tokens. Measured on CPU (bench_fused_loss.py,
    vocab 32,768, d 512): the logits matmul with 64 rows runs at 2/3 the speed it reaches from
    256 rows on (the weight is re-packed for every chunk), and 256-1024 rows run alike; so
    chunks stay large enough to feed the matmul and small next to the (tokens × vocab) whole.
    """
    return max(MIN_CHUNK, min(MAX_CHUNK, CHUNK_BYTES // (4 * vocab)))


def _chunk_grads(
    logits: torch.Tensor,
    probs: torch.Tensor,
    targets: torch.Tensor,
    softcap: float | None,
) -> torch.Tensor:
    """Per-row losses of `logits` (c, V); leaves d(row loss)/d(logits) in `probs` (c, V, fp32
    or fp64)."""
    tanh = None
    if softcap is not None:
        tanh = torch.tanh(logits.to(probs.dtype) / softcap)
        logits = tanh * softcap
    torch.log_softmax(logits, 1, dtype=probs.dtype, out=probs)
    row_loss = -probs.gather(1, targets[:, None]).squeeze(1)
    probs.exp_()
    probs.scatter_add_(1, targets[:, None], probs.new_full((len(targets), 1), -1.0))
    if tanh is not None:  # d(cap · tanh(z / cap)) / dz = 1 - tanh²
        probs.mul_(tanh.square_().neg_().add_(1.0))
    return row_loss


class LinearCrossEntropyFunction(torch.autograd.Function):
    """Cross-entropy of x2d @ weightᵀ (x2d: (n, d)); saves only dx and dW, never the logits."""

    @staticmethod
    def forward(
        ctx,
        x: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        ignore_index: int,
        chunk_size: int,
        reduction: str,
        softcap: float | None,
        compute_dtype: torch.dtype,
        need_dx: bool,
        need_dw: bool,
    ) -> torch.Tensor:
        n, d = x.shape
        vocab = weight.shape[0]
        keep = targets != ignore_index
        safe = targets.masked_fill(~keep, 0)
        kept = keep.sum()
        acc = torch.promote_types(compute_dtype, torch.float32)  # softmax and dW's sums
        # per-row weight of the loss: 1/kept (mean) or 1 (sum), 0 for an ignored row
        row_scale = keep.to(acc) / kept if reduction == "mean" else keep.to(acc)
        row_scale = row_scale.masked_fill_(~keep, 0.0)  # 0/0 when nothing is kept
        w = weight.to(compute_dtype)
        dx = torch.empty(n, d, dtype=x.dtype, device=x.device) if need_dx else None
        dw = torch.zeros(vocab, d, dtype=acc, device=x.device) if need_dw else None
        rows = min(chunk_size, n)
        logits_buf = torch.empty(rows, vocab, dtype=compute_dtype, device=x.device)
        probs_buf = torch.empty(rows, vocab, dtype=acc, device=x.device)
        losses = torch.empty(n, dtype=acc, device=x.device)
        for start in range(0, n, chunk_size):
            end = min(start + chunk_size, n)
            xc = x[start:end].to(compute_dtype)
            logits = torch.mm(xc, w.t(), out=logits_buf[: end - start])
            probs = probs_buf[: end - start]
            losses[start:end] = _chunk_grads(logits, probs, safe[start:end], softcap)
            if not (need_dx or need_dw):
                continue
            scale = row_scale[start:end, None]
            if acc != compute_dtype:  # low precision: scale in fp32, then round once
                grad = logits.copy_(probs.mul_(scale))  # into the logits' buffer, free again
                if need_dx:
                    dx[start:end] = torch.mm(grad, w)
                if need_dw:
                    dw += torch.mm(grad.t(), xc).to(acc)
                continue
            # fp32: scaling the rows of dx and of x scales the rows of grad, for less work
            if need_dx:
                dx[start:end] = torch.mm(probs, w).mul_(scale)
            if need_dw:
                dw.addmm_(probs.t(), xc * scale)
        loss = losses.masked_fill_(~keep, 0.0).sum()
        if reduction == "mean":
            loss = loss / kept
        ctx.save_for_backward(dx, dw.to(weight.dtype) if need_dw else None)
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        dx, dw = ctx.saved_tensors
        if grad.device.type == "cpu" and bool(grad == 1):  # elsewhere the test waits: skip it
            # autograd takes these as the gradients without a copy once it drops the saved
            # ones (and copies them when the graph is retained): no second dx and dW in memory
            return dx, dw, *([None] * 8)
        dx = dx * grad.to(dx.dtype) if dx is not None else None
        dw = dw * grad.to(dw.dtype) if dw is not None else None
        return dx, dw, *([None] * 8)


def _check(
    x: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int,
    chunk_size: int | None,
    reduction: str,
    softcap: float | None,
) -> None:
    if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise LmforgeError(
            f"linear_cross_entropy got x {tuple(x.shape)} and weight {tuple(weight.shape)}: "
            "it needs x (..., d) and weight (vocab, d)"
        )
    if targets.shape != x.shape[:-1]:
        raise LmforgeError(
            f"linear_cross_entropy got x {tuple(x.shape)} and targets {tuple(targets.shape)}: "
            "pass one target per row of x, targets shaped x.shape[:-1]"
        )
    if targets.dtype.is_floating_point or targets.dtype == torch.bool:
        raise LmforgeError(
            f"linear_cross_entropy got targets of dtype {targets.dtype}: pass token ids as int64"
        )
    if x.device != weight.device or x.device != targets.device:
        raise LmforgeError(
            f"linear_cross_entropy got x on {x.device}, weight on {weight.device}, targets on "
            f"{targets.device}: move them to one device"
        )
    if not x.dtype.is_floating_point or not weight.dtype.is_floating_point:
        raise LmforgeError(
            f"linear_cross_entropy got x {x.dtype} and weight {weight.dtype}: pass float tensors"
        )
    if x.dtype != weight.dtype and not torch.is_autocast_enabled(x.device.type):
        raise LmforgeError(
            f"linear_cross_entropy got x {x.dtype} and weight {weight.dtype}: cast them to one "
            "dtype, or run under torch.autocast"
        )
    if reduction not in REDUCTIONS:
        raise LmforgeError(
            f"linear_cross_entropy got reduction={reduction!r}: use one of {REDUCTIONS}"
        )
    if chunk_size is not None and (isinstance(chunk_size, bool) or chunk_size < 1):
        raise LmforgeError(
            f"linear_cross_entropy got chunk_size={chunk_size!r}: pass a positive token count, "
            "or None for the default"
        )
    if softcap is not None and not softcap > 0:
        raise LmforgeError(f"linear_cross_entropy got softcap={softcap!r}: pass None or > 0")
    if x.device.type == "cpu":
        vocab = weight.shape[0]
        bad = (targets != ignore_index) & ((targets < 0) | (targets >= vocab))
        if bool(bad.any()):
            raise LmforgeError(
                f"linear_cross_entropy: target {int(targets[bad][0])} is outside the vocabulary "
                f"0..{vocab - 1}: check the tokenizer's vocab size or use "
                f"ignore_index={ignore_index}"
            )


def linear_cross_entropy(
    x: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int = -100,
    chunk_size: int | None = None,
    reduction: str = "mean",
    softcap: float | None = None,
) -> torch.Tensor:
    """`F.cross_entropy((x @ weight.T).float(), targets, ignore_index=ignore_index,
    reduction=reduction)` in value and gradients (x and weight), without the whole logits.

    x (..., d), weight (vocab, d), targets x.shape[:-1]. chunk_size tokens per chunk (None:
    default_chunk_size, ~32 MiB of fp32 logits). softcap: logits become
    softcap · tanh(logits / softcap) before the softmax, as Gemma 2's head does. The loss is
    fp32 whatever x's dtype (fp64 for fp64). Not twice differentiable.
    """
    _check(x, weight, targets, ignore_index, chunk_size, reduction, softcap)
    device = x.device.type
    if torch.is_autocast_enabled(device):
        compute_dtype = torch.get_autocast_dtype(device)
    else:
        compute_dtype = x.dtype
    grad_on = torch.is_grad_enabled()
    need_dx = grad_on and x.requires_grad
    need_dw = grad_on and weight.requires_grad
    chunk = chunk_size or default_chunk_size(weight.shape[0])
    x2d = x.reshape(-1, x.shape[-1])
    with torch.autocast(device, enabled=False):
        return LinearCrossEntropyFunction.apply(
            x2d, weight, targets.reshape(-1), ignore_index, chunk, reduction, softcap,
            compute_dtype, need_dx, need_dw,
        )  # fmt: skip
