"""Near-duplicate detection: MinHash + LSH candidates, checked by true Jaccard, union-find clusters.

Batch, over a sequence of texts held in memory:

    found = find_near_duplicates(texts, threshold=0.8)   # NearDuplicates (normalized, auto bands)
    found.clusters     # [[i, j, ...], ...]: sorted members, >= 2 each, ordered by first member
    found.keep         # bool per text: False for every cluster member but the first
    near_duplicate_clusters(texts, threshold=0.8)        # just the clusters

Streaming, one text (or batch) at a time, e.g. inside a pipeline step:

    dedup = NearDedup(threshold=0.8)
    dedup.add(text) -> bool               # True: keep; False: near-duplicate of an earlier text
    dedup.add_batch(texts) -> np.ndarray  # the same decisions, signatures computed at once
    dedup.matches                         # [(later, earlier), ...] in arrival numbering

Texts are normalized before shingling (`normalize=True`: `lmforge.data.shingle_text.TextNormalizer`,
NFKC, case-folding, accents stripped, punctuation dropped, all Unicode whitespace collapsed), so a
copy that differs only in punctuation, accents or no-break spaces is found; `normalize=False`
shingles the raw text, `normalize=TextNormalizer(strip_accents=False)` chooses steps. The LSH
banding is chosen for the threshold (`lsh.optimal_bands`) unless `bands` and `rows` are given;
`found.bands`, `found.rows` report the one used.

A candidate pair (sharing an LSH band, see `lsh`) is a near-duplicate when the Jaccard similarity
of the two shingle sets is at least `threshold` (`verify="jaccard"`, the default), when their
signatures agree on at least that fraction of permutations (`"signature"`), or always (`"none"`).

The batch keeps every text's shingle hashes until the end (8 bytes per word) for verification.
The streaming decision is "similar to any earlier text, kept or not". So every text the batch
keeps is kept by the stream too, but a text may be kept by the stream whose cluster later grows
to include an earlier text through texts that arrive after it. Memory: the LSH tables (about
bands x 100 bytes per text) plus, with `verify="jaccard"`, 8 bytes per distinct shingle of every
text seen (`"signature"`: 4 x num_perm bytes per text).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from lmforge.data.lsh import LSHIndex
from lmforge.data.minhash import EMPTY, MinHasher
from lmforge.data.shingle_text import TextNormalizer, resolve_normalizer

VERIFY_MODES = ("jaccard", "signature", "none")


@dataclass
class NearDuplicates:
    clusters: list[list[int]]
    keep: np.ndarray
    candidate_pairs: int
    verified_pairs: int
    bands: int = 0  # the LSH banding used
    rows: int = 0

    @property
    def removed(self) -> int:
        return int(np.count_nonzero(~self.keep))


def find_near_duplicates(
    texts: Sequence[str],
    threshold: float = 0.8,
    num_perm: int = 128,
    ngram: int = 5,
    seed: int = 1,
    verify: str = "jaccard",
    *,
    normalize: bool | TextNormalizer = True,
    bands: int | None = None,
    rows: int | None = None,
) -> NearDuplicates:
    """Clusters of near-duplicate texts and which text of each to keep (the first).

    `normalize`: True (every step of `TextNormalizer`), False (raw text) or a `TextNormalizer`.
    `bands` x `rows`: the LSH banding (both, at most `num_perm` in all), None: chosen for the
    threshold.
    """
    _check_verify(verify)
    hasher = MinHasher(
        num_perm=num_perm, ngram=ngram, seed=seed, normalize=resolve_normalizer(normalize)
    )
    index = LSHIndex(threshold=threshold, num_perm=num_perm, bands=bands, rows=rows)
    signatures = np.empty((len(texts), num_perm), dtype=np.uint32)
    shingles = _Shingles()
    for lo, hi in hasher.groups(texts):
        grams, offsets = hasher.shingles(texts[lo:hi])
        signatures[lo:hi] = hasher.signatures_of_shingles(grams, offsets)
        if verify == "jaccard":
            shingles.add(lo, grams, offsets)
    pairs = index.candidate_pairs(signatures)
    if verify == "jaccard":
        similar = [
            jaccard(shingles.set_of(i), shingles.set_of(j)) >= threshold for i, j in pairs.tolist()
        ]
        verified = pairs[np.array(similar, dtype=bool)]
    elif verify == "signature":
        agreement = (signatures[pairs[:, 0]] == signatures[pairs[:, 1]]).mean(axis=1)
        verified = pairs[agreement >= threshold]
    else:
        verified = pairs
    clusters = clusters_from_pairs(verified)
    keep = np.ones(len(texts), dtype=bool)
    for cluster in clusters:
        keep[cluster[1:]] = False
    return NearDuplicates(clusters, keep, len(pairs), len(verified), index.bands, index.rows)


def near_duplicate_clusters(
    texts: Sequence[str],
    threshold: float = 0.8,
    num_perm: int = 128,
    ngram: int = 5,
    seed: int = 1,
    verify: str = "jaccard",
    *,
    normalize: bool | TextNormalizer = True,
    bands: int | None = None,
    rows: int | None = None,
) -> list[list[int]]:
    """Sorted index lists of near-duplicate texts, each with at least two members."""
    found = find_near_duplicates(
        texts, threshold, num_perm, ngram, seed, verify, normalize=normalize, bands=bands, rows=rows
    )
    return found.clusters


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard similarity of two sorted arrays of distinct values."""
    if len(a) == 0 or len(b) == 0:
        return 0.0
    at = np.minimum(np.searchsorted(b, a), len(b) - 1)
    common = int(np.count_nonzero(b[at] == a))
    return common / (len(a) + len(b) - common)


