"""Task metrics and their standard errors, as lm-eval and nanochat's CORE define them.

- A mean of per-example scores (accuracy, exact match, pass@k) has lm-eval's standard error:
  the sample standard deviation (n - 1) over the square root of n.
- Perplexities and bits per byte are ratios of sums over documents (lm-eval's weighted
  perplexity), so their error is bootstrapped over documents with a fixed seed.
- `centered` is CORE's: (accuracy - baseline) / (1 - baseline), 0 at chance, 1 when perfect.
- `numeric_answer` reads GSM8K's answers: the number after `####`, else the last number.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence

BOOTSTRAP_SAMPLES = 200
_FINAL = re.compile(r"####\s*(-?[\d,]*\.?\d+)")
_NUMBER = re.compile(r"-?[\d,]*\.?\d+")


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def mean_stderr(values: Sequence[float]) -> float:
    n = len(values)
    if n < 2:
        return float("nan")
    m = mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1) / n)


def ratio_bootstrap(
    numerators: Sequence[float], denominators: Sequence[float], fn, seed: int = 1234
) -> float:
    """The bootstrap standard error of fn(sum numerators / sum denominators) over documents."""
    n = len(numerators)
    if n < 2:
        return float("nan")
    rng = random.Random(seed)
    draws = []
    for _ in range(BOOTSTRAP_SAMPLES):
        picks = [rng.randrange(n) for _ in range(n)]
        total = sum(denominators[i] for i in picks)
        draws.append(fn(sum(numerators[i] for i in picks) / total))
    return math.sqrt(mean([(d - mean(draws)) ** 2 for d in draws]) * n / (n - 1))


def centered(accuracy: float, baseline: float) -> float:
    return (accuracy - baseline) / (1 - baseline) if baseline < 1 else float("nan")


def numeric_answer(text: str) -> str | None:
    """The final numeric answer of a text: after `####` if it has one, else its last number;
    commas dropped and a trailing `.0` removed, so 1,000 and 1000.0 agree."""
    found = _FINAL.search(text)
    if found:
        number = found.group(1)
    else:
        numbers = _NUMBER.findall(text)
        if not numbers:
            return None
        number = numbers[-1]
    number = number.replace(",", "")
    try:
        value = float(number)
    except ValueError:
        return None
    return str(int(value)) if value.is_integer() else str(value)


def count_words(text: str) -> int:
    """lm-eval's word count for word perplexity."""
    return len(re.split(r"\s+", text))
