"""Contamination of evaluation tasks by training data: examples that share a word 13-gram with it.

    index = NgramIndex(doc.text for doc in stdlib_documents())   # n=13, fp_rate=1e-4
    index.contains_any(text) -> bool; index.matching_ngrams(text) -> int
    index.matching_counts(texts) -> np.ndarray          # the same for many texts, vectorized
    index.add(text); index.update(texts)                 # more training text after the build
    index.save("train.ngrams.npz"); NgramIndex.load("train.ngrams.npz")
    contamination(index, examples) -> ContaminationResult(fraction, n_contaminated, ...)

This module owns the contamination definition and the index file; the machinery is the data
stage's dedup code, reused rather than copied: text normalization (`shingle_text.TextNormalizer`,
the near-dedup one), word and n-gram hashing (`hashing`), and the Bloom filter (`bloom`).

The reference is GPT-3's filter (Brown et al. 2020, appendix C): an example is contaminated when
one of its 13-grams of lowercased, punctuation-free, whitespace-split words occurs in training.

- **Words** are the whitespace-separated tokens of the text after `TextNormalizer()` (NFKC,
  casefold, accents stripped, every Unicode punctuation character made a space), with the nine
  ASCII symbols ``$ + < = > ^ ` | ~`` made spaces too: so, as in GPT-3's `string.punctuation`, no
  ASCII character but letters and digits is part of a word. For code that means identifiers split
  at `_` and `.`, and operators vanish: `a=b+1` and `A = b + 1` are both the words `a b 1`.
  Letters, digits and non-ASCII symbols (such as € or →) are kept.
- **N-grams** are n consecutive words of one text (n=13 by default), never across texts, hashed
  to 64 bits by `hashing.ngram_hashes`. A text with fewer than n words (but at least one) counts
  as one n-gram of all its words, on both sides: a short example is flagged only when a training
  document is, after normalization, exactly it, not when it occurs inside a longer one (use a
  smaller `n` for tasks of short examples, as GPT-3 did). A text without words is never flagged.
- **Membership** is a Bloom filter: no false negatives, and false positives at about `fp_rate`
  per n-gram looked up, so an example of w words is flagged wrongly with probability about
  (w - n + 1) * fp_rate. Each n-gram hash h goes in as the pair (h, fmix64(h ^ salt)) the filter's
  double hashing needs. Without a `capacity` the filter is sized for the distinct n-grams of the
  texts given to the constructor (at least `MIN_CAPACITY`); text added later raises the rate past
  `fp_rate` (see `expected_fp_rate`), so pass a `capacity` to leave room for it.

The file is an .npz (read without pickle) of the filter's arrays plus a JSON header (format,
version, n), written to a temporary name in the same folder and renamed into place.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lmforge.data.bloom import BloomFilter
from lmforge.data.hashing import encode, fmix64, ngram_hashes, segment_ids, word_hashes
from lmforge.data.shingle_text import TextNormalizer
from lmforge.errors import LmforgeError

DEFAULT_N = 13
DEFAULT_FP_RATE = 1e-4
MIN_CAPACITY = 1024
"""The smallest filter built from the constructor's texts alone (a few KB), so an index of
little or no text still takes some `add`s before its false-positive rate climbs."""

_FORMAT, _VERSION = "lmforge.ngram_index", 1
_NORMALIZER = TextNormalizer()
_BATCH_CHARS = 1 << 24  # texts are normalized and hashed about this much at a time
_INSERT_BATCH = 1 << 20  # n-grams per Bloom filter insertion: bounds its (n, k) position arrays
_SALT = np.uint64(0x2545F4914F6CDD1D)  # the second hash of an n-gram is fmix64(h ^ _SALT)
_SYMBOLS = b"$+<=>^`|~"  # the ASCII symbols (not punctuation) that TextNormalizer keeps
_SYMBOL_TO_SPACE = np.arange(256, dtype=np.uint8)
_SYMBOL_TO_SPACE[list(_SYMBOLS)] = ord(" ")


@dataclass(frozen=True)
class ContaminationResult:
    """How many of a task's examples share an n-gram with the training data, and which."""

    fraction: float  # n_contaminated / n_examples, 0.0 for no examples
    n_contaminated: int
    n_examples: int
    contaminated_indices: tuple[int, ...]  # into the examples, ascending


