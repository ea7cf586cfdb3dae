"""The Tokenizer: tiktoken-compatible rank-based BPE encoding and decoding of text.

It holds plain data only (ranks, special tokens, pattern), so it pickles cheaply to worker
processes; file reading and writing live in `files.py`.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from lmforge.errors import LmforgeError
from lmforge.tokenizer.pretokenize import (
    GPT2_PATTERN,
    compile_pattern,
    special_regex,
    split_special,
)

EOT = "<|endoftext|>"
CACHE_LIMIT = 200_000  # pre-tokens kept before the cache is cleared
LONG_PIECE = 64  # pieces longer than this (bytes) use the O(n log n) merge


class Tokenizer:
    """Byte-level BPE with tiktoken's semantics: ids are ranks; specials sit outside the ranks."""

    def __init__(
        self,
        mergeable_ranks: dict[bytes, int],
        special_tokens: dict[str, int],
        pattern: str = GPT2_PATTERN,
        *,
        merges: Sequence[tuple[bytes, bytes]] | None = None,
    ) -> None:
        missing = [b for b in range(256) if bytes([b]) not in mergeable_ranks]
        if missing:
            raise LmforgeError(
                f"tokenizer ranks lack {len(missing)} single bytes (first: {missing[0]}); "
                "use a byte-level vocabulary that holds all 256 bytes"
            )
        ids = [*mergeable_ranks.values(), *special_tokens.values()]
        if len(set(ids)) != len(ids):
            raise LmforgeError(
                "tokenizer ids are not unique; fix the vocabulary so each id is used once"
            )
        self._ranks = dict(mergeable_ranks)
        self._special = dict(special_tokens)
        self._pattern = pattern
        self._merges = list(merges) if merges is not None else None
        self._decoder = {rank: token for token, rank in self._ranks.items()}
        self._decoder.update({i: s.encode("utf-8") for s, i in self._special.items()})
        self._vocab_size = max(self._decoder) + 1
        self._regex = compile_pattern(pattern)
        self._cache: dict[str, list[int]] = {}
        self._fingerprint: str | None = None

    # Pickle the data only: the cache may be large and the compiled regex is rebuilt.
    def __getstate__(self) -> dict[str, Any]:
        return {
            "mergeable_ranks": self._ranks,
            "special_tokens": self._special,
            "pattern": self._pattern,
            "merges": self._merges,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, special_tokens={len(self._special)})"

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self._special)

    @property
    def mergeable_ranks(self) -> dict[bytes, int]:
        return dict(self._ranks)

    @property
    def eot_id(self) -> int | None:
        return self._special.get(EOT)

    @property
    def pattern(self) -> str:
        return self._pattern

    @property
    def merges(self) -> list[tuple[bytes, bytes]]:
        """Merge pairs in rank order. When not given, each multi-byte token's pair is the split
        that BPE with only lower ranks leaves (as the tiktoken -> Hugging Face converters do);
        tokens BPE cannot reach in one final merge have no pair."""
        if self._merges is None:
            merges = []
            for token, rank in sorted(self._ranks.items(), key=lambda item: item[1]):
                if len(token) > 1:
                    parts = _merge_parts(self._ranks, token, max_rank=rank)
                    if len(parts) == 2:
                        merges.append((parts[0], parts[1]))
            self._merges = merges
        return list(self._merges)

    def encode_ordinary(self, text: str) -> list[int]:
        """Encode `text` with special tokens treated as plain text."""
        ids: list[int] = []
        cache = self._cache
        for piece in self._regex.findall(text):
            piece_ids = cache.get(piece)
            if piece_ids is None:
                if len(cache) >= CACHE_LIMIT:
                    cache.clear()
                piece_ids = cache[piece] = self._bpe(_utf8(piece))
            ids.extend(piece_ids)
        return ids

    def encode(
        self,
        text: str,
        *,
        allowed_special: Iterable[str] | Literal["all"] = frozenset(),
        disallowed_special: Iterable[str] | Literal["all"] = "all",
    ) -> list[int]:
        """Encode like tiktoken: allowed special tokens become their single id; finding a
        disallowed one raises ValueError; any other special text is encoded as plain text."""
        allowed = set(self._special) if allowed_special == "all" else set(allowed_special)
        if disallowed_special == "all":
            disallowed = set(self._special) - allowed
        else:
            disallowed = set(disallowed_special)
        if disallowed:
            found = special_regex(frozenset(disallowed)).search(text)
            if found:
                token = found.group()
                raise ValueError(
                    f"text contains the disallowed special token {token!r}; pass "
                    f"allowed_special={{{token!r}}} to encode it as one token, or "
                    "disallowed_special=() to encode it as plain text"
                )
        allowed &= self._special.keys()
        if not allowed:
            return self.encode_ordinary(text)
        ids: list[int] = []
        for piece, is_special in split_special(text, allowed):
            if is_special:
                ids.append(self._special[piece])
            else:
                ids.extend(self.encode_ordinary(piece))
        return ids

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        decoder = self._decoder
        return b"".join(decoder[i] for i in ids)

    def decode(self, ids: Iterable[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def token_bytes(self, id: int) -> bytes:
        return self._decoder[id]

    def fingerprint(self) -> str:
        """sha256 over ranks, special tokens and pattern; equal tokenizers share it everywhere."""
        if self._fingerprint is None:
            h = hashlib.sha256()
            h.update(self._pattern.encode("utf-8") + b"\0")
            for token, rank in sorted(self._ranks.items(), key=lambda item: item[1]):
                h.update(b"%d:%d:" % (rank, len(token)) + token)
            for special, i in sorted(self._special.items(), key=lambda item: item[1]):
                encoded = special.encode("utf-8")
                h.update(b"%d:%d:" % (i, len(encoded)) + encoded)
            self._fingerprint = h.hexdigest()
        return self._fingerprint

    def save(self, directory: str | Path) -> None:
        from lmforge.tokenizer.files import save

        save(self, directory)

    @classmethod
    def load(cls, directory: str | Path) -> Tokenizer:
        from lmforge.tokenizer.files import load

        return load(directory)

    def _bpe(self, piece: bytes) -> list[int]:
        ranks = self._ranks
        rank = ranks.get(piece)
        if rank is not None:
            return [rank]
        return [ranks[part] for part in _merge_parts(ranks, piece)]


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates: replace them, as tiktoken does.
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf-8")


def _merge_parts(ranks: dict[bytes, int], piece: bytes, max_rank: int | None = None) -> list[bytes]:
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
