"""LSH banding over MinHash signatures: choosing bands x rows, its S-curve, and candidate pairs.

    index = LSHIndex(threshold=0.8, num_perm=128)   # 9 bands x 13 rows, as datasketch picks
    LSHIndex(0.5, 128, weights=(0.2, 0.8))          # (false pos., false neg.): more recall
    LSHIndex(0.8, 128, bands=16, rows=8)            # a banding of one's own (bands x rows <= 128)
    print(index.describe())                         # the choice and P(candidate | Jaccard)
    pairs = index.candidate_pairs(signatures)       # (m, 2) int64 rows i < j, whole batch at once
    index.insert(key, signature); index.query(signature) -> list of keys   # one at a time

Two texts are candidates when all `rows` values of at least one band of their signatures agree,
which happens with probability 1 - (1 - J^rows)^bands for Jaccard similarity J. The (bands, rows)
pair minimizes the weighted area of false positives (below the threshold) plus false negatives
(above it), the rule and default weights (0.5, 0.5) of `datasketch.MinHashLSH`. A band is keyed
by a 64-bit hash of its values; texts without shingles (the all-0xFFFFFFFF signature) are never
candidates.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Hashable
from itertools import combinations

import numpy as np

from lmforge.data.hashing import fmix64
from lmforge.data.minhash import EMPTY

_BAND_MULTIPLIERS = (
    np.random.default_rng(0xBA4D).integers(0, 1 << 63, 4096, dtype=np.uint64) * np.uint64(2) + 1
)


@functools.lru_cache(maxsize=64)
def optimal_bands(
    threshold: float, num_perm: int, fp_weight: float = 0.5, fn_weight: float = 0.5
) -> tuple[int, int]:
    """(bands, rows) with bands * rows <= num_perm minimizing the weighted error areas."""
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be between 0 and 1 (exclusive), got {threshold}")
    below, above = np.linspace(0.0, threshold, 401), np.linspace(threshold, 1.0, 401)
    best, best_error = (1, 1), np.inf
    for bands in range(1, num_perm + 1):
        rows = np.arange(1, num_perm // bands + 1)[:, None]
        fp = _area(candidate_probability(below[None, :], bands, rows), below)
        fn = _area(1.0 - candidate_probability(above[None, :], bands, rows), above)
        error = fp_weight * fp + fn_weight * fn
        r = int(np.argmin(error))
        if error[r] < best_error - 1e-12:
            best, best_error = (bands, r + 1), error[r]
    return best


def _area(y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Trapezoid-rule integral of each row of y over x."""
    return ((y[:, 1:] + y[:, :-1]) * np.diff(x)).sum(axis=1) / 2.0


def candidate_probability(
    jaccard: float | np.ndarray, bands: int, rows: int | np.ndarray
) -> np.ndarray:
    """P(two texts are LSH candidates | their Jaccard similarity)."""
    return 1.0 - (1.0 - np.asarray(jaccard, dtype=np.float64) ** rows) ** bands


