"""A fastText-style quality classifier: logistic regression on hashed word n-grams, in numpy.

    model = train_classifier(positive, negative, epochs=5, lr=0.2, buckets=2**20, ngrams=2, seed=0)
    model.score(text) -> float            # P(text looks like the positive, "target", set)
    model.score_batch(texts) -> np.ndarray
    model.save("quality.safetensors")     # weights + JSON settings in one safetensors file
    Classifier.load("quality.safetensors")

Features are the word unigrams up to `ngrams`-grams of a text (words as in
`lmforge.data.hashing`: split on whitespace, ASCII lowercased), hashed into `buckets` slots and
counted; each text's count vector is scaled to unit length. The model is a weight per bucket
plus a bias, trained with AdaGrad on the logistic loss in minibatches, the classes weighted to
count equally however many texts each has. Training and scoring are whole-batch numpy.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from lmforge.data.hashing import encode, ngram_hashes, segment_ids, word_hashes
from lmforge.errors import LmforgeError
from lmforge.weights_file import honour_umask

FORMAT = "lmforge-hashed-ngram-classifier/1"


@dataclass(frozen=True)
class Features:
    """Hashed n-gram settings; a saved model carries them."""

    buckets: int = 1 << 20
    ngrams: int = 2
    lowercase: bool = True


@dataclass
class Sparse:
    """Rows of unit-length feature vectors: row r is `index/value[indptr[r]:indptr[r+1]]`."""

    indptr: np.ndarray
    index: np.ndarray
    value: np.ndarray

    def rows(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(row position within `rows`, bucket, value) of every entry of the given rows."""
        lengths = self.indptr[rows + 1] - self.indptr[rows]
        total = int(lengths.sum())
        ends = np.cumsum(lengths)
        at = np.arange(total) + np.repeat(self.indptr[rows] - (ends - lengths), lengths)
        owner = np.repeat(np.arange(len(rows)), lengths)
        return owner, self.index[at], self.value[at]


def featurize(texts: Sequence[str], features: Features, group_chars: int = 1 << 18) -> Sparse:
    """The feature vectors of `texts`, computed in groups of about `group_chars` characters."""
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    lo = 0
    while lo < len(texts):
        hi, size = lo, 0
        while hi < len(texts) and (hi == lo or size < group_chars):
            size += len(texts[hi])
            hi += 1
        parts.append(_featurize_group(texts[lo:hi], features))
        lo = hi
    if not parts:
        return Sparse(np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32))
    counts = np.concatenate([p[0] for p in parts])
    indptr = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return Sparse(
        indptr, np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts])
    )


def _featurize_group(
    texts: Sequence[str], features: Features
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    buf, starts = encode(texts)
    words, offsets = word_hashes(buf, starts, features.lowercase)
    owners, buckets = [], []
    for n in range(1, features.ngrams + 1):
        grams, gram_offsets = ngram_hashes(words, offsets, n, short="drop")
        owners.append(segment_ids(gram_offsets))
        buckets.append((grams % np.uint64(features.buckets)).astype(np.int64))
    key = np.concatenate(owners) * features.buckets + np.concatenate(buckets)
    key, count = np.unique(key, return_counts=True)
    owner, bucket = key // features.buckets, key % features.buckets
    per_text = np.bincount(owner, minlength=len(texts))
    norm = np.sqrt(np.bincount(owner, weights=count.astype(np.float64) ** 2, minlength=len(texts)))
    value = (count / norm[owner]).astype(np.float32)
    return per_text, bucket, value


class Classifier:
    """Logistic regression over hashed n-gram features: `score` is P(positive | text)."""

    def __init__(self, weights: np.ndarray, bias: float, features: Features) -> None:
        if len(weights) != features.buckets:
            raise ValueError(f"{len(weights)} weights for {features.buckets} buckets")
        self.weights = weights.astype(np.float32)
        self.bias = float(bias)
        self.features = features

    def score(self, text: str) -> float:
        return float(self.score_batch([text])[0])

    def score_batch(self, texts: Sequence[str]) -> np.ndarray:
        """P(positive) for every text, float64."""
        x = featurize(texts, self.features)
        return _sigmoid(_logits(x, np.arange(len(texts)), self.weights, self.bias))

    def save(self, path: str | Path) -> None:
        settings = {"format": FORMAT, "bias": self.bias, **asdict(self.features)}
        save_file({"weights": self.weights}, str(path), metadata={"lmforge": json.dumps(settings)})
        honour_umask(path)

    @classmethod
    def load(cls, path: str | Path) -> Classifier:
        try:
            with safe_open(str(path), framework="numpy") as f:
                settings = json.loads((f.metadata() or {}).get("lmforge", "{}"))
                weights = f.get_tensor("weights")
        except (OSError, ValueError, SafetensorError) as e:
            raise LmforgeError(f"{path} is not a readable safetensors file: {e}") from e
        if settings.get("format") != FORMAT:
            raise LmforgeError(
                f"{path} is not an lmforge classifier: train one with lmforge data train-classifier"
            )
        features = Features(settings["buckets"], settings["ngrams"], settings["lowercase"])
        return cls(weights, settings["bias"], features)


def train_classifier(
    positive: Iterable[str],
    negative: Iterable[str],
    epochs: int = 5,
    lr: float = 0.2,
    buckets: int = 1 << 20,
    ngrams: int = 2,
    seed: int = 0,
    batch_size: int = 32,
    l2: float = 1e-6,
    lowercase: bool = True,
) -> Classifier:
    """Fit a classifier telling `positive` texts (label 1) from `negative` ones (label 0)."""
    pos, neg = list(positive), list(negative)
    if not pos or not neg:
        raise LmforgeError("training a classifier needs positive and negative texts: give both")
    features = Features(buckets, ngrams, lowercase)
    x = featurize(pos + neg, features)
    y = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
    sample_weight = np.where(y == 1, len(y) / (2 * len(pos)), len(y) / (2 * len(neg)))
    weights = np.zeros(buckets, dtype=np.float32)
    squares = np.zeros(buckets, dtype=np.float32)
    bias, bias_square = 0.0, 0.0
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        order = rng.permutation(len(y))
        for lo in range(0, len(order), batch_size):
            rows = order[lo : lo + batch_size]
            error = (_sigmoid(_logits(x, rows, weights, bias)) - y[rows]) * sample_weight[rows]
            owner, bucket, value = x.rows(rows)
            touched, inverse = np.unique(bucket, return_inverse=True)
            grad = np.bincount(inverse, weights=error[owner] * value) / len(rows)
            grad += l2 * weights[touched]
            squares[touched] += grad**2
            weights[touched] -= lr * grad / (np.sqrt(squares[touched]) + 1e-8)
            bias_grad = float(error.mean())
            bias_square += bias_grad**2
            bias -= lr * bias_grad / (bias_square**0.5 + 1e-8)
    return Classifier(weights, bias, features)


def _logits(x: Sparse, rows: np.ndarray, weights: np.ndarray, bias: float) -> np.ndarray:
    owner, bucket, value = x.rows(rows)
    return bias + np.bincount(owner, weights=weights[bucket] * value, minlength=len(rows))


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))
