"""From a plain fp32 Transformer to the module that trains, composed in a fixed order.

Like torchtitan's `parallelize(model)`, everything a run changes about how the model computes
is applied here from outside, never inside model/: first the compute copy (half precision for
`cast_module`, the GPU copy when the optimizer is offloaded), then the precision's layers
(fp8), then activation checkpointing per block, then `torch.compile` per block. A run on many
processes instead hands the model to lmforge.parallel.parallelize, which applies tensor
parallelism, checkpointing, compile and data parallelism in the same order.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.model import Transformer
from lmforge.train.master import ComputeCopy, needs_copy
from lmforge.train.memory import apply_activation_checkpointing
from lmforge.train.precision import Precision

if TYPE_CHECKING:
    from lmforge.parallel.layout import ParallelOptions
    from lmforge.parallel.world import World


@dataclass
class Composed:
    master: Transformer  # fp32 weights: what the optimizer steps and checkpoints save
    compute: nn.Module  # what the forward runs: the master itself unless a copy is needed
    precision: Precision
    copy: ComputeCopy | None = None
    world: World | None = None  # set when training on many processes
    evaluator: nn.Module | None = None  # what evaluation runs, if not `compute`

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy, computed in fp32 whatever the forward's precision.

        Under tensor parallelism the logits are vocabulary shards and this runs inside
        `micro_step`, which computes the loss on the shards; the result is a plain tensor.
        """
        with self.precision.autocast():
            logits = self.compute(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        return loss.full_tensor() if hasattr(loss, "full_tensor") else loss

    def micro_step(self, last: bool) -> contextlib.AbstractContextManager:
        """Context for one micro-batch's forward and backward (gradient sync on the last)."""
        if self.world is None:
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
) -> Composed:
    """Wrap `model` (fp32, on its master device) for training on `device` (or on `world`)."""
    if world is not None:
        from lmforge.parallel.parallelize import FullLogits, parallelize

        param_dtype = precision.dtype if precision.name == "bf16" else None
        compute = parallelize(
            model, world, parallel, activation_checkpointing, compile, param_dtype
        )
        evaluator = FullLogits(compute) if world.layout.tp > 1 else None
        return Composed(model, compute, precision, world=world, evaluator=evaluator)
    copy = None
    inner: nn.Module = model
    if needs_copy(model, device, precision.module_dtype):
        copy = ComputeCopy(model, device, precision.module_dtype)
        inner = copy.module
    compute = precision.wrap(inner)
    apply_activation_checkpointing(inner, activation_checkpointing)
    if compile:
        for block in inner.layers:
            block.compile()
    return Composed(model, compute, precision, copy)
