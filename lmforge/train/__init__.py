"""Training: the loop, its step, precision, memory, optimizer, schedule, checkpoints and metrics.

Names import their module (and torch) on first use; TrainConfig is torch-free.
"""

from lmforge.lazy import lazy_exports

_EXPORTS = {
    "list_checkpoints": "lmforge.train.checkpoint_dir",
    "load_model_weights": "lmforge.train.checkpoint",
    "resolve_checkpoint": "lmforge.train.checkpoint_dir",
    "save_checkpoint": "lmforge.train.checkpoint",
    "clip_grad_norm": "lmforge.train.clip",
    "TrainConfig": "lmforge.train.config",
    "TrainResult": "lmforge.train.loop",
    "train": "lmforge.train.loop",
    "MetricsLog": "lmforge.train.metrics",
    "read_metrics": "lmforge.train.metrics",
    "AdamW": "lmforge.train.adamw",
    "param_groups": "lmforge.train.adamw",
    "lr_at": "lmforge.train.schedule",
}

__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
