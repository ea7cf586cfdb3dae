"""Apply a run's parallel layout to a plain Transformer, in torchtitan's fixed order.

Tensor parallel first (it changes the parameters into DTensor shards), or expert parallel
(the experts become DTensor shards over the ep ranks), then what the caller does to the blocks
(training: activation checkpointing and compile), then data parallelism last, wrapping what the
others made: FSDP2 when parameters are sharded (fsdp > 1) or mixed with tensor parallel, DDP
otherwise; either leaves the experts to expert parallelism's own gradient sync. It takes its
own `ParallelOptions`, never the trainer's config.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.model.transformer import Transformer
from lmforge.parallel.data_parallel import apply_ddp, apply_fsdp, gradient_sync
from lmforge.parallel.expert_parallel import (
    apply_expert_parallel,
    expert_parameters,
    sync_expert_gradients,
)
from lmforge.parallel.layout import ParallelOptions
from lmforge.parallel.tensor_parallel import apply_tensor_parallel
from lmforge.parallel.world import World


def parallelize(
    model: Transformer,
    world: World,
    options: ParallelOptions,
    param_dtype: torch.dtype | None,
    prepare_blocks: Callable[[Transformer], None] | None = None,
) -> nn.Module:
    """Shard and wrap `model` in place; return the module the forward runs.

    `prepare_blocks(model)` runs after tensor parallel and before data parallel wraps it."""
    layout, mesh = world.layout, world.mesh
    if options.zero1 and (layout.fsdp > 1 or layout.tp > 1 or layout.ep > 1):
        raise LmforgeError(
            "train.parallel.zero1 shards the optimizer of plain data parallelism (dp) only; fsdp "
            "already shards optimizer state (and ep the experts'): drop train.parallel.zero1 or "
            "use --parallel dp=N"
        )
    if layout.tp > 1:
        if model.config.tie_embeddings:
            raise LmforgeError(
                "tensor parallelism shards the output head but not the embedding, so "
                "model.tie_embeddings must be false with tp > 1"
            )
        apply_tensor_parallel(model, mesh["tp"], options.sequence_parallel)
    experts = apply_expert_parallel(model, world.expert_mesh["ep"]) if layout.ep > 1 else []
    if prepare_blocks is not None:
        prepare_blocks(model)
    if layout.fsdp > 1 or (layout.dp > 1 and layout.tp > 1):
        return apply_fsdp(
            model,
            world.data_mesh,
            units=model.layers,
            param_dtype=param_dtype,
            reshard_after_forward=options.reshard_after_forward,
            ignored=experts,
        )
    if layout.dp > 1:
        return apply_ddp(model, mesh["dp"], options.bucket_mb, ignored=experts)
    return model


@contextlib.contextmanager
def micro_step(compute: nn.Module, world: World, last: bool) -> Iterator[None]:
    """Forward and backward of one micro-batch: gradients sync on the last one only, and under
    tensor parallelism the loss is computed on the vocabulary shards of the logits."""
    with gradient_sync(compute, last), _loss_parallel(world.layout.tp > 1):
        yield
    if last and world.layout.ep > 1:
        replicas = world.expert_mesh["edp"].get_group()
        sync_expert_gradients(expert_parameters(compute), replicas, world.layout.data_parallel)


def _loss_parallel(enabled: bool) -> contextlib.AbstractContextManager:
    if not enabled:
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


class FullLogits(nn.Module):
    """Gathers vocabulary-sharded logits, for code that reads whole logits (evaluation)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor, **kwargs: torch.Tensor) -> torch.Tensor:
        logits = self.module(x, **kwargs)
        return logits.full_tensor() if hasattr(logits, "full_tensor") else logits
