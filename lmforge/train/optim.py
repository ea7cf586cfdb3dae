"""AdamW with decoupled weight decay (Loshchilov & Hutter), usable as any torch optimizer.

Also decides which parameters decay (matrices do; gains, biases and embeddings do not) and
builds the optimizer a run uses: PyTorch's fused AdamW kernel where the device has one, else
this one. Both follow PyTorch's protocol for skipping a step on the device: set
`optimizer.found_inf` to a one-element float tensor (1.0: skip) before `step()`, and the step
leaves parameters and state untouched when it is 1, without the host reading it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn


class AdamW(torch.optim.Optimizer):
    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
    ):
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"invalid AdamW settings lr={lr} betas={betas} eps={eps}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        found_inf = getattr(self, "found_inf", None)
        for group in self.param_groups:
            lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                # Every change is multiplied by `ok`, so ok = 0 (found_inf) leaves all as it was.
                if found_inf is None:
                    ok = torch.ones((), device=p.device)
                else:
                    ok = 1.0 - found_inf.to(p.device, torch.float32)
                grad = torch.where(ok > 0, p.grad, 0.0)
                state["step"] += ok
                t = state["step"].clamp(min=1.0)
                m.lerp_(grad, (1 - beta1) * ok)
                v.mul_(1 - (1 - beta2) * ok).add_(grad * grad * (1 - beta2))
                bias2 = torch.sqrt(1 - beta2**t)
                step_size = lr * bias2 / (1 - beta1**t) * ok
                p.mul_(1 - lr * group["weight_decay"] * ok)
                p.sub_(m / v.sqrt().add_(eps * bias2) * step_size)
        return loss


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on 2-D weights except embeddings; none on gains and embeddings."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        is_embedding = "embed" in name
        (decay if p.dim() >= 2 and not is_embedding else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(
    model: nn.Module,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
    fused: bool = True,
) -> torch.optim.Optimizer:
    """PyTorch's fused AdamW on devices that have the kernel (when `fused`), else lmforge's."""
    groups = param_groups(model, weight_decay)
    device = next(model.parameters()).device
    if fused and device.type in fused_devices():
        return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=True)
    return AdamW(groups, lr=lr, betas=betas)


def fused_devices() -> list[str]:
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    return _get_fused_kernels_supported_devices()
