"""Exact line deduplication across a corpus: lines that occur more than once are removed.

Two passes. The first counts every line of every text; the second removes each line counted
more than once, wherever it occurs (all its copies, as boilerplate removal wants):

    counter = LineCounter(min_chars=10)            # exact counts (sorted hash arrays)
    counter = LineCounter.bloom(capacity=50_000_000, fp_rate=0.001, min_chars=10)   # at scale
    for text in corpus: counter.add(text)
    counter.merge(other_counter)                   # counts made by another worker
    dedup = counter.finish()                       # LineDedup
    dedup.apply(text) -> str                       # the text without its repeated lines
    dedup.save(path); LineDedup.load(path)         # one .npz between the passes, no pickle
    dedup.removed_lines, dedup.kept_lines

Lines are compared after stripping surrounding whitespace; lines shorter than `min_chars` once
stripped (blank lines among them) are never counted nor removed. A removed line goes with its
line ending. Counting keeps one 64-bit hash per distinct line (exact) or two Bloom filters, "seen"
and "seen twice" (`bloom`): memory is then fixed, and a line seen once is removed with
probability about `fp_rate` (a false positive of the filters), a repeated line never survives.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lmforge.data.bloom import BloomFilter, item_hashes

_COMPACT_EVERY = 1 << 22


class LineCounter:
    """Counts line hashes of texts, exactly (default) or in two Bloom filters (`bloom`)."""

    def __init__(self, min_chars: int = 10) -> None:
        self.min_chars = min_chars
        self.lines = 0
        self._keys = np.zeros(0, dtype=np.uint64)
        self._counts = np.zeros(0, dtype=np.uint8)  # saturates at 2: "more than once"
        self._pending: list[np.ndarray] = []
        self._pending_size = 0
        self._seen: BloomFilter | None = None
        self._twice: BloomFilter | None = None

    @classmethod
    def bloom(cls, capacity: int, fp_rate: float = 0.001, min_chars: int = 10) -> LineCounter:
        """A counter of fixed memory sized for `capacity` distinct lines."""
        counter = cls(min_chars)
        counter._seen = BloomFilter(capacity, fp_rate)
        counter._twice = BloomFilter(capacity, fp_rate)
        return counter

    def add(self, text: str) -> None:
        h1, h2 = _line_hashes(text, self.min_chars)
        self.lines += len(h1)
        if self._seen is not None and self._twice is not None:
            again = self._seen.add_hashes(h1, h2)
            self._twice.add_hashes(h1[again], h2[again])
            return
        self._pending.append(h1)
        self._pending_size += len(h1)
        if self._pending_size >= _COMPACT_EVERY:
            self._compact()

    def merge(self, other: LineCounter) -> None:
        """Add the counts of another counter made with the same settings."""
        if (self._seen is None) != (other._seen is None) or self.min_chars != other.min_chars:
            raise ValueError("only line counters of the same kind and min_chars merge")
        self.lines += other.lines
        if self._seen is not None and self._twice is not None:
            assert other._seen is not None and other._twice is not None
            self._twice = self._twice | other._twice | (self._seen & other._seen)
            self._seen = self._seen | other._seen
            return
        other._compact()
        self._pending.append(np.repeat(other._keys, other._counts.astype(np.int64)))
        self._compact()

    def finish(self) -> LineDedup:
        """The second pass: a `LineDedup` that removes every line counted more than once."""
        if self._twice is not None:
            return LineDedup(self.min_chars, bloom=self._twice)
        self._compact()
        return LineDedup(self.min_chars, keys=self._keys[self._counts > 1])

    def _compact(self) -> None:
        if not self._pending:
            return
        keys = np.concatenate([self._keys, *self._pending])
        counts = np.concatenate([self._counts, np.ones(len(keys) - len(self._keys), np.uint8)])
        self._pending, self._pending_size = [], 0
        if len(keys) == 0:
            return
        order = np.argsort(keys, kind="stable")
        keys, counts = keys[order], counts[order]
        starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
        total = np.add.reduceat(counts.astype(np.int64), starts)
        self._keys, self._counts = keys[starts], np.minimum(total, 2).astype(np.uint8)


class LineDedup:
    """Removes the lines a `LineCounter` saw more than once."""

    def __init__(
        self, min_chars: int, keys: np.ndarray | None = None, bloom: BloomFilter | None = None
    ) -> None:
        if (keys is None) == (bloom is None):
            raise ValueError("a LineDedup needs either the repeated line keys or a Bloom filter")
        self.min_chars = min_chars
        self.keys = keys
        self.bloom = bloom
        self.removed_lines = 0
        self.kept_lines = 0

    def apply(self, text: str) -> str:
        """`text` without the lines counted more than once (and their line endings)."""
        lines = text.splitlines(keepends=True)
        self.kept_lines += len(lines)
        stripped = [line.strip() for line in lines]
        long_lines = [i for i, line in enumerate(stripped) if len(line) >= self.min_chars]
        if not long_lines:
            return text
        repeated = self._repeated(*item_hashes([stripped[i] for i in long_lines]))
        if not repeated.any():
            return text
        drop = {long_lines[i] for i in np.flatnonzero(repeated).tolist()}
        self.removed_lines += len(drop)
        self.kept_lines -= len(drop)
        return "".join(line for i, line in enumerate(lines) if i not in drop)

    def save(self, path: str | Path) -> None:
        """One .npz file: the repeated lines' hashes, or the "seen twice" Bloom filter."""
        arrays = {"min_chars": np.array([self.min_chars])}
        if self.keys is not None:
            arrays["keys"] = self.keys
        elif self.bloom is not None:
            arrays.update(self.bloom.to_arrays(prefix="bloom_"))
        np.savez(path, **arrays)

    @classmethod
    def load(cls, path: str | Path) -> LineDedup:
        with np.load(path, allow_pickle=False) as f:
            arrays = dict(f)
        min_chars = int(arrays["min_chars"][0])
        if "keys" in arrays:
            return cls(min_chars, keys=arrays["keys"])
        return cls(min_chars, bloom=BloomFilter.from_arrays(arrays, prefix="bloom_"))

    def _repeated(self, h1: np.ndarray, h2: np.ndarray) -> np.ndarray:
        if self.bloom is not None:
            return self.bloom.contains_hashes(h1, h2)
        keys = self.keys if self.keys is not None else np.zeros(0, dtype=np.uint64)
        if len(keys) == 0:
            return np.zeros(len(h1), dtype=bool)
        return keys[np.minimum(np.searchsorted(keys, h1), len(keys) - 1)] == h1


def _line_hashes(text: str, min_chars: int) -> tuple[np.ndarray, np.ndarray]:
    stripped = (line.strip() for line in text.splitlines())
    return item_hashes([line for line in stripped if len(line) >= min_chars])
