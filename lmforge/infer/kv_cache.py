"""The key/value caches that let decoding feed only new tokens to the model.

Each layer's attention writes its rotated keys and values at `pos` through `update`; the
transformer calls `advance` once all layers have written, so every layer sees the same `pos`.
`KVCache` keeps one position for its whole batch; `SlotKVCache` is the engine's preallocated
pool of sequence slots, each at its own position.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from lmforge.errors import LmforgeError

if TYPE_CHECKING:
    from lmforge.model import Transformer


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
        model: Transformer,
        batch_size: int,
        max_seq_len: int | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> KVCache:
        """An empty cache shaped for `model`; dtype and device default to its weights'."""
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

    def advance(self, n: int) -> None:
        self.pos += n

    def reset(self) -> None:
        self.pos = 0


class SlotKVCache:
    """A preallocated pool of `n_slots` sequences, each at its own position.

    A decode step runs the first `n_rows` slots at once (the engine fills the lowest free slot
    first, so active requests sit at the front): row b writes its new key and value at
    `positions[b]` and attends to its own keys 0 .. positions[b]. Attention reads the first
    `kv_len` positions only, the longest row's (`use`). Prefill writes a prompt into one slot
    through `slot(i)`, an ordinary `KVCache` over that slot.
    """

    def __init__(self, model: Transformer, n_slots: int, max_seq_len: int | None = None) -> None:
        c = model.config
        weight = model.tok_embeddings.weight
        self.n_slots = n_slots
        self.max_seq_len = c.max_seq_len if max_seq_len is None else max_seq_len
        shape = (n_slots, c.kv_heads, self.max_seq_len, c.head_dim)
        self.k = [torch.zeros(shape, dtype=weight.dtype, device=weight.device)]
        self.k += [torch.zeros_like(self.k[0]) for _ in range(c.n_layers - 1)]
        self.v = [torch.zeros_like(self.k[0]) for _ in range(c.n_layers)]
        self.positions = torch.zeros(n_slots, dtype=torch.long, device=weight.device)
        self._rows = torch.arange(n_slots, device=weight.device)
        self._key_positions = torch.arange(self.max_seq_len, device=weight.device)
        self.batch_size = self.kv_len = 0
        self.use(n_slots, self.max_seq_len)

    def use(self, n_rows: int, kv_len: int) -> None:
        """Decode the first n_rows slots next, attending over their first kv_len positions."""
        if n_rows != self.batch_size:
            self.batch_size = n_rows
            self.rows, self.pos = self._rows[:n_rows], self.positions[:n_rows]
            self._k = [k[:n_rows] for k in self.k]
            self._v = [v[:n_rows] for v in self.v]
        if kv_len != self.kv_len:
            self.kv_len = kv_len
            # A compiled step reads the length from this tensor's size, which torch.compile
            # keeps symbolic: one compiled step serves every length.
            self.key_positions = self._key_positions[:kv_len]
            torch._dynamo.maybe_mark_dynamic(self.key_positions, 0)

    def slot(self, i: int, pos: int = 0) -> KVCache:
        """Slot i alone as a batch-of-one cache whose next token goes to position `pos`."""
        return KVCache.from_buffers(
            [k[i : i + 1] for k in self.k], [v[i : i + 1] for v in self.v], pos
        )

    def check_fits(self, batch_size: int, n_new: int) -> None:
        if batch_size != self.batch_size or n_new != 1:
            raise LmforgeError(
                f"a slot cache decodes one token for each of its first {self.batch_size} "
                f"slots, got {batch_size} x {n_new}: prefill through slot(i)"
            )

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, H_kv, 1, D) at each row's own position; return the first kv_len."""
        keys, values = self._k[layer], self._v[layer]
        keys[self.rows, :, self.pos] = k[:, :, 0]
        values[self.rows, :, self.pos] = v[:, :, 0]
        kv_len = self.key_positions.shape[0]
        return keys[:, :, :kv_len], values[:, :, :kv_len]

    def advance(self, n: int) -> None:
        """Positions belong to the engine, which moves each slot on its own."""
