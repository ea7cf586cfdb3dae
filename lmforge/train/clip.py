"""Global-norm gradient clipping."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def clip_grad_norm(params: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale all gradients so their joint L2 norm is at most `max_norm`; returns the norm before.

    The norm stays a tensor so the hot loop never waits for the device to read it.
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    if max_norm > 0:
        scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        torch._foreach_mul_(grads, scale)
    return norm
