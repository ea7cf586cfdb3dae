"""Time a shape's real training steps on this machine: the optimizer, precision and batch the
run will use, on its data, so the measured step time is the one training will see."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from lmforge.model import ModelConfig, Transformer
from lmforge.threads import ThreadTrial, using_threads
from lmforge.train.batches import make_batches
from lmforge.train.compose import compose
from lmforge.train.config import TrainConfig
from lmforge.train.guard import NonFiniteGuard
from lmforge.train.optimizers import build_optimizer
from lmforge.train.precision import make_precision
from lmforge.train.step import train_step

WARM_STEPS = 2  # paid once per shape (allocations, oneDNN's weight packing): never timed


class StepTimer:
    """A fresh model of `model_config` trained as `cfg` says on the CPU, one timed step at a
    time; thrown away after."""

    def __init__(self, model_config: ModelConfig, cfg: TrainConfig, shard_dir: str | Path):
        self.device = torch.device("cpu")
        self.cfg = cfg
        torch.manual_seed(cfg.seed)
        precision = make_precision(cfg.precision.dtype, self.device, cfg.precision.cast_module)
        model = Transformer(model_config)
        self.model = compose(
            model, precision, self.device, cfg.compute.activation_checkpointing, cfg.compute.compile
        )
        self.optimizer = build_optimizer(
            model,
            cfg.optimizer.lr,
            (cfg.optimizer.beta1, cfg.optimizer.beta2),
            cfg.optimizer.weight_decay,
            cfg.optimizer.fused_adamw,
            cfg.optimizer.name,
            cfg.optimizer.muon_lr,
            cfg.optimizer.muon_momentum,
            cfg.optimizer.embed_lr,
        )
        self.guard = NonFiniteGuard(self.device, cfg.max_bad_steps)
        self.batches = make_batches(
            cfg.loader.kind, shard_dir, cfg.batch_size, cfg.seq_len, cfg.seed
        )
        self.model.compute.train()
        self.steps = 0

    def step(self) -> float:
        cfg, t0 = self.cfg, time.perf_counter()
        result = train_step(
            self.model,
            self.optimizer,
            self.guard,
            self.batches,
            self.steps,
            cfg.optimizer.lr,
            cfg.grad_accum_steps,
            cfg.optimizer.grad_clip,
            self.device,
        )
        float(result.loss)  # wait for the step
        self.steps += 1
        return time.perf_counter() - t0

    def close(self) -> None:
        self.batches.close()


def seconds_per_step(
    model_config: ModelConfig,
    cfg: TrainConfig,
    shard_dir: str | Path,
    steps: int = 3,
    threads: int | None = None,
) -> float:
    """The median time of `steps` optimizer steps (after WARM_STEPS untimed ones) at `threads`
    CPU threads (default: the current count)."""
    with using_threads(threads or torch.get_num_threads()):
        timer = StepTimer(model_config, cfg, shard_dir)
        try:
            times = [timer.step() for _ in range(WARM_STEPS + steps)]
        finally:
            timer.close()
    return statistics.median(times[WARM_STEPS:])


def choose_threads(model_config: ModelConfig, cfg: TrainConfig, shard_dir: str | Path) -> str:
    """Set torch's thread count to the fastest for this shape's steps (lmforge.threads'
    trial: all threads, then halvings while faster); return the trial's evidence."""
    trial = ThreadTrial(torch.get_num_threads())
    timer = StepTimer(model_config, cfg, shard_dir)
    try:
        timer.step()  # one-off costs
        while trial.chosen is None:
            torch.set_num_threads(trial.threads)
            trial.record(timer.step())
    finally:
        timer.close()
    torch.set_num_threads(trial.threads)
    return trial.describe()
