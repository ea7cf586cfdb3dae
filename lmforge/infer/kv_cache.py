"""The engine's paged KV cache: keys and values in fixed-size blocks of one pool.

Each layer's keys (and values) are one tensor (H_kv, n_blocks, block_size, D); a request's
positions live in the blocks of its block table, in order (lmforge.infer.blocks decides which
block is whose). Before each forward the runner `bind`s the rows it runs: their block tables,
padded to one width, and the position of each row's first new token; the rows' blocks are then
gathered into one (H_kv, B, S, D) copy per layer, S = the tables' width in positions. As the
model's cache protocol (lmforge.model.cache.Cache) asks, every layer writes its new keys and
values into that copy and attends over it; after the forward, `commit` writes the new positions
into the pool through the tables. A decode
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

    def __init__(
        self, model: Transformer, n_blocks: int, block_size: int, compiled: bool = False
    ) -> None:
        c = model.config
        weight = model.tok_embeddings.weight
        self.block_size = block_size
        self.n_blocks = n_blocks
        shape = (c.n_layers, c.kv_heads, n_blocks, block_size, c.head_dim)
        self.pools = [torch.zeros(shape, dtype=weight.dtype, device=weight.device) for _ in "kv"]
        self.k, self.v = list(self.pools[0]), list(self.pools[1])  # each layer's view
        self.device = weight.device
        self.compiled = compiled  # read by a compiled step: keep its width symbolic
        self.pos: int | torch.Tensor = 0

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.pools)

    def bind(
        self,
        tables: torch.Tensor,
        positions: torch.Tensor | int,
        n_new: int,
        reuse: bool = False,
        kv_len: int | None = None,
    ) -> None:
        """Run the next forward over rows whose block tables are `tables` (B, W), each writing
        n_new tokens from its own position on (`positions` (B,), or one int for one row).

        The rows' keys and values are gathered from the pool once, here, into a copy that the
        forward reads; its new tokens are written to both. `reuse`: the rows are the last
        per-row-positions bind's, in the same order, with the same blocks but for ones added
        since (a decode batch a step later): that copy is still current and is read again, not
        gathered, so a steady decode batch gathers its cache once, not every step. `kv_len`:
        attend over that many positions only (the longest row's), not the tables' whole width."""
        rows = tables.shape[0]
        start = torch.as_tensor(positions, device=self.device).reshape(-1, 1)
        steps = start + torch.arange(n_new, device=self.device)  # (B, T)
        blocks = tables.gather(1, steps // self.block_size)
        self._pool_index = (blocks * self.block_size + steps % self.block_size).flatten()
        self._rows, self._n_new = rows, n_new
        self.pos = positions
        self._kv_len = positions + n_new if isinstance(positions, int) else kv_len
        if reuse:
            self._copy = self._decode_copy
        else:
            read = tables.flatten()
            self._copy = [self._gather(pool, read, rows) for pool in self.pools]
            if not isinstance(positions, int):  # a batch of rows, each at its own position
                self._decode_copy = self._copy
        width = self._copy[0][0].shape[2]
        row_starts = torch.arange(rows, device=self.device)[:, None] * width
        self._copy_index = (row_starts + steps).flatten()

    def _gather(self, pool: torch.Tensor, read: torch.Tensor, rows: int) -> list[torch.Tensor]:
        """Each layer's (H_kv, B, W * block_size, D): the blocks of each row, in order.

        One tensor per layer, not views of one: a compiled step that writes into a view copies
        the whole base it belongs to, every layer's cache, once per layer."""
        _, h, _, _, d = pool.shape
        copies = [layer.index_select(1, read).view(h, rows, -1, d) for layer in pool]
        if self.compiled:  # any number of blocks, one graph (importing dynamo otherwise costs)
            for copy in copies:
                torch._dynamo.maybe_mark_dynamic(copy, 2)
        return copies

    def check_fits(self, batch_size: int, n_new: int) -> None:
        if (batch_size, n_new) != (self._rows, self._n_new):
            raise LmforgeError(
                f"the paged cache was bound for {self._rows} rows x {self._n_new} new tokens, "
                f"got {batch_size} x {n_new}: bind() the rows the forward runs"
            )

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (B, H_kv, T, D) into the bound rows' copy; return its keys and values
        (B, H_kv, S, D)."""
        out = []
        for copy, new in zip(self._copy, (k, v), strict=True):
            rows = copy[layer]  # (H_kv, B, S, D)
            h, d = rows.shape[0], rows.shape[3]
            new = new.transpose(0, 1).reshape(h, -1, d)  # (H_kv, B * T, D)
            rows.view(h, -1, d).index_copy_(1, self._copy_index, new)
            rows = rows.transpose(0, 1)
            out.append(rows if self._kv_len is None else rows[:, :, : self._kv_len])
        return out[0], out[1]

    def commit(self) -> None:
        """Write the last forward's new keys and values from the bound rows' copy into the pool.
        After the forward, not inside it: a compiled step that wrote into
        the pool would copy the whole pool each step (Inductor keeps a mutated input whole)."""
        for pool, copies in zip(self.pools, self._copy, strict=True):
            _, h, _, _, d = pool.shape
            for layer, copy in zip(pool, copies, strict=True):
                new = copy.view(h, -1, d).index_select(1, self._copy_index)
                layer.view(h, -1, d).index_copy_(1, self._pool_index, new)

    def advance(self, n: int) -> None:
        """Positions belong to the engine, which moves each sequence on its own."""

    def copy_block(self, source: int, target: int) -> None:
        for pool in self.pools:
            pool[:, :, target] = pool[:, :, source]
