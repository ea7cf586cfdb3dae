"""How many steps a wall-clock budget holds, measured as the run goes.

A budgeted run fixes its step count from its first timed steps (`steps_in_budget`); a WSD run
then re-fits it to the time actually left (`refit`), from the recent wall time per step
(`StepClock`: everything between two steps' starts, logging included, less the periodic
validations and checkpoints, which are counted apart at their own measured cost).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from lmforge.train.config import TrainConfig
from lmforge.train.schedule import Schedule


class StepClock:
    """Each step's start and the pauses (validation, checkpoints) after it, this session."""

    def __init__(self, clock: Callable[[], float]):
        self.clock = clock
        self.starts: list[float] = []
        self.pauses: list[float] = []
        self.evals: list[float] = []  # each periodic validation's seconds

    def step_started(self) -> None:
        self.starts.append(self.clock())
        self.pauses.append(0.0)

    @contextlib.contextmanager
    def pause(self, validation: bool = False) -> Iterator[None]:
        t0 = self.clock()
        yield
        seconds = self.clock() - t0
        if self.pauses:
            self.pauses[-1] += seconds
        if validation:
            self.evals.append(seconds)

    def recent_step_s(self, window: int) -> float:
        """The mean wall time of the last `window` steps, pauses left out."""
        marks = [*self.starts[-window:], self.clock()]
        pauses = self.pauses[-window:]
        return (marks[-1] - marks[0] - sum(pauses)) / len(pauses)

    def eval_s(self) -> float | None:
        return sum(self.evals) / len(self.evals) if self.evals else None


def steps_in_budget(
    cfg: TrainConfig, per_step: float, remaining_s: float, step: int, eval_s: float | None = None
) -> int:
    """Total steps that fit the remaining budget at `per_step` seconds, counting the periodic
    validations and the closing one that ends every run (`eval_s` each where measured, else a
    forward pass ≈ 1/3 of a step per batch)."""
    if eval_s is None:
        eval_s = cfg.eval_batches * per_step / (3 * cfg.grad_accum_steps)
    evals = eval_s / cfg.eval_every if cfg.eval_every else 0.0
    return step + max(1, int((remaining_s - eval_s) / (per_step + evals)))


def refit(
    cfg: TrainConfig,
    schedule: Schedule,
    per_step: float,
    eval_s: float | None,
    remaining_s: float,
    step: int,
) -> int:
    """A budgeted WSD run's step count for the time left: on the plateau what fits (when it
    differs by more than 1 %: timing noise re-plans nothing); once decaying, the planned end
    unless it no longer fits."""
    fits = steps_in_budget(cfg, per_step, remaining_s, step, eval_s)
    total = schedule.total or fits
    if schedule.decaying(step):
        return min(total, max(fits, step + 1))
    return fits if abs(fits - total) > max(1, total // 100) else total
