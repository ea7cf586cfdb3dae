"""One optimizer step: forward and backward over the micro-batches, then unscale, clip, and
take or skip the update, all without the host waiting for the device (with lmforge's optimizers;
one that cannot skip on the device makes the host read the verdict, see `optim.step_unless`).

`optimizer_step` is the part after backward, shared by every trainer: pretraining and SFT
(`train_step`) and GRPO (posttrain/grpo.py) take their updates through it.

A mixture-of-experts model adds its balance losses (aux, z) to what backward sees, while the
reported loss stays the language-modelling loss, and nudges its balance biases after the step."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from lmforge.model.moe import moe_losses, update_biases
from lmforge.train.adamw import step_unless
from lmforge.train.batches import Batches
from lmforge.train.clip import clip_grad_norm
from lmforge.train.compose import Composed
from lmforge.train.guard import NonFiniteGuard
from lmforge.train.memory import count_saved_bytes


@dataclass
class StepResult:
    loss: torch.Tensor  # mean over the micro-batches, on the device
    grad_norm: torch.Tensor
    skipped: torch.Tensor  # bool: the update was not applied
    activation_bytes: int = 0  # saved for backward by the first micro-batch, when measured


def train_step(
    model: Composed,
    optimizer: torch.optim.Optimizer,
    guard: NonFiniteGuard,
    batches: Batches,
    step: int,
    lr: float,
    grad_accum_steps: int,
    grad_clip: float,
    device: torch.device,
    measure_memory: bool = False,
) -> StepResult:
    set_lr(optimizer, lr)
    precision = model.precision
    loss_sum = torch.zeros((), device=device)
    activation_bytes = 0
    for micro in range(grad_accum_steps):
        x, y, *segments = batches.next(step, micro, device)
        measuring = measure_memory and micro == 0
        params = list(model.compute.parameters()) if measuring else []
        with model.micro_step(last=micro == grad_accum_steps - 1):
            with count_saved_bytes(params) if measuring else contextlib.nullcontext() as counter:
                loss = model.loss(x, y, *segments)
            if measuring:
                activation_bytes = counter.bytes
            balance = moe_losses(model.compute)
            precision.scale_loss((loss + balance) / grad_accum_steps).backward()
        loss_sum += loss.detach()
    mean_loss = loss_sum / grad_accum_steps
    grad_norm, bad = optimizer_step(model, optimizer, guard, mean_loss, grad_clip)
    return StepResult(mean_loss, grad_norm, bad, activation_bytes)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The schedule's learning rate `lr` for every parameter group (times its `lr_scale`)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)  # Muon's matrices: muon_lr / lr


def optimizer_step(
    model: Composed,
    optimizer: torch.optim.Optimizer,
    guard: NonFiniteGuard,
    loss: torch.Tensor,
    grad_clip: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Everything after the micro-batches' backward: the gradients onto the fp32 master
    weights, unscaled (fp16) and clipped to `grad_clip`; the update taken, or skipped when
    `loss` or the gradient norm is not finite (`guard` counts it); the precision's end of step,
    MoE balance biases, and the weights back onto the compute copy. Returns (grad_norm, bad),
    0-d tensors on the device (the host does not wait for them)."""
    precision = model.precision
    model.grads_to_master()
    params = [p for p in model.master.parameters() if p.grad is not None]
    precision.unscale_([p.grad for p in params])
    grad_norm = clip_grad_norm(params, grad_clip)
    bad = guard.check(loss, grad_norm)
    step_unless(optimizer, bad)
    optimizer.zero_grad(set_to_none=True)
    precision.end_step(bad)
    # The biases move with the routing counts of every data rank, on the weights the forward
    # runs (and on the fp32 master behind a compute copy), skipped step or not.
    reduce = _sum_over_ranks if model.world.is_distributed else None
    update_biases(model.compute, reduce, model.master if model.copy is not None else None)
    model.weights_to_compute()
    return grad_norm, bad


def _sum_over_ranks(counts: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(counts)
    return counts
