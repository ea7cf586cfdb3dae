"""A command's wall-clock budget: one clock, started when the command starts, passed down.

`lmforge train --minutes M` promises that the whole command takes M minutes: start-up, sizing,
training and the closing validation all spend the same budget. The command creates one
`BudgetClock`; every stage that spends the budget reads it (`elapsed`, `remaining`), and work the
budget does not hold (the one-off, cached data preparation) runs inside `excluded()`. A resumed
run adds the seconds its earlier sessions spent (`resumed_from`).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator


class BudgetClock:
    """Seconds spent on a budget since the command started, less the excluded spans."""

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self.now = now  # the clock's reading: what every timing on this budget uses
        self._start = now()
        self._excluded = 0.0
        self._prior = 0.0

    def elapsed(self) -> float:
        """Seconds this run has spent: earlier sessions' (when resumed) and this command's."""
        return self._prior + self.now() - self._start - self._excluded

    def remaining(self, minutes: float) -> float:
        """Seconds left of a `minutes` budget (infinite when `minutes` is 0: no budget)."""
        return minutes * 60 - self.elapsed() if minutes > 0 else math.inf

    def resumed_from(self, prior_seconds: float) -> None:
        """Count `prior_seconds` that the run's earlier sessions spent (a resumed run)."""
        self._prior = prior_seconds

    @contextlib.contextmanager
    def excluded(self) -> Iterator[None]:
        """Time spent inside the block does not count against the budget."""
        t0 = self.now()
        try:
            yield
        finally:
            self._excluded += self.now() - t0
