"""What training asks of parallel/: its config checked against a layout, and collectives
counted.

parallel/ applies a layout to a model and knows nothing of the trainer; the trainer's own
rules for a layout (which precisions it supports, how its batch splits) live here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lmforge.errors import LmforgeError
from lmforge.parallel.comm_count import count_collectives
from lmforge.parallel.layout import check_batch, check_model

if TYPE_CHECKING:
    from lmforge.model import ModelConfig
    from lmforge.parallel.world import World
    from lmforge.train.config import TrainConfig

__all__ = ["check_parallel", "count_collectives"]

SUPPORTED_PRECISIONS = ("fp32", "bf16")


def check_parallel(world: World, cfg: TrainConfig, model: ModelConfig) -> None:
    """Refuse, before any collective, what this layout cannot train."""
    if (
        cfg.precision.dtype not in SUPPORTED_PRECISIONS
        or cfg.precision.cast_module
        or cfg.optimizer.offload
    ):
        raise LmforgeError(
            f"--parallel {world.layout} supports train.precision.dtype fp32 or bf16 (autocast) "
            "without train.precision.cast_module or train.optimizer.offload: change those "
            "settings or train in one process"
        )
    check_model(world.layout, model.n_heads, model.kv_heads, model.ffn_dim, model.n_experts)
    check_batch(world.layout, cfg.batch_size, cfg.seq_len, cfg.parallel.sequence_parallel)
