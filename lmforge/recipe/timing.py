"""Time a shape's real training steps on this machine: the optimizer, precision and batch the
run will use, on its data, so the measured step time is the one training will see."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from lmforge.model import ModelConfig, Transformer
from lmforge.train.batches import make_batches
from lmforge.train.compose import compose
from lmforge.train.config import TrainConfig
from lmforge.train.guard import NonFiniteGuard
from lmforge.train.optimizers import build_optimizer
from lmforge.train.precision import make_precision
from lmforge.train.step import train_step

WARM_STEPS = 2  # paid once per shape (allocations, oneDNN's weight packing): never timed


def seconds_per_step(
    model_config: ModelConfig, cfg: TrainConfig, shard_dir: str | Path, steps: int = 3
) -> float:
    """The median time of `steps` optimizer steps (after WARM_STEPS untimed ones) of a fresh
    model of `model_config` trained as `cfg` says on the CPU; the model is thrown away."""
    device = torch.device("cpu")
    torch.manual_seed(cfg.seed)
    precision = make_precision(cfg.precision, device, cfg.cast_module)
    model = Transformer(model_config)
    composed = compose(model, precision, device, cfg.activation_checkpointing, cfg.compile)
    optimizer = build_optimizer(
        model,
        cfg.lr,
        (cfg.beta1, cfg.beta2),
        cfg.weight_decay,
        cfg.fused_adamw,
        cfg.optimizer,
        cfg.muon_lr,
        cfg.muon_momentum,
    )
    guard = NonFiniteGuard(device, cfg.max_bad_steps)
    batches = make_batches(cfg.loader, shard_dir, cfg.batch_size, cfg.seq_len, cfg.seed)
    composed.compute.train()
    times = []
    try:
        for step in range(WARM_STEPS + steps):
            t0 = time.perf_counter()
            result = train_step(
                composed, optimizer, guard, batches, step, cfg.lr, cfg.grad_accum_steps,
                cfg.grad_clip, device,
            )  # fmt: skip
            float(result.loss)  # wait for the step
            times.append(time.perf_counter() - t0)
    finally:
        batches.close()
    return statistics.median(times[WARM_STEPS:])
