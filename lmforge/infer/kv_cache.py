"""The engine's paged KV cache: keys and values in fixed-size blocks of one pool.

Each layer's keys (and values) are one tensor (H_kv, n_blocks, block_size, D); a request's
positions live in the blocks of its block table, in order (lmforge.infer.blocks decides which
block is whose). Before each forward the runner `bind`s the rows it runs: their block tables,
padded to one width, and the position of each row's first new token; the rows' blocks are then
gathered into one (B, H_kv, S, D) copy per layer, S = the tables' width in positions. As the
model's cache protocol (lmforge.model.cache.Cache) asks, every layer writes its new keys and
values into the pool through the tables and into that copy, and attends over the copy. A decode
batch that is the same a step later reuses its copy instead of gathering again. Keys past a
row's own position are masked by attention (the per-row positions), so padding never matters.

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

    def bind(
        self,
        tables: torch.Tensor,
        positions: torch.Tensor | int,
        n_new: int,
        reuse: bool = False,
    ) -> None:
        """Run the next forward over rows whose block tables are `tables` (B, W), each writing
        n_new tokens from its own position on (`positions` (B,), or one int for one row).

        The rows' keys and values are gathered from the pool once, here, into a copy that the
        forward reads and also writes its new tokens to. `reuse`: the rows are the last
        per-row-positions bind's, in the same order, with the same blocks but for ones added
        since (a decode batch a step later): that copy is still current and is read again,
        not gathered, so a steady decode batch gathers its cache once, not every step."""
        rows = tables.shape[0]
        start = torch.as_tensor(positions, device=self.device).reshape(-1, 1)
        steps = start + torch.arange(n_new, device=self.device)  # (B, T)
        self._write_block = tables.gather(1, steps // self.block_size).flatten()
        self._write_offset = (steps % self.block_size).flatten()
        self._write_row = torch.arange(rows, device=self.device).repeat_interleave(n_new)
        self._write_pos = steps.flatten()
        self._rows, self._n_new = rows, n_new
        self.pos = positions
        self._kv_len = positions + n_new if isinstance(positions, int) else None
        if reuse:
            self._copy = self._decode_copy
            return
        read = tables.flatten()
        self._copy = [
            [self._gather(pool, read, rows) for pool in pools] for pools in (self.k, self.v)
        ]
        if self._kv_len is None:  # a batch of rows, each at its own position: kept for reuse
            self._decode_copy = self._copy

    def _gather(self, pool: torch.Tensor, read: torch.Tensor, rows: int) -> torch.Tensor:
        h, _, _, d = pool.shape
        copy = pool.index_select(1, read).view(h, rows, -1, d).transpose(0, 1)
        torch._dynamo.maybe_mark_dynamic(copy, 2)  # a compiled step: any number of blocks
        return copy

    def check_fits(self, batch_size: int, n_new: int) -> None:
        if (batch_size, n_new) != (self._rows, self._n_new):
            raise LmforgeError(
                f"the paged cache was bound for {self._rows} rows x {self._n_new} new tokens, "
                f"got {batch_size} x {n_new}: bind() the rows the forward runs"
            )

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (B, H_kv, T, D) into the pool through the bound tables and into the bound
        rows' copy; return that copy's keys and values (B, H_kv, W * block_size, D)."""
        _, h, _, d = k.shape
        out = []
        for pool, copy, new in ((self.k[layer], self._copy[0][layer], k),
                                (self.v[layer], self._copy[1][layer], v)):  # fmt: skip
            pool[:, self._write_block, self._write_offset] = new.transpose(0, 1).reshape(h, -1, d)
            copy[self._write_row, :, self._write_pos] = new.transpose(1, 2).reshape(-1, h, d)
            out.append(copy if self._kv_len is None else copy[:, :, : self._kv_len])
        return out[0], out[1]

    def advance(self, n: int) -> None:
        """Positions belong to the engine, which moves each sequence on its own."""

    def copy_block(self, source: int, target: int) -> None:
        for pool in self.k + self.v:
            pool[:, target] = pool[:, source]
