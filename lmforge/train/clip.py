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
    norm = _total_norm(grads)
    if max_norm > 0:
        scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        torch._foreach_mul_([_local(g) for g in grads], scale)
    return norm


def _total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of all gradients, sharded (DTensor) ones reduced over their mesh: one
    collective per distinct sharding, none for plain tensors."""
    groups: dict[object, list[torch.Tensor]] = {}
    for g in grads:
        spec = (id(g.device_mesh), g.placements) if hasattr(g, "device_mesh") else None
        groups.setdefault(spec, []).append(g)
    norms = []
    for spec, group in groups.items():
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(group)))
        norms.append(norm.full_tensor() if spec is not None else norm)
    return torch.linalg.vector_norm(torch.stack(norms))


def _local(grad: torch.Tensor) -> torch.Tensor:
    return grad.to_local() if hasattr(grad, "to_local") else grad
