"""Apply a run's parallel layout to a plain Transformer, in torchtitan's fixed order.

Tensor parallel first (it changes the parameters into DTensor shards), then activation
checkpointing and compile per block, then data parallelism last, wrapping what the others made:
FSDP2 when parameters are sharded (fsdp > 1) or mixed with tensor parallel, DDP otherwise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.model import ModelConfig, Transformer
from lmforge.parallel.comm_count import count_collectives
from lmforge.parallel.data_parallel import apply_ddp, apply_fsdp, build_zero1, gradient_sync
from lmforge.parallel.layout import ParallelOptions, check_batch, check_model
from lmforge.parallel.tensor_parallel import apply_tensor_parallel
from lmforge.parallel.world import World
from lmforge.train.memory import apply_activation_checkpointing
from lmforge.train.optim import adamw_choice, param_groups

if TYPE_CHECKING:
    from lmforge.train.loop import TrainConfig

__all__ = ["count_collectives"]  # re-exported for the loop, which imports this module lazily

SUPPORTED_PRECISIONS = ("fp32", "bf16")


def check_parallel(world: World, cfg: TrainConfig, model: ModelConfig) -> None:
    """Refuse, before any collective, what this layout cannot train."""
    if cfg.precision not in SUPPORTED_PRECISIONS or cfg.cast_module or cfg.offload_optimizer:
        raise LmforgeError(
            f"--parallel {world.layout} supports train.precision fp32 or bf16 (autocast) without "
            "cast_module or offload_optimizer: change those settings or train in one process"
        )
    check_model(world.layout, model.n_heads, model.kv_heads, model.ffn_dim, model.n_experts)
    check_batch(world.layout, cfg.batch_size, cfg.seq_len, cfg.sequence_parallel)


def parallelize(
    model: Transformer,
    world: World,
    options: ParallelOptions,
    activation_checkpointing: str,
    compile: bool,
    param_dtype: torch.dtype | None,
) -> nn.Module:
    """Shard and wrap `model` in place; return the module the forward runs."""
    layout, mesh = world.layout, world.mesh
    if options.zero1 and (layout.fsdp > 1 or layout.tp > 1):
        raise LmforgeError(
            "train.zero1 shards the optimizer of plain data parallelism (dp) only; fsdp already "
            "shards optimizer state: drop train.zero1 or use --parallel dp=N"
        )
    if layout.tp > 1:
        if model.config.tie_embeddings:
            raise LmforgeError(
                "tensor parallelism shards the output head but not the embedding, so "
                "model.tie_embeddings must be false with tp > 1"
            )
        apply_tensor_parallel(model, mesh["tp"], options.sequence_parallel)
    apply_activation_checkpointing(model, activation_checkpointing)
    if compile:
        for block in model.layers:
            block.compile()
    if layout.fsdp > 1 or (layout.dp > 1 and layout.tp > 1):
        return apply_fsdp(
            model,
            world.data_mesh,
            units=model.layers,
            param_dtype=param_dtype,
            reshard_after_forward=options.reshard_after_forward,
        )
    if layout.dp > 1:
        return apply_ddp(model, mesh["dp"], options.bucket_mb)
    return model


def build_parallel_optimizer(
    model: Transformer,
    world: World,
    options: ParallelOptions,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
    fused: bool,
) -> torch.optim.Optimizer:
    """The AdamW one process would use (PyTorch's fused kernel when `fused` and the device has
    it, else lmforge's; both step DTensor shards and skip a bad step on the device), over the
    (possibly sharded) parameters; sharded itself by ZeRO-1 when asked."""
    cls, extra = adamw_choice(world.device, fused)
    groups = param_groups(model, weight_decay)
    if options.zero1 and world.layout.dp > 1:
        return build_zero1(groups, world.mesh["dp"], cls, lr=lr, betas=betas, **extra)
    return cls(groups, lr=lr, betas=betas, **extra)


@contextlib.contextmanager
def micro_step(compute: nn.Module, world: World, last: bool) -> Iterator[None]:
    """Forward and backward of one micro-batch: gradients sync on the last one only, and under
    tensor parallelism the loss is computed on the vocabulary shards of the logits."""
    with gradient_sync(compute, last), _loss_parallel(world.layout.tp > 1):
        yield


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.module(x)
        return logits.full_tensor() if hasattr(logits, "full_tensor") else logits
