"""From a plain fp32 Transformer to the module that trains, composed in a fixed order.

Like torchtitan's `parallelize(model)`, everything a run changes about how the model computes
is applied here from outside, never inside model/: first the compute copy (half precision for
`cast_module`, the GPU copy when the optimizer is offloaded), then the kernels
(`train.compute.kernels`, lmforge.train.kernel_choice), then the precision's layers (fp8), then
activation checkpointing per block, then `torch.compile` per block. A run on many processes swaps
in the kernels first (not
under tensor parallelism, whose shards they cannot take), then hands the model to
lmforge.parallel.parallelize, which applies tensor parallelism, checkpointing, compile and data
parallelism in the same order.

Training on a CPU also sets how the process's C allocator keeps freed memory (`keep_freed_memory`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.device.capability import cpu_capability, use_compile
from lmforge.errors import LmforgeError
from lmforge.model import Transformer
from lmforge.parallel.world import World
from lmforge.train.kernel_choice import apply_kernels
from lmforge.train.master import ComputeCopy, needs_copy
from lmforge.train.memory import apply_activation_checkpointing
from lmforge.train.precision import Precision

if TYPE_CHECKING:
    from lmforge.parallel.layout import ParallelOptions


@dataclass(frozen=True)
class Objective:
    """How the loss is computed: with the head fused into the cross-entropy (no full logits)
    or from the logits."""

    fused_loss: bool = False


@dataclass
class Composed:
    master: Transformer  # fp32 weights: what the optimizer steps and checkpoints save
    compute: nn.Module  # what the forward runs: the master itself unless a copy is needed
    precision: Precision
    world: World
    copy: ComputeCopy | None = None
    evaluator: nn.Module | None = None  # what evaluation runs, if not `compute`
    objective: Objective = field(default_factory=Objective)
    kernels: list[str] = field(default_factory=list)  # the Triton kernels swapped in

    def loss(
        self, x: torch.Tensor, y: torch.Tensor, segments: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Mean cross-entropy over the targets that are not -100, computed in fp32 whatever
        the forward's precision. `segments` (B, T) keeps attention inside each packed document.

        Under tensor parallelism the logits are vocabulary shards and this runs inside
        `micro_step`, which computes the loss on the shards; the result is a plain tensor.
        """
        kwargs = {} if segments is None else {"segments": segments}
        with self.precision.autocast():
            if self.objective.fused_loss:
                return self.compute(x, targets=y, **kwargs)
            logits = self.compute(x, **kwargs)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-100)
        return loss.full_tensor() if hasattr(loss, "full_tensor") else loss

    def micro_step(self, last: bool) -> contextlib.AbstractContextManager:
        """Context for one micro-batch's forward and backward (gradient sync on the last)."""
        if not self.world.is_distributed:
            return contextlib.nullcontext()
        from lmforge.parallel.parallelize import micro_step

        return micro_step(self.compute, self.world, last)

    def grads_to_master(self) -> None:
        if self.copy is not None:
            self.copy.grads_to_master()

    def weights_to_compute(self) -> None:
        if self.copy is not None:
            self.copy.weights_to_compute()


def compose(
    model: Transformer,
    precision: Precision,
    device: torch.device,
    activation_checkpointing: str = "none",
    compile: bool = False,
    world: World | None = None,
    parallel: ParallelOptions | None = None,
    objective: Objective | None = None,
    kernels: str = "torch",
) -> Composed:
    """Wrap `model` (fp32, on its master device) for training on `device` (or on `world`, by
    default this process alone), computing with `kernels` (train.compute.kernels: torch or
    triton)."""
    objective = objective or Objective()
    world = world or World.single(device)
    if objective.fused_loss and world.layout.tp > 1:
        raise LmforgeError(
            "train.compute.fused_loss needs the whole vocabulary on each rank: "
            "turn it off under tensor parallelism (tp > 1)"
        )
    if kernels != "torch" and world.layout.tp > 1:
        raise LmforgeError(
            f"train.compute.kernels={kernels} takes whole tensors, not tensor-parallel shards: "
            "use train.compute.kernels=torch under tensor parallelism (tp > 1)"
        )
    compile = use_compile(compile, device)
    if device.type == "cpu":
        keep_freed_memory()
    if world.is_distributed:
        from lmforge.parallel.parallelize import FullLogits, parallelize

        swapped = apply_kernels(model, kernels, device, precision.dtype)
        param_dtype = precision.dtype if precision.name == "bf16" else None
        compute = parallelize(
            model,
            world,
            parallel,
            param_dtype,
            lambda blocks: _prepare_blocks(blocks, activation_checkpointing, compile),
        )
        evaluator = FullLogits(compute) if world.layout.tp > 1 else None
        return Composed(model, compute, precision, world, None, evaluator, objective, swapped)
    copy = None
    inner: nn.Module = model
    if needs_copy(model, device, precision.module_dtype):
        copy = ComputeCopy(model, device, precision.module_dtype)
        inner = copy.module
    swapped = apply_kernels(inner, kernels, device, precision.dtype)
    compute = precision.wrap(inner)
    _prepare_blocks(inner, activation_checkpointing, compile)
    return Composed(model, compute, precision, world, copy, objective=objective, kernels=swapped)


def _prepare_blocks(model: nn.Module, activation_checkpointing: str, compile: bool) -> None:
    """Activation checkpointing, then compile, per transformer block."""
    apply_activation_checkpointing(model, activation_checkpointing)
    if compile:
        for block in model.layers:
            block.compile()


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD = 32 * 2**20  # the most glibc's own adaptive threshold ever reaches
_TRIM_THRESHOLD = 2**31 - 1


@functools.cache
def keep_freed_memory() -> bool:
    """Have glibc keep freed heap memory in the process instead of handing it back to the OS.

    A CPU training step frees and reallocates the same activation-sized buffers every step.
    With its adaptive thresholds glibc returns the top of its heap to the OS whenever enough of
    it falls free, and the next step faults those pages back in, zeroed, one at a time (about
    11,000 page faults and 3% of the step on benchmarks/bench_train.py's model). Fixed
    thresholds stop that: buffers under 32 MiB come from a heap that is never trimmed, so the
    process keeps its peak memory. PyTorch's CPU tuning guide gets the same from jemalloc or
    tcmalloc. Returns whether the allocator took the settings (False off glibc: nothing changes).
    """
    if not cpu_capability().glibc:  # musl, macOS and Windows have no such knobs
        return False
    try:
        mallopt = getattr(ctypes.CDLL(None), "mallopt", None)  # the C library already loaded
    except (OSError, TypeError):  # no such handle on Windows
        return False
    if mallopt is None:
        return False
    return bool(
        mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    )