class LSHIndex:
    """Banded LSH over signatures of `num_perm` values, tuned for a Jaccard `threshold`."""

    def __init__(
        self,
        threshold: float = 0.8,
        num_perm: int = 128,
        bands: int | None = None,
        rows: int | None = None,
        max_bucket_pairs: int = 64,
        weights: tuple[float, float] = (0.5, 0.5),
    ) -> None:
        check_banding(num_perm, bands, rows)
        if bands is None or rows is None:
            bands, rows = optimal_bands(threshold, num_perm, *weights)
        self.threshold, self.num_perm, self.bands, self.rows = threshold, num_perm, bands, rows
        self.max_bucket_pairs = max_bucket_pairs
        self._tables: list[defaultdict[int, list[Hashable]]] = [
            defaultdict(list) for _ in range(bands)
        ]

    def describe(
        self, points: tuple[float, ...] = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
    ) -> str:
        """The band choice and its S-curve as a small table."""
        midpoint = (1.0 / self.bands) ** (1.0 / self.rows)
        probs = candidate_probability(np.array(points), self.bands, self.rows)
        return "\n".join(
            [
                f"LSH: {self.bands} bands x {self.rows} rows = {self.bands * self.rows} of "
                f"{self.num_perm} permutations, threshold {self.threshold:.2f} "
                f"(S-curve midpoint {midpoint:.3f})",
                "  Jaccard          " + " ".join(f"{j:6.2f}" for j in points),
                "  P(candidate)     " + " ".join(f"{p:6.3f}" for p in probs),
            ]
        )

    def band_keys(self, signatures: np.ndarray) -> np.ndarray:
        """(n, bands) uint64 keys: a hash of each band's values of each signature."""
        signatures = np.atleast_2d(signatures)
        keys = np.empty((len(signatures), self.bands), dtype=np.uint64)
        multipliers = _BAND_MULTIPLIERS[: self.rows]
        for lo in range(0, len(signatures), 8192):
            sig = signatures[lo : lo + 8192, : self.bands * self.rows].astype(np.uint64)
            sig = sig.reshape(len(sig), self.bands, self.rows)
            with np.errstate(over="ignore"):
                keys[lo : lo + 8192] = (sig * multipliers).sum(axis=2, dtype=np.uint64)
        return fmix64(keys)

    def insert(self, key: Hashable, signature: np.ndarray) -> None:
        """Add one signature under `key` (keys are what `query` returns)."""
        if not _is_empty(signature):
            self.insert_keys(key, self.band_keys(signature)[0])

    def query(self, signature: np.ndarray) -> list[Hashable]:
        """Keys of inserted signatures sharing at least one band with this one, first-seen order."""
        return [] if _is_empty(signature) else self.query_keys(self.band_keys(signature)[0])

    def insert_keys(self, key: Hashable, band_keys: np.ndarray) -> None:
        """`insert` with the signature's `band_keys` row already computed (batched callers)."""
        for table, band_key in zip(self._tables, band_keys.tolist(), strict=True):
            table[band_key].append(key)

    def query_keys(self, band_keys: np.ndarray) -> list[Hashable]:
        """`query` with the signature's `band_keys` row already computed (batched callers)."""
        found: dict[Hashable, None] = {}
        for table, band_key in zip(self._tables, band_keys.tolist(), strict=True):
            for key in table.get(band_key, ()):
                found[key] = None
        return list(found)

    def candidate_pairs(self, signatures: np.ndarray) -> np.ndarray:
        """All pairs (i, j), i < j, of rows sharing a band: an (m, 2) int64 array, sorted.

        A bucket of more than `max_bucket_pairs` texts pairs its first member with every other
        one instead of all pairs with each other, so exact-duplicate floods stay linear.
        """
        signatures = np.atleast_2d(signatures)
        rows_present = np.flatnonzero(~(signatures == EMPTY).all(axis=1))
        keys = self.band_keys(signatures[rows_present])
        found = [np.zeros((0, 2), dtype=np.int64)]
        for band in range(self.bands):
            order = np.argsort(keys[:, band], kind="stable")
            sorted_keys = keys[order, band]
            starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
            sizes = np.diff(np.r_[starts, len(sorted_keys)])
            members = rows_present[order]
            pairs_of_two = starts[sizes == 2]
            found.append(np.stack([members[pairs_of_two], members[pairs_of_two + 1]], axis=1))
            larger = [
                _bucket_pairs(members[start : start + size].tolist(), self.max_bucket_pairs)
                for start, size in zip(
                    starts[sizes > 2].tolist(), sizes[sizes > 2].tolist(), strict=True
                )
            ]
            if larger:
                found.append(np.array([p for pairs in larger for p in pairs], dtype=np.int64))
        return np.unique(np.concatenate(found), axis=0)


def check_banding(num_perm: int, bands: int | None, rows: int | None) -> None:
    """Raise ValueError, one line naming the fix, unless (bands, rows) is None or a valid pair."""
    if bands is None and rows is None:
        return
    if bands is None or rows is None:
        given = f"bands={bands}" if rows is None else f"rows={rows}"
        raise ValueError(f"{given} without the other: give both bands and rows, or neither")
    for name, value in (("bands", bands), ("rows", rows)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if bands * rows > num_perm:
        raise ValueError(
            f"{bands} bands x {rows} rows = {bands * rows} values need more than {num_perm} "
            "permutations: lower bands or rows, or raise num_perm"
        )
    if rows > len(_BAND_MULTIPLIERS):
        raise ValueError(f"rows must be at most {len(_BAND_MULTIPLIERS)}, got {rows}")


def _bucket_pairs(members: list[int], max_all_pairs: int) -> list[tuple[int, int]]:
    if len(members) <= max_all_pairs:
        return list(combinations(members, 2))
    return [(members[0], m) for m in members[1:]]


def _is_empty(signature: np.ndarray) -> bool:
    return bool((signature == EMPTY).all())
