"""AdamW with decoupled weight decay (Loshchilov & Hutter), usable as any torch optimizer.

Also decides which parameters decay (matrices do; gains, biases and embeddings do not) and
which AdamW a device gets: PyTorch's fused kernel where the device has one, else this one, in
one process and on every parallel layout alike (this one steps DTensor shards, so FSDP and
tensor parallelism use it too). `train/optimizers.py` builds a run's optimizer from these or
from Muon (`train/muon.py`).

Skipping a bad step follows PyTorch's protocol (torch.amp.GradScaler's): an optimizer whose
`_step_supports_amp_scaling` is true (this one, PyTorch's fused kernels, ZeRO-1 over either)
reads `optimizer.found_inf`, a one-element float tensor (1.0: skip), in `step()` and leaves
parameters and state untouched when it is 1, without the host reading it. `step_unless` takes
or skips a step on any optimizer: on the device where the optimizer can, else on the host.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn


class AdamW(torch.optim.Optimizer):
    _step_supports_amp_scaling = True  # honours found_inf and grad_scale, like fused kernels

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
        grad_scale = getattr(self, "grad_scale", None)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                # Elementwise math on this rank's shard: plain tensors whatever the placement.
                grad = _local(p.grad)
                if grad_scale is not None:
                    grad = grad / grad_scale.to(grad.device)
                # Every change is multiplied by `ok`, so ok = 0 (found_inf) leaves all as it was.
                if found_inf is None:
                    ok = torch.ones((), device=grad.device)
                else:
                    ok = 1.0 - found_inf.to(grad.device, torch.float32)
                self._update(p, torch.where(ok > 0, grad, 0.0), ok, group)
        return loss

    def _update(self, p: torch.Tensor, grad: torch.Tensor, ok: torch.Tensor, group: dict) -> None:
        """Step `p` by its (unscaled, finite, local) `grad`; `ok` (0-d, 0 or 1) multiplies
        every change."""
        lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
        state = self.state[p]
        if not state:  # like p: a DTensor for a sharded parameter (for DCP)
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        param, m, v = _local(p), _local(state["exp_avg"]), _local(state["exp_avg_sq"])
        state["step"] += ok
        t = state["step"].clamp(min=1.0)
        m.lerp_(grad, (1 - beta1) * ok)
        v.mul_(1 - (1 - beta2) * ok).add_(grad * grad * (1 - beta2))
        bias2 = torch.sqrt(1 - beta2**t)
        step_size = lr * bias2 / (1 - beta1**t) * ok
        param.mul_(1 - lr * group["weight_decay"] * ok)
        param.sub_(m / v.sqrt().add_(eps * bias2) * step_size)


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (a view: writing it writes the DTensor), else `t`."""
    return t.to_local() if hasattr(t, "to_local") else t


def param_groups(
    model: nn.Module, weight_decay: float, lr: float = 0.0, embed_lr: float = 0.0
) -> list[dict]:
    """Weight decay on 2-D weights except embeddings; none on gains and embeddings.

    A mixture of experts' stacked expert weights form a decayed group of their own, whatever
    the layout: expert parallelism makes them DTensor shards beside plain tensors (one fused
    step cannot take both), and checkpoints resume across layouts only with equal groups.
    With `embed_lr` (above 0 and not `lr`), the input embedding is a group of its own at that
    peak learning rate: its `lr_scale` (embed_lr / lr) keeps the ratio through the schedule.
    """
    own_embedding = embed_lr > 0 and embed_lr != lr
    decay, experts, embedding, no_decay = [], [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if ".experts." in name:
            experts.append(p)
        elif own_embedding and "tok_embeddings" in name:
            embedding.append(p)
        elif p.dim() >= 2 and "embed" not in name:
            decay.append(p)
        else:
            no_decay.append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if experts:
        groups.append({"params": experts, "weight_decay": weight_decay})
    if embedding:
        scale = embed_lr / lr
        groups.append({"params": embedding, "weight_decay": 0.0, "lr": embed_lr, "lr_scale": scale})
    return [*groups, {"params": no_decay, "weight_decay": 0.0}]


def adamw_choice(device: torch.device, fused: bool = True) -> tuple[type, dict]:
    """The AdamW class for `device` and its extra keyword arguments: PyTorch's fused kernel
    where the device has one (when `fused`), else lmforge's."""
    if fused and device.type in fused_devices():
        return torch.optim.AdamW, {"fused": True}
    return AdamW, {}


def skips_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Whether `optimizer.step()` honours `optimizer.found_inf` (PyTorch's amp protocol)."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


def step_unless(optimizer: torch.optim.Optimizer, bad: torch.Tensor) -> None:
    """Step, or leave parameters and optimizer state untouched when `bad` (0-d bool) is true.

    The same semantics for every optimizer: where it honours `found_inf` the device decides
    and the host never waits; otherwise the host reads `bad` and skips `step()` itself (every
    rank reads the same value: it comes from the synchronized gradients' norm).
    """
    if not skips_on_device(optimizer):
        if not bool(bad):
            optimizer.step()
        return
    optimizer.found_inf = bad.float()
    try:
        optimizer.step()
    finally:
        del optimizer.found_inf  # a later step() without a verdict is a plain step


def fused_devices() -> list[str]:
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    return _get_fused_kernels_supported_devices()