class NgramIndex:
    """The word n-grams of training texts, in a Bloom filter (see the module docstring)."""

    def __init__(
        self,
        texts: Iterable[str] = (),
        n: int = DEFAULT_N,
        fp_rate: float = DEFAULT_FP_RATE,
        capacity: int | None = None,
    ) -> None:
        """Index `texts`. With `capacity` (n-grams) the filter is sized up front and the texts
        stream through; without, their n-gram hashes (8 bytes each) are held until counted."""
        if n < 1:
            raise ValueError(f"n-gram length must be at least 1, got {n}")
        self.n = n
        if capacity is not None:
            self.bloom = BloomFilter(capacity, fp_rate)
            self.update(texts)
            return
        grams = [self._grams(batch)[0] for batch in _batches(texts)]
        distinct = _distinct(np.concatenate(grams)) if grams else np.zeros(0, np.uint64)
        self.bloom = BloomFilter(max(len(distinct), MIN_CAPACITY), fp_rate)
        self._insert(distinct)

    @property
    def fp_rate(self) -> float:
        """The false-positive rate the filter was sized for (at `capacity` n-grams)."""
        return self.bloom.fp_rate

    @property
    def capacity(self) -> int:
        return self.bloom.capacity

    @property
    def num_ngrams(self) -> int:
        """Distinct n-grams added (a few short: one the filter took as present is not counted)."""
        return self.bloom.count

    def expected_fp_rate(self) -> float:
        """The false-positive rate per n-gram looked up, for the n-grams added so far."""
        return self.bloom.expected_fp_rate()

    def add(self, text: str) -> None:
        """Add the n-grams of one training text."""
        self.update([text])

    def update(self, texts: Iterable[str]) -> None:
        """Add the n-grams of many training texts (hashed in batches, so faster than `add`)."""
        for batch in _batches(texts):
            self._insert(self._grams(batch)[0])

    def contains_any(self, text: str) -> bool:
        """Whether `text` shares an n-gram with the index (probably: see `fp_rate`)."""
        return bool(self.matching_counts([text])[0])

    def matching_ngrams(self, text: str) -> int:
        """How many of the n-grams of `text` are in the index, counted by position (a repeated
        n-gram counts each time); a text under n words has one n-gram, itself."""
        return int(self.matching_counts([text])[0])

    def matching_counts(self, texts: Sequence[str]) -> np.ndarray:
        """`matching_ngrams` of each text, as an int64 array."""
        counts = []
        for batch in _batches(texts):
            grams, offsets = self._grams(batch)
            hits = self.bloom.contains_hashes(grams, _second_hash(grams))
            counts.append(np.bincount(segment_ids(offsets)[hits], minlength=len(batch)))
        return np.concatenate(counts) if counts else np.zeros(0, dtype=np.int64)

    def save(self, path: str | Path) -> None:
        """Write the index to `path` (an .npz file): a temporary file, then renamed into place."""
        path = Path(path)
        header = json.dumps({"format": _FORMAT, "version": _VERSION, "n": self.n}).encode()
        arrays = self.bloom.to_arrays(prefix="bloom_")
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:  # a file object, so numpy adds no .npz to the name
                np.savez(f, header=np.frombuffer(header, dtype=np.uint8), **arrays)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: str | Path) -> NgramIndex:
        """Read an index that `save` wrote."""
        try:
            with np.load(path, allow_pickle=False) as f:
                arrays = dict(f)
            header = json.loads(arrays.pop("header").tobytes())
        except (OSError, ValueError, KeyError) as e:
            raise LmforgeError(f"{path} is not an n-gram index file ({e}): rebuild it") from e
        if header.get("format") != _FORMAT or header.get("version") != _VERSION:
            raise LmforgeError(
                f"{path} holds {header.get('format')} version {header.get('version')}, "
                f"not {_FORMAT} version {_VERSION}: rebuild it with this lmforge"
            )
        index = cls.__new__(cls)
        index.n = int(header["n"])
        index.bloom = BloomFilter.from_arrays(arrays, prefix="bloom_")
        return index

    def _grams(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """The n-gram hashes of `texts` and per-text offsets into them (see `ngram_hashes`)."""
        buf, starts = encode([_NORMALIZER(text) for text in texts])
        words, word_offsets = word_hashes(_SYMBOL_TO_SPACE[buf], starts, lowercase=False)
        return ngram_hashes(words, word_offsets, self.n, short="whole")

    def _insert(self, grams: np.ndarray) -> None:
        for lo in range(0, len(grams), _INSERT_BATCH):
            chunk = grams[lo : lo + _INSERT_BATCH]
            self.bloom.add_hashes(chunk, _second_hash(chunk))


def contamination(index: NgramIndex, examples: Sequence[str]) -> ContaminationResult:
    """Which of a task's `examples` share an n-gram with the index, and what fraction that is."""
    flagged = np.flatnonzero(index.matching_counts(examples))
    n_examples = len(examples)
    return ContaminationResult(
        fraction=len(flagged) / n_examples if n_examples else 0.0,
        n_contaminated=len(flagged),
        n_examples=n_examples,
        contaminated_indices=tuple(int(i) for i in flagged),
    )


def _batches(texts: Iterable[str]) -> Iterator[list[str]]:
    """`texts` in lists of about `_BATCH_CHARS` characters (a longer text is a batch of its own)."""
    batch: list[str] = []
    size = 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= _BATCH_CHARS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _second_hash(grams: np.ndarray) -> np.ndarray:
    return fmix64(grams ^ _SALT)


def _distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values, sorted (a sort, which is far faster than np.unique on uint64 here)."""
    values = np.sort(values)
    return values[np.concatenate(([True], values[1:] != values[:-1]))] if len(values) else values
