"""Turning a memory-mapped token array into training batches.

`get_batch` samples random windows; `WindowSampler` makes the choice a pure function of
(seed, step, micro-step), so a resumed run draws exactly the batches it would have drawn.
"""

from __future__ import annotations

import numpy as np
import torch

from lmforge.errors import LmforgeError


def get_batch(
    data: np.ndarray,
    batch_size: int,
    context_length: int,
    device: str | torch.device = "cpu",
    rng: np.random.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows of `context_length + 1` tokens as (inputs, targets), shifted by one."""
    if len(data) < context_length + 1:
        raise LmforgeError(
            f"only {len(data)} tokens for windows of {context_length + 1}: "
            "add data or lower train.seq_len"
        )
    rng = rng or np.random.default_rng()
    starts = rng.integers(0, len(data) - context_length, size=batch_size)
    window = np.stack([np.asarray(data[s : s + context_length + 1]) for s in starts])
    window = torch.from_numpy(window.astype(np.int64))
    x, y = window[:, :-1], window[:, 1:]
    device = torch.device(device)
    if device.type == "cuda":
        x = x.pin_memory().to(device, non_blocking=True)
        y = y.pin_memory().to(device, non_blocking=True)
    else:
        x, y = x.to(device), y.to(device)
    return x, y


class WindowSampler:
    """Random-window batches whose content depends only on (seed, step, micro-step)."""

    def __init__(self, data: np.ndarray, batch_size: int, context_length: int, seed: int):
        self.data = data
        self.batch_size = batch_size
        self.context_length = context_length
        self.seed = seed

    def batch(
        self, step: int, micro_step: int = 0, device: str | torch.device = "cpu"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng([self.seed, step, micro_step])
        return get_batch(self.data, self.batch_size, self.context_length, device, rng)

    def state_dict(self) -> dict:
        return {"kind": "random_windows", "seed": self.seed, "batch_size": self.batch_size}
