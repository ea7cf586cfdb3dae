"""The CPU thread count a run computes with: given, or chosen by timing its first steps.

A single process on the CPU given no count tries a few (lmforge.threads.ThreadTrial) and keeps
the fastest; the step times at the final count (`settled`) are what a time budget is fixed
from. The session's first step pays one-off costs, so no timing uses it.
"""

from __future__ import annotations

import torch

from lmforge.parallel.world import World
from lmforge.threads import ThreadTrial


class ThreadTuner:
    def __init__(self, given: tuple[int | None, str], device: torch.device, world: World) -> None:
        threads, self.source = given
        if threads is not None:
            torch.set_num_threads(threads)
        self.trial = None
        if threads is None and device.type == "cpu" and not world.is_distributed:
            self.trial = ThreadTrial(torch.get_num_threads())
            self.source = "" if self.trial.chosen is None else "torch's default"
        self.settled: list[float] = []  # step times at the final thread count
        self.steps = 0  # steps timed this session

    @property
    def trying(self) -> bool:
        return self.trial is not None and self.trial.chosen is None

    def before_step(self) -> None:
        if self.trying:
            torch.set_num_threads(self.trial.threads)

    def after_step(self, seconds: float) -> bool:
        """Record a step's time; True when this step's time ended the trial."""
        self.steps += 1
        if self.steps == 1:
            return False  # the first step pays one-off costs
        if not self.trying:
            self.settled.append(seconds)
            return False
        self.trial.record(seconds)
        if self.trial.chosen is None:
            return False
        torch.set_num_threads(self.trial.chosen)
        self.settled = list(self.trial.times[self.trial.chosen])
        return True

    def describe(self) -> str:
        return self.trial.describe() if self.trial is not None else str(torch.get_num_threads())
