"""The engine's paged KV cache: keys and values in fixed-size blocks of one pool.

Each layer's keys (and values) are one tensor (H_kv, n_blocks, block_size, D); a request's
positions live in the blocks of its block table, in order (lmforge.infer.blocks decides which
block is whose). Before each forward the runner `bind`s the rows it runs: their block tables,
padded to one width, and the position of each row's first new token. Then, as the model's cache
protocol (lmforge.model.cache.Cache) asks, every layer writes its new keys and values through
the tables and reads each row's keys back as one (B, H_kv, S, D) view, S = the tables' width
in positions: one gather per layer. Keys past a row's own position are masked by attention (the
per-row positions), so padding blocks never matter.

The contiguous `KVCache` lives in model/ and is re-exported here for the engine's callers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from lmforge.errors import LmforgeError
from lmforge.model.cache import KVCache

if TYPE_CHECKING:
    from lmforge.model.transformer import Transformer

__all__ = ["KVCache", "PagedKVCache"]


class PagedKVCache:
    """`n_blocks` blocks of `block_size` positions for each layer's keys and values."""

    def __init__(self, model: Transformer, n_blocks: int, block_size: int) -> None:
        c = model.config
        weight = model.tok_embeddings.weight
        self.block_size = block_size
        self.n_blocks = n_blocks
        shape = (c.kv_heads, n_blocks, block_size, c.head_dim)
        self.k = [torch.zeros(shape, dtype=weight.dtype, device=weight.device)]
        self.k += [torch.zeros_like(self.k[0]) for _ in range(c.n_layers - 1)]
        self.v = [torch.zeros_like(self.k[0]) for _ in range(c.n_layers)]
        self.device = weight.device
        self.pos: int | torch.Tensor = 0

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def bind(self, tables: torch.Tensor, positions: torch.Tensor | int, n_new: int) -> None:
        """Run the next forward over rows whose block tables are `tables` (B, W), each writing
        n_new tokens from its own position on (`positions` (B,), or one int for one row)."""
        rows = tables.shape[0]
        start = torch.as_tensor(positions, device=self.device).reshape(-1, 1)
        steps = start + torch.arange(n_new, device=self.device)  # (B, T)
        self._write_block = tables.gather(1, steps // self.block_size).flatten()
        self._write_offset = (steps % self.block_size).flatten()
        self._read = tables.flatten()
        self._rows, self._n_new = rows, n_new
        self.pos = positions
        if isinstance(positions, int):  # one row: its keys end where its new tokens do
            self._kv_len = positions + n_new
        else:  # rows end at their own positions (masked); a compiled step keeps the width symbolic
            self._kv_len = None
            torch._dynamo.maybe_mark_dynamic(self._read, 0)

    def check_fits(self, batch_size: int, n_new: int) -> None:
        if (batch_size, n_new) != (self._rows, self._n_new):
            raise LmforgeError(
                f"the paged cache was bound for {self._rows} rows x {self._n_new} new tokens, "
                f"got {batch_size} x {n_new}: bind() the rows the forward runs"
            )

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (B, H_kv, T, D) through the bound tables; return each row's keys and
        values (B, H_kv, W * block_size, D), its blocks in order."""
        b, h, _, d = k.shape
        out = []
        for pool, new in ((self.k[layer], k), (self.v[layer], v)):
            pool[:, self._write_block, self._write_offset] = new.transpose(0, 1).reshape(h, -1, d)
            gathered = pool.index_select(1, self._read)  # (H_kv, B * W, block_size, D)
            out.append(gathered.view(h, b, -1, d).transpose(0, 1))
        if self._kv_len is not None:
            return out[0][:, :, : self._kv_len], out[1][:, :, : self._kv_len]
        return out[0], out[1]

    def advance(self, n: int) -> None:
        """Positions belong to the engine, which moves each sequence on its own."""

    def copy_block(self, source: int, target: int) -> None:
        for pool in self.k + self.v:
            pool[:, target] = pool[:, source]
