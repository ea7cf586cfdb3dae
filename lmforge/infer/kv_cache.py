"""The engine's paged KV cache: keys and values in fixed-size blocks of one pool.

Each layer's keys (and values) are one tensor (H_kv, n_blocks, block_size, D); a request's
positions live in the blocks of its block table, in order (lmforge.infer.blocks decides which
block is whose). Before each forward the runner `bind`s the rows it runs: their block tables,
padded to one width, and the position of each row's first new token; the rows' blocks are then
gathered into one (H_kv, B, S, D) copy per layer, S = the tables' width in positions. As the
model's cache protocol (lmforge.model.cache.Cache) asks, every layer writes its new keys and
values into that copy and attends over it, and hands them to the cache as well; after the
forward, `commit` writes every layer's new positions into the pool at once, through the
tables. A decode batch that is the same a step later reuses its copy instead of gathering
again. Keys past a row's own position are masked by attention (the per-row positions), so
padding never matters.

A decode step (one new token per row) on a CPU the decode kernels run on skips the copy: each
layer's attention reads the rows' blocks where they lie, through the tables, and its new keys
and values beside them (`attend`, lmforge_cpu::paged_attention): one pass over the cache instead
of a gather, a write and SDPA's masked read.

The contiguous `KVCache` lives in model/ and is re-exported here for the engine's callers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from lmforge.errors import LmforgeError
from lmforge.kernels import cpu_decode
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
        # the decode kernels' instruction set where they can attend over these pools, else None
        kernel_fits = weight.dtype == torch.float32 and c.head_dim % 8 == 0
        on_cpu = weight.device.type == "cpu"
        self.attention_isa = cpu_decode.isa_for() if kernel_fits and on_cpu else None
        self._paged = False  # this forward attends through the tables (attend)
        self._scratch: dict[tuple[int, int], torch.Tensor] = {}  # by (k/v, layer): _gather

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.pools)

    @property
    def position_bytes(self) -> int:
        """The bytes of one position's keys and values, every layer's: what a gather copies."""
        return self.bytes // (self.n_blocks * self.block_size)

    def bind(
        self,
        tables: list[list[int]],
        positions: list[int] | int,
        n_new: int,
        reuse: bool = False,
        kv_len: int | None = None,
    ) -> None:
        """Run the next forward over rows whose block tables are `tables` (all of one width),
        each writing n_new tokens from its own position on (`positions`, one per row, or one int
        for one row).

        The rows' keys and values are gathered from the pool once, here, into a copy that the
        forward reads; its new tokens are written to both. `reuse`: the rows are the last
        per-row-positions bind's, in the same order, with the same blocks but for ones added
        since (a decode batch a step later): that copy is still current and is read again, not
        gathered, so a steady decode batch gathers its cache once, not every step. `kv_len`:
        attend over that many positions only (the longest row's), not the tables' whole width.
        The indices are worked out in Python: for a decode step's few rows that is faster than
        a dozen small tensor operations."""
        rows, size = len(tables), self.block_size
        starts = [positions] if isinstance(positions, int) else positions
        steps = [range(start, start + n_new) for start in starts]
        self._pool_index = self._index(
            table[q // size] * size + q % size
            for table, row in zip(tables, steps, strict=True)
            for q in row
        )
        self._rows, self._n_new = rows, n_new
        per_row = not isinstance(positions, int)
        self.pos = torch.tensor(positions, device=self.device) if per_row else positions
        self._kv_len = kv_len if per_row else positions + n_new
        self._new: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])  # by layer
        self._paged = per_row and n_new == 1 and self.attention_isa is not None
        if self._paged:  # no copy: attend reads the pools through the tables
            self._tables = torch.tensor(tables, dtype=torch.long, device=self.device)
            if self.compiled:
                torch._dynamo.maybe_mark_dynamic(self._tables, 1)
            return
        decode = per_row and n_new == 1  # a batch of rows, one new token each
        if reuse:
            self._copy = self._decode_copy
        else:
            read = self._index(block for table in tables for block in table)
            self._copy = [self._gather(kv, read, rows, not decode) for kv in range(2)]
            if decode:
                self._decode_copy = self._copy
        width = self._copy[0][0].shape[2]
        self._copy_index = self._index(b * width + q for b, row in enumerate(steps) for q in row)

    def _index(self, values: Iterable[int]) -> torch.Tensor:
        return torch.tensor(list(values), dtype=torch.long, device=self.device)

    def _gather(self, kv: int, read: torch.Tensor, rows: int, scratch: bool) -> list[torch.Tensor]:
        """Each layer's (H_kv, B, W * block_size, D): the blocks of each row, in order.

        One tensor per layer, not views of one: a compiled step that writes into a view copies
        the whole base it belongs to, every layer's cache, once per layer. Blocks are selected
        as rows of (H_kv, n_blocks, block_size * D): torch's index_select over the 4-d layout's
        second dimension copied 6x slower (14 ms against 2.4 for 1,040 blocks of 4 x 16 x 64).
        `scratch` (prefill chunks, scoring rows, drafts: forwards no later bind reuses): into
        buffers kept from one bind to the next, since a new tensor of that size is new memory
        from the system each time, whose first writes fault every page in (a 16-row prefill
        over a 1,000-token prompt spent 90 of its 190 ms there)."""
        pool = self.pools[kv]
        _, h, n, _, d = pool.shape
        copies = []
        for i, layer in enumerate(pool):
            blocks = layer.view(h, n, -1)
            if scratch:
                size = h * len(read) * blocks.shape[2]
                buffer = self._scratch.get((kv, i))
                if buffer is None or buffer.numel() < size:
                    buffer = self._scratch[kv, i] = blocks.new_empty(size)
                out = buffer[:size].view(h, len(read), -1)
                copy = torch.index_select(blocks, 1, read, out=out)
            else:
                copy = blocks.index_select(1, read)
            copies.append(copy.view(h, rows, -1, d))
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
        for copy, new, kept in zip(self._copy, (k, v), self._new, strict=True):
            rows = copy[layer]  # (H_kv, B, S, D)
            h, d = rows.shape[0], rows.shape[3]
            new = new.transpose(0, 1).reshape(h, -1, d)  # (H_kv, B * T, D)
            rows.view(h, -1, d).index_copy_(1, self._copy_index, new)
            kept.append(new)  # compiled: an output of the step, appended after it
            rows = rows.transpose(0, 1)
            out.append(rows if self._kv_len is None else rows[:, :, : self._kv_len])
        return out[0], out[1]

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor | None:
        """A decode step's attention of q (B, H, 1, D) over the bound rows' blocks and their
        new k, v (B, H_kv, 1, D), which it keeps for `commit`: (B, H, 1, D). None unless this
        bind attends through the tables; the caller then `update`s and attends itself."""
        if not self._paged:
            return None
        k_new, v_new = k[:, :, 0].contiguous(), v[:, :, 0].contiguous()
        for new, kept in zip((k_new, v_new), self._new, strict=True):
            kept.append(new.transpose(0, 1))  # (H_kv, B, D): commit's layout
        out = cpu_decode.paged_attention(
            q[:, :, 0].contiguous(), self.k[layer], self.v[layer], k_new, v_new,
            self._tables, self.pos, self.attention_isa,
        )  # fmt: skip
        return out[:, :, None]

    def commit(self) -> None:
        """Write the last forward's new keys and values of every layer into the pool, in one
        copy each. After the forward, not inside it: a compiled step that wrote into the pool
        would copy the whole pool each step (Inductor keeps a mutated input whole)."""
        for pool, new in zip(self.pools, self._new, strict=True):
            layers, h, _, _, d = pool.shape
            if len(new) != layers:
                raise LmforgeError(f"{len(new)} of {layers} layers wrote to the cache: bind first")
            pool.view(layers, h, -1, d).index_copy_(2, self._pool_index, torch.stack(new))

    def advance(self, n: int) -> None:
        """Positions belong to the engine, which moves each sequence on its own."""

    def copy_block(self, source: int, target: int) -> None:
        for pool in self.pools:
            pool[:, :, target] = pool[:, :, source]
