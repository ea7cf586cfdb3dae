"""How many steps a run takes: `max_steps`, or what a wall-clock budget holds, measured as the
run goes.

A budgeted run fixes its step count from its first timed steps (`steps_in_budget`); a WSD run
then re-fits it to the time actually left (`refit`), from the recent wall time per step
(`StepClock`: everything between two steps' starts, logging included, less the periodic
validations and checkpoints, which are counted apart at their own measured cost). `StepBudget`
is the trainer's component that does both and says when the run ends.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

from lmforge.budget_clock import BudgetClock
from lmforge.parallel.world import World
from lmforge.train.config import TrainConfig
from lmforge.train.schedule import Schedule, rewarm_steps

CALIBRATION_STEPS = 5
"""Budgeted runs time this many steps (after the first, which pays one-off costs) to fix their
step count; until then the horizon is open and only warmup applies."""

REFIT_EVERY = 10
REFIT_WINDOW = 10
"""A budgeted WSD run re-fits its step count to the time left every REFIT_EVERY steps, from
the wall time of its last REFIT_WINDOW steps: on the plateau both ways, in the decay only
shorter (the decay then ends sooner, from the learning rate it has reached)."""


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
        eval_s = cfg.eval.batches * per_step / (3 * cfg.grad_accum_steps)
    evals = eval_s / cfg.eval.every if cfg.eval.every else 0.0
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


class StepBudget:
    """The step count a run trains to (`total`, None until a budgeted run has timed its first
    steps) and whether it goes on. On many processes rank 0's timing decides, so that all ranks
    stop at the same step: the step count ends the run, not each rank's own clock."""

    def __init__(
        self,
        cfg: TrainConfig,
        schedule: Schedule,
        world: World,
        clock: BudgetClock,
        total: int | None,
        resumed: bool = False,
    ) -> None:
        self.cfg, self.schedule, self.world, self.clock = cfg, schedule, world, clock
        self.total, self.resumed = total, resumed
        self.budget_s = cfg.minutes * 60 if not cfg.max_steps else math.inf
        self.refits = cfg.schedule.kind == "wsd" and not cfg.max_steps
        self.step_clock = StepClock(clock.now)

    def continues(self, step: int) -> bool:
        if self.total is not None and step >= self.total:
            return False
        if self.world.is_distributed:
            return True
        return self.clock.elapsed() < self.budget_s or self._in_decay(step)

    def _in_decay(self, step: int) -> bool:
        """A refitted decay runs to its end: it was fitted to the time left, and is shortened
        if that runs out (cutting it would end the run above the floor)."""
        return self.refits and self.schedule.decaying(step)

    def after_step(self, step: int, settled: list[float], session_steps: int) -> str | None:
        """Fix or re-fit the step count after `step` from the step times at the final thread
        count (`settled`); what changed, to log, if anything did."""
        if self.total is None and len(settled) >= CALIBRATION_STEPS:
            return self._calibrate(step, sum(settled[-CALIBRATION_STEPS:]) / CALIBRATION_STEPS)
        if self.refits and self.total is not None and step % REFIT_EVERY == 0:
            # the session's first step paid one-off costs: never in the window
            per_step = self.step_clock.recent_step_s(min(REFIT_WINDOW, session_steps - 1))
            remaining = self.budget_s - self.clock.elapsed()
            fitted = refit(
                self.cfg, self.schedule, per_step, self.step_clock.eval_s(), remaining, step
            )
            fitted = self.world.from_main(fitted)
            if fitted != self.total:
                decaying = self.schedule.decaying(step)
                self.schedule.run_to(step, fitted)
                self.total = fitted
                if decaying:
                    return f"behind the time budget: the decay ends at step {fitted}"
        return None

    def _calibrate(self, step: int, per_step: float) -> str:
        remaining = self.budget_s - self.clock.elapsed()
        self.total = self.world.from_main(steps_in_budget(self.cfg, per_step, remaining, step))
        self.schedule.run_to(step, self.total)
        message = (
            f"time budget {self.cfg.minutes:g} min: training for {self.total} steps "
            f"({self.schedule.describe_horizon()})"
        )
        if self.resumed and len(self.schedule.horizons) > 1:  # resumed with a new budget
            message += "\n" + replanned_message(self.schedule, step)
        return message


def replanned_message(schedule: Schedule, step: int) -> str:
    """What a resumed run given a new length does from `step` on."""
    start, total = schedule.horizons[-1]
    if schedule.decaying(start):
        return f"training to step {total} from step {step}: {schedule.describe_horizon()}"
    rewarm = rewarm_steps(start, total, schedule.warmup(total))
    steps = f"{rewarm} step" + ("s" if rewarm > 1 else "")
    return (
        f"training to step {total} from step {step}: the learning rate re-warms over {steps} "
        f"to {schedule.lr(start + rewarm):.2e}, then follows a {total}-step run's schedule"
    )
