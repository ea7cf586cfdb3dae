"""From a plain fp32 Transformer to the module that trains, composed in a fixed order.

Like torchtitan's `parallelize(model)`, everything a run changes about how the model computes
is applied here from outside, never inside model/: first the compute copy (half precision for
`cast_module`, the GPU copy when the optimizer is offloaded), then the precision's layers
(fp8), then activation checkpointing per block, then `torch.compile` per block.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.model import Transformer
from lmforge.train.master import ComputeCopy, needs_copy
from lmforge.train.memory import apply_activation_checkpointing
from lmforge.train.precision import Precision


@dataclass
class Composed:
    master: Transformer  # fp32 weights: what the optimizer steps and checkpoints save
    compute: nn.Module  # what the forward runs: the master itself unless a copy is needed
    precision: Precision
    copy: ComputeCopy | None = None

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy, computed in fp32 whatever the forward's precision."""
        with self.precision.autocast():
            logits = self.compute(x)
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

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
) -> Composed:
    """Wrap `model` (fp32, on its master device) for training on `device`."""
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
