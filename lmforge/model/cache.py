"""The KV-cache interface the model consumes, and the contiguous cache that implements it.

Each layer's attention writes its rotated keys and values at `pos` through `update`, unless
the cache's `attend` computes the attention over its own storage itself (the engine's paged
cache, with a kernel that reads its blocks in place); the transformer calls `check_fits` before
and `advance` once all layers have written, so every layer sees the same `pos`. `Cache` is that
protocol; `KVCache` keeps one position for its whole batch. Other caches (the engine's paged
pool in infer/) implement the same protocol.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from lmforge.errors import LmforgeError


class Cache(Protocol):
    """What attention and the transformer ask of a KV cache."""

    pos: int | torch.Tensor  # next position: one int, or per-row positions (B,)

    def check_fits(self, batch_size: int, n_new: int) -> None: ...

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor | None: ...

    def advance(self, n: int) -> None: ...


class KVCache:
    def __init__(
        self,
        n_layers: int,
        batch_size: int,
        n_kv_heads: int,
        max_seq_len: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        shape = (batch_size, n_kv_heads, max_seq_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.batch_size = batch_size
        self.max_seq_len = max_seq_len
        self.pos = 0  # how many positions are filled

    @classmethod
    def from_buffers(cls, k: list[torch.Tensor], v: list[torch.Tensor], pos: int = 0) -> KVCache:
        """A cache over existing per-layer tensors (B, H_kv, S, D), e.g. views of one slot."""
        cache = cls.__new__(cls)
        cache.k, cache.v = k, v
        cache.batch_size, _, cache.max_seq_len, _ = k[0].shape
        cache.pos = pos
        return cache

    @classmethod
    def for_model(
        cls,
        model: nn.Module,
        batch_size: int,
        max_seq_len: int | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> KVCache:
        """An empty cache shaped for `model` (a Transformer); dtype and device default to its
        weights'."""
        c = model.config
        weight = model.tok_embeddings.weight
        return cls(
            n_layers=c.n_layers,
            batch_size=batch_size,
            n_kv_heads=c.kv_heads,
            max_seq_len=c.max_seq_len if max_seq_len is None else max_seq_len,
            head_dim=c.head_dim,
            dtype=weight.dtype if dtype is None else dtype,
            device=weight.device if device is None else device,
        )

    def check_fits(self, batch_size: int, n_new: int) -> None:
        if batch_size != self.batch_size:
            raise LmforgeError(
                f"batch of {batch_size} sequences does not match the KV cache's batch of "
                f"{self.batch_size}: make the cache with batch_size={batch_size}"
            )
        if self.pos + n_new > self.max_seq_len:
            raise LmforgeError(
                f"KV cache overflow: {self.pos} cached + {n_new} new tokens exceed its "
                f"{self.max_seq_len} positions: reset() it or make a larger cache"
            )

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, H_kv, T, D) at pos .. pos+T-1; return all keys and values so far."""
        end = self.pos + k.shape[-2]
        self.k[layer][:, :, self.pos : end] = k
        self.v[layer][:, :, self.pos : end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor | None:
        """None: this cache has no attention of its own (the caller updates and attends)."""
        return None

    def advance(self, n: int) -> None:
        self.pos += n

    def reset(self) -> None:
        self.pos = 0
