"""Byte-level BPE training: counts pre-tokens once, then merges pairs with incremental updates.

Each merge touches only the pre-tokens that hold the merged pair (found through a pair -> pre-token
index), and the best pair comes from a max-heap whose stale entries are fixed when popped.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from itertools import pairwise

from lmforge.errors import LmforgeError
from lmforge.progress import bar
from lmforge.tokenizer.pretokenize import GPT2_PATTERN, compile_pattern, split_special
from lmforge.tokenizer.tokenizer import Tokenizer

Pair = tuple[int, int]


def train_bpe(
    texts: Iterable[str],
    vocab_size: int,
    special_tokens: Sequence[str] = ("<|endoftext|>",),
    pattern: str = GPT2_PATTERN,
) -> Tokenizer:
    """Train a tokenizer with `vocab_size` ids: 256 bytes, then merges, then `special_tokens`.

    Ties between equally frequent pairs go to the greatest `(bytes_a, bytes_b)`. Stops early when
    no pair is left to merge.
    """
    specials = list(dict.fromkeys(special_tokens))
    if any(not s for s in specials):
        raise LmforgeError("empty special token; pass non-empty strings as special_tokens")
    if vocab_size < 256 + len(specials):
        raise LmforgeError(
            f"vocab_size {vocab_size} is below 256 bytes + {len(specials)} special tokens; "
            f"pass vocab_size >= {256 + len(specials)}"
        )
    counts = count_pretokens(texts, specials, pattern)
    vocab, merges = _merge(counts, vocab_size - len(specials))
    ranks = {token: i for i, token in enumerate(vocab)}
    special_ids = {s: len(vocab) + i for i, s in enumerate(specials)}
    return Tokenizer(ranks, special_ids, pattern, merges=merges)


def count_pretokens(texts: Iterable[str], specials: Sequence[str], pattern: str) -> Counter[str]:
    """Frequency of every pre-token in `texts`; special tokens are cut out and never counted."""
    regex = compile_pattern(pattern)
    counts: Counter[str] = Counter()
    with bar(desc="pre-tokenize", unit="B", unit_scale=True, unit_divisor=1024) as progress:
        for text in texts:
            for piece, is_special in split_special(text, specials):
                if not is_special:
                    counts.update(regex.findall(piece))
            progress.update(len(text.encode("utf-8")))
    return counts


def _merge(counts: Counter[str], n_tokens: int) -> tuple[list[bytes], list[tuple[bytes, bytes]]]:
    """Merge until there are `n_tokens` tokens; returns tokens by id and the merges that made them.

    Token ids stand for their bytes one to one: a merge whose bytes already exist (two different
    splits of one string) reuses that id and adds no token, as Hugging Face's trainer does.
    """
    vocab = [bytes([b]) for b in range(256)]
    token_id = {t: i for i, t in enumerate(vocab)}
    # Heap keys order greater byte strings first: bytes inverted, then a terminator above any
    # byte, so a prefix sorts after the longer string it starts.
    inverted = [(255 - b, 256) for b in range(256)]
    merges: list[tuple[bytes, bytes]] = []

    words: list[list[int]] = []
    freqs: list[int] = []
    for text, freq in counts.items():
        word = list(text.encode("utf-8"))
        if len(word) > 1:
            words.append(word)
            freqs.append(freq)
    pair_counts: dict[Pair, int] = {}
    where: defaultdict[Pair, set[int]] = defaultdict(set)
    for i, (word, freq) in enumerate(zip(words, freqs, strict=True)):
        for pair in pairwise(word):
            pair_counts[pair] = pair_counts.get(pair, 0) + freq
            where[pair].add(i)
    heap = [(-c, inverted[a], inverted[b], a, b) for (a, b), c in pair_counts.items()]
    heapq.heapify(heap)

    with bar(total=max(0, n_tokens - len(vocab)), desc="merges", unit="merge") as progress:
        while len(vocab) < n_tokens:
            best = _pop_best(heap, pair_counts)
            if best is None:
                break
            a, b = best
            merged = vocab[a] + vocab[b]
            new = token_id.get(merged)
            if new is None:
                new = token_id[merged] = len(vocab)
                vocab.append(merged)
                inverted.append((*(255 - x for x in merged), 256))
                merges.append((vocab[a], vocab[b]))
                progress.update(1)
            grown = _apply(best, new, words, freqs, pair_counts, where)
            for pa, pb in grown:
                count = pair_counts.get((pa, pb), 0)
                if count:
                    heapq.heappush(heap, (-count, inverted[pa], inverted[pb], pa, pb))
    return vocab, merges


def _pop_best(heap: list, pair_counts: dict[Pair, int]) -> Pair | None:
    """Pop the most frequent pair. An entry may overstate its pair's count (counts only shrink
    without a push); such an entry goes back in with the true count."""
    while heap:
        neg, ka, kb, a, b = heapq.heappop(heap)
        count = pair_counts.get((a, b), 0)
        if count == -neg:
            return a, b
        if count > 0:
            heapq.heappush(heap, (-count, ka, kb, a, b))
    return None


def _apply(
    pair: Pair,
    new: int,
    words: list[list[int]],
    freqs: list[int],
    pair_counts: dict[Pair, int],
    where: dict[Pair, set[int]],
) -> set[Pair]:
    """Replace `pair` by `new` in every word holding it; update counts and index for those words.

    Returns the pairs whose count grew (they need a fresh heap entry).
    """
    a, b = pair
    grown: set[Pair] = set()
    for i in where.pop(pair):
        old = words[i]
        word = []
        j, n = 0, len(old)
        while j < n:
            if j + 1 < n and old[j] == a and old[j + 1] == b:
                word.append(new)
                j += 2
            else:
                word.append(old[j])
                j += 1
        words[i] = word
        freq = freqs[i]
        old_pairs = list(pairwise(old))
        new_pairs = list(pairwise(word))
        for p in set(new_pairs).difference(old_pairs):
            where[p].add(i)
        for p in set(old_pairs).difference(new_pairs):
            if p != pair:
                where[p].discard(i)
        delta: defaultdict[Pair, int] = defaultdict(int)
        for p in old_pairs:
            delta[p] -= freq
        for p in new_pairs:
            delta[p] += freq
        for p, d in delta.items():
            if d > 0:
                grown.add(p)
            if d:
                count = pair_counts.get(p, 0) + d
                if count:
                    pair_counts[p] = count
                else:
                    del pair_counts[p]
                    where.pop(p, None)
    pair_counts.pop(pair, None)
    return grown
