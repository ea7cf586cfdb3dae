"""A Bloom filter: set membership with no false negatives and a chosen false-positive rate.

    bloom = BloomFilter(capacity=10_000_000, fp_rate=0.001)   # sizes bits and hash count
    bloom.add(b"item") -> bool        # whether it was (probably) there already
    b"item" in bloom
    h1, h2 = item_hashes([b"a", b"b"])  # two 64-bit hashes per item (xxh3-128 halves)
    bloom.add_hashes(h1, h2) -> np.ndarray[bool]      # many at once, vectorized
    bloom.contains_hashes(h1, h2) -> np.ndarray[bool]
    bloom.expected_fp_rate()          # (1 - e^(-k n / m))^k for the n items added so far
    bloom | other, bloom & other      # union / intersection of filters of the same shape
    bloom.save(path); BloomFilter.load(path)   # .npz, loaded without pickle

Sizing for capacity n and rate p: m = ceil(-n ln p / (ln 2)^2) bits (rounded up to whole bytes)
and k = round(m / n ln 2) hashes. Positions come from double hashing of the two halves of an
xxh3-128 digest, (h1 + i h2) mod m for i < k (Kirsch and Mitzenmacher), with h2 forced odd.
Strings are hashed as their UTF-8 bytes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import xxhash

_LOW = (1 << 64) - 1
_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


class BloomFilter:
    """A bit array of `num_bits` bits with `num_hashes` positions per item."""

    def __init__(self, capacity: int, fp_rate: float = 0.01) -> None:
        self.num_bits, self.num_hashes = optimal_size(capacity, fp_rate)
        self.capacity, self.fp_rate = capacity, fp_rate
        self.bits = np.zeros((self.num_bits + 7) // 8, dtype=np.uint8)
        self.count = 0

    def add(self, item: bytes | str) -> bool:
        """Add one item; True when it was (probably) present already."""
        h1, h2 = item_hashes([item])
        return bool(self.add_hashes(h1, h2)[0])

    def __contains__(self, item: bytes | str) -> bool:
        h1, h2 = item_hashes([item])
        return bool(self.contains_hashes(h1, h2)[0])

    def add_hashes(self, h1: np.ndarray, h2: np.ndarray) -> np.ndarray:
        """Add items given by their hashes; per item, whether it was (probably) present before.

        Items are taken in order, so a repeat within the batch reports True. (Other items of the
        batch do not count towards false positives of later ones, a negligible difference.)
        """
        present = self.contains_hashes(h1, h2)
        if len(h1) > 1:
            _, first = np.unique(h1, return_index=True)
            repeat = np.ones(len(h1), dtype=bool)
            repeat[first] = False
            present |= repeat
        # Sorted, not made unique: bits of one byte are OR-reduced together below, and np.unique
        # is ~100x slower than a sort on tens of millions of positions.
        positions = np.sort(self._positions(h1[~present], h2[~present]), axis=None)
        if len(positions):
            byte = positions >> np.uint64(3)
            mask = np.left_shift(1, (positions & np.uint64(7)).astype(np.uint8)).astype(np.uint8)
            starts = np.flatnonzero(np.concatenate(([True], byte[1:] != byte[:-1])))
            self.bits[byte[starts]] |= np.bitwise_or.reduceat(mask, starts)
        self.count += int(np.count_nonzero(~present))
        return present

    def contains_hashes(self, h1: np.ndarray, h2: np.ndarray) -> np.ndarray:
        """Per item given by its hashes, whether it is (probably) in the filter."""
        positions = self._positions(h1, h2)
        byte = (positions >> np.uint64(3)).astype(np.int64)
        bit = (positions & np.uint64(7)).astype(np.uint8)
        return ((self.bits[byte] >> bit) & 1).astype(bool).all(axis=1)

    def expected_fp_rate(self, items: int | None = None) -> float:
        """Theoretical false-positive rate after `items` insertions (default: those made)."""
        n = self.count if items is None else items
        return (1.0 - math.exp(-self.num_hashes * n / self.num_bits)) ** self.num_hashes

    def fill_ratio(self) -> float:
        """The fraction of bits set."""
        return float(_POPCOUNT[self.bits].sum(dtype=np.int64)) / self.num_bits

    def __or__(self, other: BloomFilter) -> BloomFilter:
        return self._combine(other, np.bitwise_or)

    def __and__(self, other: BloomFilter) -> BloomFilter:
        return self._combine(other, np.bitwise_and)

    def save(self, path: str | Path) -> None:
        np.savez(path, **self.to_arrays())

    @classmethod
    def load(cls, path: str | Path) -> BloomFilter:
        with np.load(path, allow_pickle=False) as f:
            return cls.from_arrays(dict(f))

    def to_arrays(self, prefix: str = "") -> dict[str, np.ndarray]:
        """The filter as named arrays (for an .npz file of its own or shared with other data)."""
        shape = [self.num_bits, self.num_hashes, self.capacity, self.count]
        return {
            f"{prefix}bits": self.bits,
            f"{prefix}shape": np.array(shape, dtype=np.int64),
            f"{prefix}fp_rate": np.array([self.fp_rate]),
        }

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], prefix: str = "") -> BloomFilter:
        bloom = cls.__new__(cls)
        num_bits, num_hashes, capacity, count = (int(v) for v in arrays[f"{prefix}shape"])
        bloom.num_bits, bloom.num_hashes, bloom.capacity = num_bits, num_hashes, capacity
        bloom.count, bloom.fp_rate = count, float(arrays[f"{prefix}fp_rate"][0])
        bloom.bits = np.asarray(arrays[f"{prefix}bits"], dtype=np.uint8)
        return bloom

    def _positions(self, h1: np.ndarray, h2: np.ndarray) -> np.ndarray:
        """(n, k) uint64 bit positions (h1 + i h2) mod m."""
        i = np.arange(self.num_hashes, dtype=np.uint64)
        with np.errstate(over="ignore"):
            return (h1[:, None] + i * (h2[:, None] | np.uint64(1))) % np.uint64(self.num_bits)

    def _combine(self, other: BloomFilter, op: np.ufunc) -> BloomFilter:
        if (self.num_bits, self.num_hashes) != (other.num_bits, other.num_hashes):
            raise ValueError("only Bloom filters of the same size and hash count combine")
        out = BloomFilter.__new__(BloomFilter)
        out.__dict__.update(self.__dict__)
        out.bits = op(self.bits, other.bits)
        out.count = (
            self.count + other.count if op is np.bitwise_or else min(self.count, other.count)
        )
        return out


def optimal_size(capacity: int, fp_rate: float) -> tuple[int, int]:
    """(bits, hashes) for `capacity` items at false-positive rate `fp_rate`."""
    if capacity < 1:
        raise ValueError(f"capacity must be positive, got {capacity}")
    if not 0.0 < fp_rate < 1.0:
        raise ValueError(f"fp_rate must be between 0 and 1 (exclusive), got {fp_rate}")
    bits = math.ceil(-capacity * math.log(fp_rate) / math.log(2) ** 2)
    bits = 8 * math.ceil(bits / 8)
    return bits, max(1, round(bits / capacity * math.log(2)))


def item_hashes(items: Iterable[bytes | str]) -> tuple[np.ndarray, np.ndarray]:
    """Two uint64 arrays: the low and high halves of each item's xxh3-128 digest."""
    digests = [
        xxhash.xxh3_128_intdigest(x.encode("utf-8", "surrogatepass") if isinstance(x, str) else x)
        for x in items
    ]
    h1 = np.fromiter((d & _LOW for d in digests), dtype=np.uint64, count=len(digests))
    h2 = np.fromiter((d >> 64 for d in digests), dtype=np.uint64, count=len(digests))
    return h1, h2
