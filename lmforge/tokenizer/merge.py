"""The BPE merge loop: from pre-token counts to the ordered list of merges.

Plain data in (words as bytes, their counts), plain data out (merged byte pairs), so the loop can
move to compiled code without changing its callers. Each merge rewrites only the words that hold
the merged pair, found through a pair -> words index; the most frequent pair comes from a lazy
max-heap whose stale entries are corrected when popped. Pair counts of the raw bytes, and which
words hold each byte pair, are computed once with numpy.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Protocol

import numpy as np

SHIFT = 1 << 22  # pair key = left * SHIFT + right; token ids stay below it


class Progress(Protocol):
    def update(self, n: int = 1) -> object: ...


def learn_merges(
    words: Sequence[bytes],
    counts: Sequence[int],
    n_merges: int,
    progress: Progress | None = None,
) -> list[tuple[bytes, bytes]]:
    """Up to `n_merges` merges in order: each time the most frequent adjacent pair, ties to the
    greatest `(bytes_a, bytes_b)`. A pair whose bytes already form a token (a second split of the
    same string) is applied but adds no merge, as Hugging Face's trainer does. Stops early when no
    pair is left."""
    vocab = [bytes([b]) for b in range(256)]
    token_id = {t: i for i, t in enumerate(vocab)}
    # Heap keys order greater byte strings first: bytes inverted, then a terminator above any byte,
    # so a prefix sorts after the longer string it starts.
    inverted = [(255 - b, 256) for b in range(256)]
    merges: list[tuple[bytes, bytes]] = []

    seqs = [list(w) for w in words]
    freqs = list(counts)
    pair_counts, byte_pair_words = _byte_pairs(words, freqs)
    where: dict[int, set[int]] = {}  # pairs with a merged token -> words that may hold them
    heap = [(-c, inverted[k // SHIFT], inverted[k % SHIFT], k) for k, c in pair_counts.items()]
    heapq.heapify(heap)
    heappop, heappush = heapq.heappop, heapq.heappush

    while len(merges) < n_merges and heap:
        neg, ka, kb, key = heappop(heap)
        count = pair_counts.get(key, 0)
        if count != -neg:  # stale: counts only shrink without a push; retry with the true count
            if count > 0:
                heappush(heap, (-count, ka, kb, key))
            continue
        a, b = divmod(key, SHIFT)
        merged = vocab[a] + vocab[b]
        new = token_id.get(merged)
        if new is None:
            new = token_id[merged] = len(vocab)
            vocab.append(merged)
            inverted.append((*(255 - x for x in merged), 256))
            merges.append((vocab[a], vocab[b]))
            if progress is not None:
                progress.update(1)
        holders = where.pop(key, None) if a >= 256 or b >= 256 else byte_pair_words(a, b)
        delta = _apply(a, b, new, holders or (), seqs, freqs, where)
        del pair_counts[key]
        for k, d in delta.items():
            if d == 0 or k == key:
                continue
            count = pair_counts.get(k, 0) + d
            if count > 0:
                pair_counts[k] = count
                if d > 0:
                    heappush(heap, (-count, inverted[k // SHIFT], inverted[k % SHIFT], k))
            else:
                pair_counts.pop(k, None)
    return merges


def _apply(
    a: int,
    b: int,
    new: int,
    holders: Sequence[int] | set[int],
    seqs: list[list[int]],
    freqs: list[int],
    where: dict[int, set[int]],
) -> dict[int, int]:
    """Replace `a b` by `new` (left to right, without overlap) in each holder word, in place.

    Returns the change of every neighbouring pair's count. Neighbours are read after earlier
    replacements in the same word, so consecutive occurrences net out correctly.
    """
    delta: dict[int, int] = {}
    get = delta.get
    for i in holders:
        w = seqs[i]
        try:
            j = w.index(a)
        except ValueError:
            continue  # an index entry that went stale
        f = freqs[i]
        n = len(w)
        while True:
            if j + 1 < n and w[j + 1] == b:
                if j:
                    p = w[j - 1]
                    k = p * SHIFT + a
                    delta[k] = get(k, 0) - f
                    k = p * SHIFT + new
                    delta[k] = get(k, 0) + f
                    where.setdefault(k, set()).add(i)
                if j + 2 < n:
                    q = w[j + 2]
                    k = b * SHIFT + q
                    delta[k] = get(k, 0) - f
                    k = new * SHIFT + q
                    delta[k] = get(k, 0) + f
                    where.setdefault(k, set()).add(i)
                w[j : j + 2] = (new,)
                n -= 1
            try:
                j = w.index(a, j + 1)
            except ValueError:
                break
    return delta


def _byte_pairs(words: Sequence[bytes], freqs: list[int]):
    """Counts of every adjacent byte pair, and a lookup of the words holding a given pair."""
    lengths = np.fromiter((len(w) for w in words), dtype=np.int64, count=len(words))
    flat = np.frombuffer(b"".join(words), dtype=np.uint8).astype(np.int64)
    if flat.size < 2:
        return {}, lambda a, b: []
    owner = np.repeat(np.arange(len(words), dtype=np.int64), lengths)
    same_word = owner[1:] == owner[:-1]
    keys = (flat[:-1] * 256 + flat[1:])[same_word]
    owners = owner[1:][same_word]
    weights = np.asarray(freqs, dtype=np.float64)[owners]
    totals = np.bincount(keys, weights=weights, minlength=65536)
    pair_counts = {
        int(k >> 8) * SHIFT + int(k & 255): int(totals[k]) for k in np.flatnonzero(totals)
    }
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    sorted_owners = owners[order]

    def holders(a: int, b: int) -> list[int]:
        k = a * 256 + b
        lo, hi = np.searchsorted(sorted_keys, [k, k + 1])
        return np.unique(sorted_owners[lo:hi]).tolist()

    return pair_counts, holders
