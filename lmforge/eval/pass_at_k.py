"""pass@k, the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained
on Code"), for scoring code generation from n samples per problem.

With n samples of which c pass, pass@k is the chance that k drawn without replacement contain
a passing one: 1 - C(n-c, k) / C(n, k). The ratio is computed as a product of n-c+1..n terms,
never as binomials, so it stays exact in floating point for n in the thousands.
"""

from __future__ import annotations

from collections.abc import Sequence

from lmforge.errors import LmforgeError


def pass_at_k(n: int, c: int, k: int) -> float:
    """The probability that at least one of k of the n samples (c of them correct) passes."""
    if not 0 <= c <= n:
        raise LmforgeError(f"pass@k needs 0 <= correct <= samples, got {c} correct of {n}")
    if not 1 <= k <= n:
        raise LmforgeError(f"pass@{k} needs 1 <= k <= samples, got k={k} with {n} samples")
    if n - c < k:
        return 1.0  # every draw of k includes a correct sample
    ratio = 1.0  # C(n-c, k) / C(n, k) = prod over i in (n-c, n] of (1 - k / i)
    for i in range(n - c + 1, n + 1):
        ratio *= 1.0 - k / i
    return 1.0 - ratio


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """pass@k averaged over problems, each given as (samples, correct)."""
    if not counts:
        raise LmforgeError("pass@k needs at least one problem's (samples, correct) counts")
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)
