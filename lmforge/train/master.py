"""fp32 master weights for a compute copy of the model in another dtype or on another device.

With `train.precision.cast_module` the forward runs a half-precision copy of the model (Megatron's
Float16Module); with `train.optimizer.offload` the optimizer and its state live on the CPU
while the copy trains on the GPU. Either way the optimizer steps the fp32 master `Transformer`,
which is also what checkpoints save: gradients flow copy → master before the step and weights
master → copy after it.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


class ComputeCopy:
    def __init__(self, master: nn.Module, device: torch.device, dtype: torch.dtype) -> None:
        self.module = copy.deepcopy(master).to(device=device, dtype=dtype)
        self._pairs = list(zip(master.parameters(), self.module.parameters(), strict=True))

    @torch.no_grad()
    def grads_to_master(self) -> None:
        for master, compute in self._pairs:
            if compute.grad is None:
                master.grad = None
                continue
            master.grad = compute.grad.to(master.device, master.dtype)
            compute.grad = None

    @torch.no_grad()
    def weights_to_compute(self) -> None:
        for master, compute in self._pairs:
            compute.copy_(master, non_blocking=True)


def needs_copy(master: nn.Module, device: torch.device, dtype: torch.dtype) -> bool:
    p = next(master.parameters())
    return p.device != device or p.dtype != dtype
