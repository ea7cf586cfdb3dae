"""How many CPU threads torch computes with: asked for (`--threads`, `LMFORGE_THREADS`), or, in
training, chosen by timing the first steps.

All cores is not always fastest: on a loaded machine the cores are shared, and two threads
that wait on each other can lose to one (on a 2-core host under load: 440-810 tokens/s with 2
threads against about 1,000 with 1). `ThreadTrial` is the choice: a few steps at torch's
default count (all cores, or `OMP_NUM_THREADS`), then a few at half of it, a quarter, ... while
each halving is faster, keeping the fastest. It is pure bookkeeping over measured step times;
the loop sets the count. Nothing here imports torch until a count is applied.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
from collections.abc import Iterator

from lmforge.errors import LmforgeError

ENV = "LMFORGE_THREADS"
TRIAL_STEPS = 3
"""Steps timed at each candidate count (after the run's first, which pays one-off costs)."""


def env_threads() -> int | None:
    """The count `LMFORGE_THREADS` asks for, or None when it is unset or empty."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise LmforgeError(f"{ENV}={raw!r} is not a thread count: set it to 1 or more, or unset it")
    return n


def requested_threads(threads: int | None = None) -> tuple[int | None, str]:
    """The count asked for and by whom: `threads` (the --threads flag), else LMFORGE_THREADS;
    (None, "") when neither is given and training may choose."""
    if threads is not None:
        if threads < 1:
            raise LmforgeError(f"--threads {threads}: give 1 or more")
        return threads, "--threads"
    n = env_threads()
    return (n, ENV) if n is not None else (None, "")


def apply_env_threads() -> int | None:
    """Make every command honour LMFORGE_THREADS: torch reads OMP_NUM_THREADS when it loads."""
    n = env_threads()
    if n is not None:
        os.environ["OMP_NUM_THREADS"] = str(n)
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(n)
    return n


@contextlib.contextmanager
def using_threads(n: int) -> Iterator[None]:
    """torch computes with `n` threads inside the block, with the previous count after it."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def halvings(start: int) -> list[int]:
    """The candidate counts: `start`, then halved down to 1 (8 → 8, 4, 2, 1)."""
    counts = [max(1, start)]
    while counts[-1] > 1:
        counts.append(counts[-1] // 2)
    return counts


class ThreadTrial:
    """Choose a thread count from timed steps: `threads` is the count for the next step;
    `record` takes that step's time; `chosen` is set once the choice is made."""

    def __init__(self, start: int, steps: int = TRIAL_STEPS) -> None:
        self.candidates = halvings(start)
        self.steps = steps
        self.times: dict[int, list[float]] = {}
        self._index = 0
        self.chosen: int | None = None if len(self.candidates) > 1 else self.candidates[0]

    @property
    def threads(self) -> int:
        return self.chosen if self.chosen is not None else self.candidates[self._index]

    def record(self, seconds: float) -> None:
        if self.chosen is not None:
            return
        count = self.candidates[self._index]
        self.times.setdefault(count, []).append(seconds)
        if len(self.times[count]) < self.steps:
            return
        previous = self.candidates[self._index - 1] if self._index else None
        slower = previous is not None and self.step_time(count) >= self.step_time(previous)
        if slower or self._index == len(self.candidates) - 1:
            self.chosen = min(self.times, key=lambda n: (self.step_time(n), -n))
        else:
            self._index += 1

    def step_time(self, count: int) -> float:
        """The median time of the steps timed at `count` threads."""
        return statistics.median(self.times[count])

    def describe(self) -> str:
        """The choice and its evidence, e.g. `1 (ms per step: 2 threads 812, 1 thread 540)`, or
        `1 (the only candidate, not timed)`."""
        if not self.times:
            return f"{self.threads} (the only candidate, not timed)"
        timed = ", ".join(
            f"{n} thread{'' if n == 1 else 's'} {self.step_time(n) * 1000:.0f}" for n in self.times
        )
        return f"{self.threads} (ms per step: {timed})"
