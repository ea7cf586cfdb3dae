"""Training: the loop, its step, precision, memory, optimizer, schedule, checkpoints and metrics."""

from lmforge.train.checkpoint import (
    list_checkpoints,
    load_model_weights,
    resolve_checkpoint,
    save_checkpoint,
)
from lmforge.train.clip import clip_grad_norm
from lmforge.train.loop import TrainConfig, TrainResult, train
from lmforge.train.metrics import MetricsLog, read_metrics
from lmforge.train.optim import AdamW, param_groups
from lmforge.train.schedule import lr_at

__all__ = [
    "AdamW",
    "MetricsLog",
    "TrainConfig",
    "TrainResult",
    "clip_grad_norm",
    "list_checkpoints",
    "load_model_weights",
    "lr_at",
    "param_groups",
    "read_metrics",
    "resolve_checkpoint",
    "save_checkpoint",
    "train",
]
