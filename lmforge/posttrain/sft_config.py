"""Fine-tuning's training defaults: torch-free, so `lmforge sft` checks its config first."""

from __future__ import annotations

from lmforge.model.config import ModelConfig
from lmforge.train.config import EvalConfig, OptimizerConfig, ScheduleConfig, TrainConfig


def sft_train_config(model: ModelConfig, lora: bool = False) -> TrainConfig:
    """AdamW on a cosine schedule at a tenth of pretraining's learning rate for the whole
    model (LoRA's adapters take a higher one, as usual), no weight decay, and a step count
    set by `--epochs` unless max_steps or minutes are given."""
    return TrainConfig(
        batch_size=16,
        seq_len=min(512, model.max_seq_len),
        max_steps=0,
        minutes=0.0,
        log_every=10,
        optimizer=OptimizerConfig(name="adamw", lr=2e-3 if lora else 3e-4, weight_decay=0.0),
        schedule=ScheduleConfig(kind="cosine", min_lr_ratio=0.1, warmup_frac=0.05, warmup_steps=20),
        eval=EvalConfig(every=50, batches=8),
    )
