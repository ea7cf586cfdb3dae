"""The KV block pool: which fixed-size blocks of the cache are free, shared or cached.

The engine's keys and values live in blocks of `block_size` token positions from one pool
(lmforge.infer.paged_cache holds the tensors; this module only counts). A request holds a list
of blocks, its block table, that grows as its sequence does. A full block is keyed by a hash of
its tokens and of every token before it (`chain_hash`), so a block computed for one request can
serve any later request whose tokens begin the same way: automatic prefix caching. Blocks are
reference-counted; a cached block that no request holds stays in the pool until a new block is
needed and it is the least recently used.

Free blocks are handed out lowest first. The sequences of a decode batch grow in step, so they
take neighbouring blocks, which the attention kernel then reads one after another. Handed out
in the order they were freed, an engine's blocks scatter over its first rounds: on an Intel Xeon
an engine's third and fourth rounds of 512 rows (a 5M model, 128 tokens each) took 9.1-9.4 s,
and 8.1-8.6 s lowest first (a fresh engine's first round: 8.5 s).

Pure Python, no tensors: the scheduler and its tests use it without a model. Block 0 is never
handed out: the runner points padding rows at it, so their writes land nowhere that matters.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Sequence

NULL_BLOCK = 0


def chain_hash(parent: int | None, tokens: Sequence[int]) -> int:
    """The key of a full block: its tokens and, through `parent` (the previous block's key),
    every token before them."""
    return hash((parent, tuple(tokens)))


class BlockPool:
    """`n_blocks` blocks of `block_size` positions: free ones, held ones, cached ones."""

    def __init__(self, n_blocks: int, block_size: int) -> None:
        self.n_blocks = n_blocks
        self.block_size = block_size
        self._refs = [0] * n_blocks
        self._key: list[int | None] = [None] * n_blocks  # a full block's chain hash, if cached
        self._free = list(range(1, n_blocks))  # a heap: unheld, holding nothing worth keeping
        self._evictable: OrderedDict[int, None] = OrderedDict()  # unheld cached, oldest first
        self._cached: dict[int, int] = {}  # chain hash -> block
        self.queried_tokens = self.hit_tokens = 0  # prefix-cache lookups, for its hit rate

    @property
    def capacity(self) -> int:
        """Blocks a request may ever hold (all but the null block)."""
        return self.n_blocks - 1

    @property
    def n_free(self) -> int:
        """Blocks that `allocate` can hand out now, evicting cached ones if need be."""
        return len(self._free) + len(self._evictable)

    @property
    def n_held(self) -> int:
        return self.capacity - self.n_free

    def allocate(self, n: int) -> list[int] | None:
        """n blocks for one holder, or None (and nothing taken) when fewer are free."""
        if n > self.n_free:
            return None
        blocks = []
        for _ in range(n):
            if self._free:
                block = heapq.heappop(self._free)
            else:
                block, _ = self._evictable.popitem(last=False)
                del self._cached[self._key[block]]
                self._key[block] = None
            self._refs[block] = 1
            blocks.append(block)
        return blocks

    def share(self, blocks: Sequence[int]) -> None:
        """One more holder for each of `blocks` (a request forked from another)."""
        for block in blocks:
            self._hold(block)

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one holder of each block. The last blocks of a sequence go first, so that when
        blocks must be evicted the shared beginnings of sequences stay cached longest."""
        for block in reversed(blocks):
            self._refs[block] -= 1
            if self._refs[block] == 0:
                if self._key[block] is None:
                    heapq.heappush(self._free, block)
                else:
                    self._evictable[block] = None

    def lookup(self, keys: Sequence[int]) -> list[int]:
        """The cached blocks for the longest run of `keys` (chain hashes of a sequence's full
        blocks, first to last) found in the pool, each now held once more by the caller."""
        blocks = []
        for key in keys:
            block = self._cached.get(key)
            if block is None:
                break
            self._hold(block)
            blocks.append(block)
        self.queried_tokens += len(keys) * self.block_size
        self.hit_tokens += len(blocks) * self.block_size
        return blocks

    def cached_run(self, keys: Sequence[int]) -> int:
        """How many of `keys`, first to last, `lookup` would find now (nothing held)."""
        n = 0
        while n < len(keys) and keys[n] in self._cached:
            n += 1
        return n

    def register(self, block: int, key: int) -> None:
        """Offer a full, computed block to later requests under its chain hash. A block whose
        tokens another block already caches stays private."""
        if key not in self._cached and self._key[block] is None:
            self._cached[key] = block
            self._key[block] = key

    def clear_cache(self) -> None:
        """Forget every cached block (new weights make their keys and values stale)."""
        for block in self._evictable:
            heapq.heappush(self._free, block)
        self._evictable.clear()
        for block in self._cached.values():
            self._key[block] = None
        self._cached.clear()

    def _hold(self, block: int) -> None:
        if self._refs[block] == 0:
            del self._evictable[block]
        self._refs[block] += 1
