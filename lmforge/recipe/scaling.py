"""The scaling rule: final validation bits per byte as a function of parameters and tokens.

    bpb(N, D) = E + A / N**alpha + B / D**beta

Chinchilla's form (Hoffmann et al. 2022, approach 3), fitted on this codebase's own sweep
(`benchmarks/sweep_scaling.py`: the ladder of shapes, each trained for wall-clock budgets of
1 to 8 minutes with the recipe's optimizer and schedule on the built-in corpus). N counts
parameters as `shapes.Shape.params` does, D the tokens trained on. The fit is least squares
over a grid of exponents, with E, A and B solved exactly (and kept non-negative) for each:
no optimizer to start well, and the same answer every time.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from lmforge.atomic import write_json

RULE_FILE = Path(__file__).with_name("scaling_rule.json")
EXTRAPOLATION = 2.0


@dataclass(frozen=True)
class ScalingRule:
    E: float
    A: float
    alpha: float
    B: float
    beta: float
    rms_error: float = 0.0  # of the fit, in bits per byte
    points: int = 0
    swept_tokens: dict[str, int] = field(default_factory=dict)  # per shape, the most swept

    def trusted(self, shape: str, tokens: float) -> bool:
        """Whether `tokens` for `shape` lies within EXTRAPOLATION times the sweep's longest run
        of it: beyond, the rule has not seen the shape saturate (a small model's loss stops
        falling long before the power law says)."""
        return shape in self.swept_tokens and tokens <= EXTRAPOLATION * self.swept_tokens[shape]

    def bpb(self, params: float, tokens: float) -> float:
        return self.E + self.A / params**self.alpha + self.B / max(tokens, 1.0) ** self.beta

    def save(self, path: Path = RULE_FILE) -> None:
        write_json(path, asdict(self))


def load_rule(path: Path = RULE_FILE) -> ScalingRule:
    return ScalingRule(**json.loads(path.read_text()))


def fit(
    params: list[float], tokens: list[float], bpb: list[float], shapes: list[str] = ()
) -> ScalingRule:
    """The least-squares rule through (N, D, bpb) points (of `shapes`, when named)."""
    n, d, y = (np.asarray(v, dtype=np.float64) for v in (params, tokens, bpb))
    best = None
    exponents = np.round(np.arange(0.02, 1.0001, 0.01), 2)
    for alpha, beta in itertools.product(exponents, exponents):
        x = np.stack([np.ones_like(y), n**-alpha, d**-beta], axis=1)
        coef = _nonnegative_lstsq(x, y)
        err = float(np.sqrt(np.mean((x @ coef - y) ** 2)))
        if best is None or err < best[0]:
            best = (err, coef, alpha, beta)
    err, (e, a, b), alpha, beta = best
    swept = {}
    for shape, t in zip(shapes, tokens, strict=False):
        swept[shape] = max(swept.get(shape, 0), int(t))
    return ScalingRule(float(e), float(a), float(alpha), float(b), float(beta), err, len(y), swept)


def _nonnegative_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with E, A, B >= 0: the plain solution, else the best with some of them
    fixed at zero (three columns: every subset is cheap to try)."""
    best, best_err = np.zeros(3), np.inf
    for keep in itertools.chain.from_iterable(
        itertools.combinations(range(3), k) for k in (3, 2, 1)
    ):
        keep = list(keep)
        coef = np.zeros(3)
        coef[keep] = np.linalg.lstsq(x[:, keep], y, rcond=None)[0]
        if (coef < 0).any():
            continue
        err = float(np.sum((x @ coef - y) ** 2))
        if err < best_err:
            best, best_err = coef, err
    return best
