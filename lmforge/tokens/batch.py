"""Turning a memory-mapped token array into training batches.

`get_batch` samples random windows; `WindowSampler` makes the choice a pure function of
(seed, step, micro-step), so a resumed run draws exactly the batches it would have drawn, and
given the shard's document starts it also returns each window's segment ids (document masking).
"""

from __future__ import annotations

import numpy as np
import torch

from lmforge.errors import LmforgeError
from lmforge.tokens.segments import segment_ids


def get_batch(
    data: np.ndarray,
    batch_size: int,
    context_length: int,
    device: str | torch.device = "cpu",
    rng: np.random.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows of `context_length + 1` tokens as (inputs, targets), shifted by one."""
    starts = window_starts(data, batch_size, context_length, rng or np.random.default_rng())
    return _to_device(read_windows(data, starts, context_length), device)


def window_starts(
    data: np.ndarray, batch_size: int, context_length: int, rng: np.random.Generator
) -> np.ndarray:
    if len(data) < context_length + 1:
        raise LmforgeError(
            f"only {len(data)} tokens for windows of {context_length + 1}: "
            "add data or lower train.seq_len"
        )
    return rng.integers(0, len(data) - context_length, size=batch_size)


def read_windows(
    data: np.ndarray, starts: np.ndarray, context_length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of the windows at token offsets `starts`, on the CPU."""
    window = np.stack([np.asarray(data[s : s + context_length + 1]) for s in starts])
    window = torch.from_numpy(window.astype(np.int64))
    return window[:, :-1], window[:, 1:]


def _to_device(
    tensors: tuple[torch.Tensor, ...], device: str | torch.device
) -> tuple[torch.Tensor, ...]:
    device = torch.device(device)
    if device.type == "cuda":
        return tuple(t.pin_memory().to(device, non_blocking=True) for t in tensors)
    return tuple(t.to(device) for t in tensors)


class WindowSampler:
    """Random-window batches whose content depends only on (seed, step, micro-step).

    With `doc_starts` (the shard's `.idx`) a batch is (inputs, targets, segment ids).
    """

    def __init__(
        self,
        data: np.ndarray,
        batch_size: int,
        context_length: int,
        seed: int,
        doc_starts: np.ndarray | None = None,
    ):
        self.data = data
        self.batch_size = batch_size
        self.context_length = context_length
        self.seed = seed
        self.doc_starts = doc_starts

    def batch(
        self, step: int, micro_step: int = 0, device: str | torch.device = "cpu"
    ) -> tuple[torch.Tensor, ...]:
        rng = np.random.default_rng([self.seed, step, micro_step])
        starts = window_starts(self.data, self.batch_size, self.context_length, rng)
        batch = read_windows(self.data, starts, self.context_length)
        if self.doc_starts is not None:
            segments = segment_ids(self.doc_starts, starts, self.context_length)
            batch = (*batch, torch.from_numpy(segments))
        return _to_device(batch, device)

    def state_dict(self) -> dict:
        return {"kind": "random_windows", "seed": self.seed, "batch_size": self.batch_size}
