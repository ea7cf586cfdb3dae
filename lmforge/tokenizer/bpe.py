"""The pure-Python BPE encoder: the readable reference of tiktoken's rule, and the fallback.

The rule, per pre-token: if the whole pre-token is a token, that is its id; else start from its
bytes and merge the adjacent pair whose concatenation has the lowest rank (leftmost on ties) until
no adjacent pair is a token.
"""

from __future__ import annotations

import heapq
import math

from lmforge.tokenizer.pretokenize import compile_pattern

CACHE_LIMIT = 200_000  # pre-tokens kept before the cache is cleared
LONG_PIECE = 64  # pieces longer than this (bytes) use the O(n log n) merge


class PythonBPE:
    """Encodes ordinary text (no special tokens) with a pre-token -> ids cache."""

    def __init__(self, ranks: dict[bytes, int], pattern: str) -> None:
        self._ranks = ranks
        self._findall = compile_pattern(pattern).findall
        self._cache: dict[str, list[int]] = {}

    def encode_ordinary(self, text: str) -> list[int]:
        ids: list[int] = []
        cache = self._cache
        for piece in self._findall(text):
            piece_ids = cache.get(piece)
            if piece_ids is None:
                if len(cache) >= CACHE_LIMIT:
                    cache.clear()
                piece_ids = cache[piece] = self.encode_piece(utf8(piece))
            ids.extend(piece_ids)
        return ids

    def encode_piece(self, piece: bytes) -> list[int]:
        ranks = self._ranks
        rank = ranks.get(piece)
        if rank is not None:
            return [rank]
        return [ranks[part] for part in merge_parts(ranks, piece)]


def utf8(text: str) -> bytes:
    """UTF-8 bytes of `text`, with lone surrogates replaced by U+FFFD as tiktoken does."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf-8")


def merge_parts(ranks: dict[bytes, int], piece: bytes, max_rank: int | None = None) -> list[bytes]:
    """tiktoken's `_byte_pair_merge`: merge the adjacent pair of lowest rank (leftmost on ties)
    until none is in `ranks` (or below `max_rank`). Returns the final parts."""
    if len(piece) > LONG_PIECE:
        return _merge_parts_heap(ranks, piece, max_rank)
    limit = math.inf if max_rank is None else max_rank
    parts = [piece[i : i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        best, at = limit, -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < best:
                best, at = rank, i
        if at < 0:
            break
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
    return parts


def _merge_parts_heap(
    ranks: dict[bytes, int], piece: bytes, max_rank: int | None = None
) -> list[bytes]:
    """Same result as the quadratic loop, in O(n log n) for long pieces.

    Parts are byte ranges kept as a linked list by start offset; heap entries are (rank, start of
    left part, end of right part), stale once either part has changed.
    """
    n = len(piece)
    end = list(range(1, n + 1))  # end[s]: end of the part starting at s (valid while alive)
    prev = list(range(-1, n - 1))  # prev[s]: start of the part before s
    alive = [True] * n

    limit = math.inf if max_rank is None else max_rank

    def pair(left: int) -> tuple[int, int, int] | None:
        right = end[left]
        if right < n:
            rank = ranks.get(piece[left : end[right]])
            if rank is not None and rank < limit:
                return rank, left, end[right]
        return None

    heap = [entry for entry in map(pair, range(n - 1)) if entry]
    heapq.heapify(heap)
    while heap:
        _, left, stop = heapq.heappop(heap)
        if not alive[left] or end[left] >= n or end[end[left]] != stop:
            continue
        right = end[left]
        alive[right] = False
        end[left] = stop
        if stop < n:
            prev[stop] = left
        for start in (prev[left], left):
            entry = pair(start) if start >= 0 else None
            if entry:
                heapq.heappush(heap, entry)
    parts = []
    s = 0
    while s < n:
        parts.append(piece[s : end[s]])
        s = end[s]
    return parts
