"""Blending datasets by weight: which dataset each global sequence slot draws from.

The choice is a smooth weighted round-robin: slot g goes to the dataset furthest behind its
share, the one maximising `weight * (g + 1) - taken`. It is a pure function of the counts
taken so far, so those counts are the whole blending state, and the realised mixture never
strays more than about one sequence per dataset from the weights.
"""

from __future__ import annotations

import numpy as np


def normalized(weights: list[float]) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    return w / w.sum()


def assign(weights: np.ndarray, taken: list[int], n: int) -> np.ndarray:
    """Dataset index of each of the next `n` slots, given the sequences `taken` per dataset."""
    if len(weights) == 1:
        return np.zeros(n, dtype=np.int64)
    w = [float(x) for x in weights]  # plain floats: numpy's per-call cost dominates tiny arrays
    counts = [float(c) for c in taken]
    g = sum(counts)
    out = np.empty(n, dtype=np.int64)
    for slot in range(n):
        g += 1
        deficits = [wi * g - ci for wi, ci in zip(w, counts, strict=True)]
        d = deficits.index(max(deficits))  # ties go to the lowest index
        counts[d] += 1
        out[slot] = d
    return out