def clusters_from_pairs(pairs: Iterable[Sequence[int]] | np.ndarray) -> list[list[int]]:
    """Connected components (union-find) of the pairs' graph, as sorted lists by first member."""
    parent: dict[int, int] = {}

    def root(x: int) -> int:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    edges = pairs.tolist() if isinstance(pairs, np.ndarray) else pairs
    for i, j in edges:
        ri, rj = root(i), root(j)
        if ri != rj:
            parent[max(ri, rj)] = min(ri, rj)
    groups: dict[int, list[int]] = {}
    for node in sorted(parent):
        groups.setdefault(root(node), []).append(node)
    return sorted((g for g in groups.values() if len(g) > 1), key=lambda g: g[0])


class NearDedup:
    """Streaming near-duplicate filter: a text is dropped when similar to any earlier one.

    `normalize`, `bands` and `rows` as for `find_near_duplicates`; `index.bands`, `index.rows`
    are the banding used.
    """

    def __init__(
        self,
        threshold: float = 0.8,
        num_perm: int = 128,
        ngram: int = 5,
        seed: int = 1,
        verify: str = "jaccard",
        *,
        normalize: bool | TextNormalizer = True,
        bands: int | None = None,
        rows: int | None = None,
    ) -> None:
        _check_verify(verify)
        self.threshold, self.verify = threshold, verify
        self.hasher = MinHasher(
            num_perm=num_perm, ngram=ngram, seed=seed, normalize=resolve_normalizer(normalize)
        )
        self.index = LSHIndex(threshold=threshold, num_perm=num_perm, bands=bands, rows=rows)
        self.seen = 0
        self.removed = 0
        self.matches: list[tuple[int, int]] = []
        self._stored: dict[int, np.ndarray] = {}

    def add(self, text: str) -> bool:
        """True when `text` is to be kept, False when it near-duplicates an earlier text."""
        return bool(self.add_batch([text])[0])

    def add_batch(self, texts: Sequence[str]) -> np.ndarray:
        """`add` for each text in order (later texts of the batch see earlier ones)."""
        keep = np.ones(len(texts), dtype=bool)
        for lo, hi in self.hasher.groups(texts):
            grams, offsets = self.hasher.shingles(texts[lo:hi])
            signatures = self.hasher.signatures_of_shingles(grams, offsets)
            band_keys = self.index.band_keys(signatures)
            for i in range(hi - lo):
                if (signatures[i] == EMPTY).all():
                    self.seen += 1
                    continue
                mine = (
                    sorted_set(grams[offsets[i] : offsets[i + 1]])
                    if self.verify == "jaccard"
                    else signatures[i]
                )
                candidates = self.index.query_keys(band_keys[i])
                match = next((c for c in candidates if self._similar(mine, c)), None)
                if match is not None:
                    keep[lo + i] = False
                    self.removed += 1
                    self.matches.append((self.seen, match))
                if self.verify != "none":
                    self._stored[self.seen] = mine
                self.index.insert_keys(self.seen, band_keys[i])
                self.seen += 1
        return keep

    def clusters(self) -> list[list[int]]:
        """Clusters of arrival numbers linked by the matches found so far."""
        return clusters_from_pairs(self.matches)

    def _similar(self, mine: np.ndarray, other: int) -> bool:
        if self.verify == "jaccard":
            return jaccard(mine, self._stored[other]) >= self.threshold
        if self.verify == "signature":
            return MinHasher.jaccard_estimate(mine, self._stored[other]) >= self.threshold
        return True


class _Shingles:
    """The shingle hashes of a corpus, kept per group; sorted sets made only for texts asked for."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._groups: list[tuple[np.ndarray, np.ndarray]] = []
        self._sets: dict[int, np.ndarray] = {}

    def add(self, first_text: int, grams: np.ndarray, offsets: np.ndarray) -> None:
        self._starts.append(first_text)
        self._groups.append((grams, offsets))

    def set_of(self, text: int) -> np.ndarray:
        if text not in self._sets:
            g = bisect.bisect_right(self._starts, text) - 1
            grams, offsets = self._groups[g]
            k = text - self._starts[g]
            self._sets[text] = sorted_set(grams[offsets[k] : offsets[k + 1]])
        return self._sets[text]


def sorted_set(values: np.ndarray) -> np.ndarray:
    """The distinct values, sorted (np.unique without its overhead on small arrays)."""
    values = np.sort(values)
    distinct = np.empty(len(values), dtype=bool)
    distinct[:1] = True
    np.not_equal(values[1:], values[:-1], out=distinct[1:])
    return values[distinct]


def _check_verify(verify: str) -> None:
    if verify not in VERIFY_MODES:
        raise ValueError(f"verify must be one of {', '.join(VERIFY_MODES)}, got {verify!r}")
