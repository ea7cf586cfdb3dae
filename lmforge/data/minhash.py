"""MinHash signatures of texts over word n-gram shingles, computed for many texts at once in numpy.

    hasher = MinHasher(num_perm=128, ngram=5, seed=1)
    sigs = hasher.signatures(texts)            # (n_texts, num_perm) uint32
    grams, offsets = hasher.shingles(texts)    # 64-bit shingle hashes, text i = grams[o[i]:o[i+1]]
    MinHasher.jaccard_estimate(sigs[0], sigs[1])

Shingles are word n-grams as defined in `lmforge.data.hashing` (words split on ASCII whitespace
and control bytes, ASCII lowercased; a text shorter than n words is one shingle; an empty text has
none and gets the all-0xFFFFFFFF signature). The permutations are those of `datasketch`'s default
"affine32" scheme with the same seed: each shingle's low 32 hash bits are pre-mixed with fmix32,
then permutation k maps h to `a[k] * h + b[k] mod 2^32` (odd `a`, so a bijection), and the
signature is the minimum per permutation. Fed the same 32-bit shingle hashes, datasketch's
`MinHash(num_perm, seed).update_batch` gives the same signature bit for bit.

With a `normalize` function (`lmforge.data.shingle_text.TextNormalizer`, on by default in
`near_dedup` and the `minhash_dedup` step, off here) each text is normalized before shingling,
so copies that differ only in punctuation, accents, case or kinds of space get the same shingles.

Texts are processed in groups of about `group_bytes` and the permutation step in blocks of
`block` shingles, so memory stays at a few tens of MB whatever the input size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from lmforge.data.hashing import encode, fmix32, ngram_hashes, word_hashes

EMPTY = np.uint32(0xFFFFFFFF)
"""Every value of the signature of a text without shingles."""


class MinHasher:
    """MinHash signatures with `num_perm` permutations over word `ngram`-shingles."""

    def __init__(
        self,
        num_perm: int = 128,
        ngram: int = 5,
        seed: int = 1,
        lowercase: bool = True,
        group_bytes: int = 256 * 1024,
        block: int = 16384,
        normalize: Callable[[str], str] | None = None,
    ) -> None:
        if num_perm < 1:
            raise ValueError(f"num_perm must be positive, got {num_perm}")
        if not 1 <= ngram <= 64:
            raise ValueError(f"ngram must be between 1 and 64, got {ngram}")
        self.num_perm, self.ngram, self.seed, self.lowercase = num_perm, ngram, seed, lowercase
        self.group_bytes, self.block, self.normalize = group_bytes, block, normalize
        self.a, self.b = permutations(num_perm, seed)

    def shingles(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """64-bit hashes of every text's shingles, and per-text offsets (n_texts + 1) into them."""
        if self.normalize is not None:
            texts = [self.normalize(text) for text in texts]
        buf, starts = encode(texts)
        words, word_offsets = word_hashes(buf, starts, self.lowercase)
        return ngram_hashes(words, word_offsets, self.ngram, short="whole")

    def signatures(self, texts: Sequence[str]) -> np.ndarray:
        """The MinHash signature of every text: a (len(texts), num_perm) uint32 array."""
        out = np.empty((len(texts), self.num_perm), dtype=np.uint32)
        for lo, hi in self.groups(texts):
            grams, offsets = self.shingles(texts[lo:hi])
            out[lo:hi] = self.signatures_of_shingles(grams, offsets)
        return out

    def groups(self, texts: Sequence[str]) -> list[tuple[int, int]]:
        """Consecutive index ranges of texts holding about `group_bytes` characters each."""
        ranges, lo, size = [], 0, 0
        for i, text in enumerate(texts):
            size += len(text)
            if size >= self.group_bytes:
                ranges.append((lo, i + 1))
                lo, size = i + 1, 0
        if lo < len(texts):
            ranges.append((lo, len(texts)))
        return ranges

    def signatures_of_shingles(self, grams: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Signatures of shingle hashes as `shingles` returns them (their low 32 bits count)."""
        n_texts = len(offsets) - 1
        out = np.full((n_texts, self.num_perm), EMPTY, dtype=np.uint32)
        if len(grams) == 0:
            return out
        mixed = fmix32(grams.astype(np.uint32))  # keeps the low 32 bits
        nonempty = np.flatnonzero(offsets[1:] > offsets[:-1])
        # Segments: every text start, also cut at block edges so one block is one numpy call.
        cuts = np.union1d(offsets[nonempty], np.arange(0, len(grams), self.block))
        seg_mins = np.empty((self.num_perm, len(cuts)), dtype=np.uint32)
        work = np.empty((self.num_perm, min(self.block, len(grams))), dtype=np.uint32)
        a, b = self.a[:, None], self.b[:, None]
        with np.errstate(over="ignore"):
            for lo in range(0, len(grams), self.block):
                hi = min(lo + self.block, len(grams))
                first, last = np.searchsorted(cuts, [lo, hi])
                x = work[:, : hi - lo]
                np.multiply(a, mixed[lo:hi], out=x)
                np.add(x, b, out=x)
                seg_mins[:, first:last] = np.minimum.reduceat(x, cuts[first:last] - lo, axis=1)
        text_first_seg = np.searchsorted(cuts, offsets[nonempty])
        out[nonempty] = np.minimum.reduceat(seg_mins, text_first_seg, axis=1).T
        return out

    @staticmethod
    def jaccard_estimate(sig_a: np.ndarray, sig_b: np.ndarray) -> float:
        """The fraction of permutations on which two signatures agree (estimates Jaccard)."""
        return float(np.count_nonzero(sig_a == sig_b)) / len(sig_a)


def permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) uint32 arrays of the affine permutations; equal to datasketch's for the same seed."""
    gen = np.random.RandomState(seed)
    a = gen.randint(0, 1 << 31, num_perm, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
    b = gen.randint(0, 1 << 32, num_perm, dtype=np.uint32)
    return a, b
