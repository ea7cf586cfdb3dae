"""Synthetic corpora with planted near-duplicates, to measure deduplication recall and precision.

    corpus = planted_corpus(n_base=500, seed=0)     # PlantedCorpus(texts, groups)
    clusters = near_duplicate_clusters(corpus.texts, threshold=0.3)
    precision, recall = pair_scores(clusters, corpus.groups)

Base texts are words drawn from a Zipf-distributed vocabulary of made-up words, in lines of about
a dozen words. A fraction of the bases get 1-3 copies, each with a random `edit_rate` of its words
edited (half substituted, a quarter deleted, a quarter followed by an inserted word). With word
5-gram shingles an edit rate e leaves about (1 - e)^5 of the shingles intact, so 5-10 % edits give
a Jaccard similarity of about 0.42-0.63 to the base. Texts are shuffled; `groups` lists the
indices of each base with its copies.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import numpy as np


@dataclass
class PlantedCorpus:
    texts: list[str]
    groups: list[list[int]]

    def true_pairs(self) -> set[tuple[int, int]]:
        return _pairs(self.groups)


def planted_corpus(
    n_base: int = 1000,
    dup_fraction: float = 0.3,
    max_copies: int = 3,
    edit_rate: tuple[float, float] = (0.05, 0.10),
    words: tuple[int, int] = (200, 600),
    vocab_size: int = 20000,
    seed: int = 0,
) -> PlantedCorpus:
    """A shuffled corpus of `n_base` texts plus edited copies of `dup_fraction` of them."""
    rng = np.random.default_rng(seed)
    vocab = _vocabulary(vocab_size, rng)
    zipf = 1.0 / np.arange(1, vocab_size + 1) ** 1.1
    zipf /= zipf.sum()
    bases = [rng.choice(vocab_size, size=rng.integers(*words), p=zipf) for _ in range(n_base)]
    docs: list[np.ndarray] = list(bases)
    families: list[list[int]] = []
    for b in np.flatnonzero(rng.random(n_base) < dup_fraction).tolist():
        family = [b]
        for _ in range(int(rng.integers(1, max_copies + 1))):
            family.append(len(docs))
            docs.append(_edit(bases[b], rng.uniform(*edit_rate), vocab_size, zipf, rng))
        families.append(family)
    order = rng.permutation(len(docs))
    position = np.empty(len(docs), dtype=np.int64)
    position[order] = np.arange(len(docs))
    texts = [_render(docs[i], vocab, rng) for i in order.tolist()]
    groups = sorted(sorted(position[f].tolist()) for f in families)
    return PlantedCorpus(texts, groups)


def pair_scores(found: list[list[int]], planted: list[list[int]]) -> tuple[float, float]:
    """(precision, recall) of the pairs inside found clusters against pairs inside planted ones."""
    predicted, true = _pairs(found), _pairs(planted)
    hits = len(predicted & true)
    precision = hits / len(predicted) if predicted else 1.0
    recall = hits / len(true) if true else 1.0
    return precision, recall


def _pairs(groups: list[list[int]]) -> set[tuple[int, int]]:
    return {pair for g in groups for pair in combinations(sorted(g), 2)}


def _vocabulary(size: int, rng: np.random.Generator) -> np.ndarray:
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    words: set[str] = set()
    while len(words) < size:
        length = int(rng.integers(2, 11))
        words.add(letters[rng.integers(0, 26, length)].tobytes().decode())
    return np.array(sorted(words), dtype=object)


def _edit(
    base: np.ndarray, rate: float, vocab_size: int, zipf: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    roll = rng.random(len(base))
    substitute, delete, insert = (
        roll < rate / 2,
        (roll >= rate / 2) & (roll < 3 * rate / 4),
        (roll >= 3 * rate / 4) & (roll < rate),
    )
    new_words = rng.choice(vocab_size, size=(len(base), 2), p=zipf)
    words = np.stack([np.where(substitute, new_words[:, 0], base), new_words[:, 1]], axis=1)
    return words[np.stack([~delete, insert], axis=1)]


def _render(ids: np.ndarray, vocab: np.ndarray, rng: np.random.Generator) -> str:
    words = vocab[ids].tolist()
    line = 12
    return "\n".join(" ".join(words[i : i + line]) for i in range(0, len(words), line)) + "\n"
