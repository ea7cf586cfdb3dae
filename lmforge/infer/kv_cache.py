"""The engine's slot cache: a preallocated pool of sequences, each at its own position.

It implements the model's cache protocol (lmforge.model.cache.Cache); the contiguous
`KVCache` lives in model/ and is re-exported here for the engine and its callers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from lmforge.errors import LmforgeError
from lmforge.model.cache import KVCache

if TYPE_CHECKING:
    from lmforge.model.transformer import Transformer

__all__ = ["KVCache", "SlotKVCache"]


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

    def copy_slot(self, source: int, target: int, n: int) -> None:
        """Give slot `target` the first `n` keys and values of slot `source`."""
        for k, v in zip(self.k, self.v, strict=True):
            k[target, :, :n] = k[source, :, :n]
            v[target, :, :n] = v[source, :, :n]

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
