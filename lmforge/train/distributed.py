"""What training asks of parallel/: its config checked against a layout, and the optimizer
over (possibly sharded) parameters.

parallel/ applies a layout to a model and knows nothing of the trainer; the trainer's own
rules for a layout (which precisions it supports, how its batch splits) live here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from lmforge.errors import LmforgeError
from lmforge.parallel.comm_count import count_collectives
from lmforge.parallel.layout import ParallelOptions, check_batch, check_model
from lmforge.train.optimizers import optimizer_choice

if TYPE_CHECKING:
    from lmforge.model import ModelConfig, Transformer
    from lmforge.parallel.world import World
    from lmforge.train.config import TrainConfig

__all__ = ["build_parallel_optimizer", "check_parallel", "count_collectives"]

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


def build_parallel_optimizer(
    model: Transformer,
    world: World,
    options: ParallelOptions,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
    fused: bool,
    optimizer: str = "adamw",
    muon_lr: float = 0.02,
    muon_momentum: float = 0.95,
    embed_lr: float = 0.0,
) -> torch.optim.Optimizer:
    """The optimizer one process would use (`optimizers.optimizer_choice`: PyTorch's fused AdamW,
    lmforge's, or Muon; all step DTensor shards and skip a bad step on the device), over the
    (possibly sharded) parameters; sharded itself by ZeRO-1 when asked."""
    from lmforge.parallel.data_parallel import build_zero1

    choice = (fused, optimizer, muon_lr, muon_momentum, embed_lr)
    cls, groups, extra = optimizer_choice(model, world.device, lr, weight_decay, *choice)
    if options.zero1 and world.layout.dp > 1:
        return build_zero1(groups, world.mesh["dp"], cls, lr=lr, betas=betas, **extra)
    return cls(groups, lr=lr, betas=betas, **extra)
