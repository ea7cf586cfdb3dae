"""Loading a text scorer for the classifier slots: lmforge's own classifier or a fastText model.

A scorer maps a text to a number in [0, 1]. A path ending in `.bin` or `.ftz` is a fastText
model (needs the `fasttext` package, imported only then) scored as the probability of `label`;
anything else is a model saved by `lmforge data train-classifier`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from lmforge.errors import LmforgeError

Scorer = Callable[[str], float]


def load_scorer(path: str, label: str = "__label__1") -> Scorer:
    if not Path(path).exists():
        raise LmforgeError(f"classifier model {path} does not exist: train one or fix the path")
    if path.endswith((".bin", ".ftz")):
        return _fasttext_scorer(path, label)
    from lmforge.data.classifier import Classifier

    return Classifier.load(path).score


def _fasttext_scorer(path: str, label: str) -> Scorer:
    try:
        import fasttext
    except ImportError as e:
        raise LmforgeError(f"{path} is a fastText model: pip install fasttext to use it") from e
    model = fasttext.load_model(path)

    def score(text: str) -> float:
        labels, probs = model.predict(text.replace("\n", " "), k=-1)
        return float(dict(zip(labels, probs, strict=True)).get(label, 0.0))

    return score
