"""Synthetic corpora with planted near-duplicates, to measure deduplication recall and precision.

    corpus = planted_corpus(n_base=500, seed=0)     # PlantedCorpus(texts, groups, kinds)
    clusters = near_duplicate_clusters(corpus.texts, threshold=0.3)
    precision, recall = pair_scores(clusters, corpus.groups)
    planted_corpus(kinds=("edit", "punctuation", "accents", "nbsp"))   # copies of every kind
    corpus.of_kind("accents")                       # the groups whose copies are of that kind

Base texts are words drawn from a Zipf-distributed vocabulary of made-up words, in lines of about
a dozen words. A fraction of the bases get 1-3 copies, all of one kind drawn from `kinds`:

- `edit`: a random `edit_rate` of the words edited (half substituted, a quarter deleted, a quarter
  followed by an inserted word). With word 5-gram shingles an edit rate e leaves about (1 - e)^5
  of the shingles intact, so 5-10 % edits give a Jaccard similarity of about 0.42-0.63;
- `punctuation`: the same words, with punctuation added to about half of them (, . ; : ! ? …
  after a word, “quotes”, «guillemets» or (parentheses) around it, a dash between two);
- `accents`: the same words with about half of them accented (é, ñ, ü, ç ...), written
  precomposed or as a letter plus combining mark, one way per copy;
- `nbsp`: the same words with about half the spaces no-break (U+00A0, some U+202F).

The last three differ only in form: the raw texts share almost no word 5-grams with their base
(Jaccard below 0.1, as `lmforge.data.hashing` splits words on ASCII whitespace only), the
normalized ones (`lmforge.data.shingle_text`) are identical to it. Texts are shuffled; `groups`
lists the indices of each base with its copies and `kinds` the kind of each group's copies.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

KINDS = ("edit", "punctuation", "accents", "nbsp")
_ACCENTED = {
    "a": "àáâä",
    "c": "ç",
    "e": "éèêë",
    "i": "íîï",
    "n": "ñ",
    "o": "óôö",
    "u": "úùûü",
    "y": "ýÿ",
}
_AFTER = (",", ".", ";", ":", "!", "?", "…")
_AROUND = (("“", "”"), ('"', '"'), ("«", "»"), ("(", ")"), ("‘", "’"))
_DASHES = ("—", "–", "-")


@dataclass
class PlantedCorpus:
    texts: list[str]
    groups: list[list[int]]
    kinds: list[str] = field(default_factory=list)  # per group: the kind of its copies

    def true_pairs(self) -> set[tuple[int, int]]:
        return _pairs(self.groups)

    def of_kind(self, kind: str) -> list[list[int]]:
        """The groups whose copies are of `kind` (one of `KINDS`)."""
        return [g for g, k in zip(self.groups, self.kinds, strict=True) if k == kind]


def planted_corpus(
    n_base: int = 1000,
    dup_fraction: float = 0.3,
    max_copies: int = 3,
    edit_rate: tuple[float, float] = (0.05, 0.10),
    words: tuple[int, int] = (200, 600),
    vocab_size: int = 20000,
    seed: int = 0,
    kinds: tuple[str, ...] = ("edit",),
) -> PlantedCorpus:
    """A shuffled corpus of `n_base` texts plus copies of `dup_fraction` of them (see above)."""
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ValueError(f"kinds {list(kinds)} must be a non-empty subset of {list(KINDS)}")
    rng = np.random.default_rng(seed)
    variant_rng = np.random.default_rng([seed, 1])  # so the edit copies match kinds=("edit",)
    vocab = _vocabulary(vocab_size, rng)
    zipf = 1.0 / np.arange(1, vocab_size + 1) ** 1.1
    zipf /= zipf.sum()
    bases = [rng.choice(vocab_size, size=rng.integers(*words), p=zipf) for _ in range(n_base)]
    texts = [_render(b, vocab) for b in bases]
    families: list[list[int]] = []
    family_kinds: list[str] = []
    for b in np.flatnonzero(rng.random(n_base) < dup_fraction).tolist():
        kind = kinds[int(variant_rng.integers(len(kinds)))] if len(kinds) > 1 else kinds[0]
        family = [b]
        for _ in range(int(rng.integers(1, max_copies + 1))):
            family.append(len(texts))
            if kind == "edit":
                edited = _edit(bases[b], rng.uniform(*edit_rate), vocab_size, zipf, rng)
                texts.append(_render(edited, vocab))
            else:
                texts.append(_VARIANTS[kind](texts[b], variant_rng))
        families.append(family)
        family_kinds.append(kind)
    order = rng.permutation(len(texts))
    position = np.empty(len(texts), dtype=np.int64)
    position[order] = np.arange(len(texts))
    groups = [sorted(position[f].tolist()) for f in families]
    by_first = sorted(range(len(groups)), key=lambda g: groups[g])
    return PlantedCorpus(
        [texts[i] for i in order.tolist()],
        [groups[g] for g in by_first],
        [family_kinds[g] for g in by_first],
    )


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


def _render(ids: np.ndarray, vocab: np.ndarray) -> str:
    words = vocab[ids].tolist()
    line = 12
    return "\n".join(" ".join(words[i : i + line]) for i in range(0, len(words), line)) + "\n"


def _punctuated(text: str, rng: np.random.Generator) -> str:
    """The same words with punctuation attached to about half of them."""
    out = []
    for line in text.splitlines():
        words = line.split(" ")
        roll = rng.random(len(words))
        for i, word in enumerate(words):
            if roll[i] < 0.35:
                words[i] = word + _AFTER[int(rng.integers(len(_AFTER)))]
            elif roll[i] < 0.5:
                left, right = _AROUND[int(rng.integers(len(_AROUND)))]
                words[i] = left + word + right
            elif roll[i] < 0.55:
                words[i] = word + " " + _DASHES[int(rng.integers(len(_DASHES)))]
        out.append(" ".join(words))
    return "\n".join(out) + "\n"


def _accented(text: str, rng: np.random.Generator) -> str:
    """The same words with about half of them accented, precomposed or decomposed (per copy)."""
    form = "NFD" if rng.random() < 0.5 else "NFC"
    out = []
    for line in text.splitlines():
        words = line.split(" ")
        for i in np.flatnonzero(rng.random(len(words)) < 0.5).tolist():
            letters = [j for j, c in enumerate(words[i]) if c in _ACCENTED]
            if letters:
                j = letters[int(rng.integers(len(letters)))]
                choices = _ACCENTED[words[i][j]]
                accented = choices[int(rng.integers(len(choices)))]
                words[i] = words[i][:j] + accented + words[i][j + 1 :]
        out.append(unicodedata.normalize(form, " ".join(words)))
    return "\n".join(out) + "\n"


def _no_break_spaces(text: str, rng: np.random.Generator) -> str:
    """The same words with about half the spaces no-break ones (U+00A0, a fifth of them U+202F)."""
    chars = list(text)
    for i in (j for j, c in enumerate(chars) if c == " "):
        roll = rng.random()
        if roll < 0.5:
            chars[i] = "\u202f" if roll < 0.1 else "\u00a0"
    return "".join(chars)


_VARIANTS = {"punctuation": _punctuated, "accents": _accented, "nbsp": _no_break_spaces}
