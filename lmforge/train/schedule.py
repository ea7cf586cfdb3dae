"""The learning-rate schedule: linear warmup, then cosine decay to a floor, as a pure function.

A run's length can change when it resumes (`--max-steps` past a finished run's end, or a new
`--minutes` budget). The schedule then gets a new plan from that step: a short linear re-warm
from the learning rate the old plan had there to the one a run planned for the new length has
a few steps later, then that run's cosine to the floor. Continuing a finished run of 100 steps
to 200 thus re-warms from the floor to about half the peak, and its last 90 steps follow the
200-step schedule. The plans are saved with each checkpoint, so the learning rate stays a
pure function of the step and a resumed extension repeats exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


def lr_at(step: int, max_lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> float:
    """Learning rate for optimizer step `step` (0-based) of `total_steps`."""
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= total_steps:
        return min_lr
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * progress))


OPEN_HORIZON = 10**9
"""The total while a budgeted run's step count is not yet fixed: only warmup applies."""


def rewarm_steps(start: int, total: int, warmup_steps: int) -> int:
    """Steps of the linear re-warm of a plan that starts at `start`: a tenth of the steps it
    adds, at most the warmup's length, at least 1."""
    return max(1, min(warmup_steps, (total - start) // 10))


@dataclass
class Schedule:
    max_lr: float
    min_lr: float
    warmup_steps: int
    plans: list[tuple[int, int]] = field(default_factory=list)  # (first step, total steps)

    @property
    def total(self) -> int | None:
        return self.plans[-1][1] if self.plans else None

    def plan(self, step: int, total: int) -> None:
        """From `step` on, run to `total` steps (a new plan unless it changes nothing)."""
        if not self.plans or step == 0:
            self.plans = [(0, total)]
        elif total != self.total:
            if self.plans[-1][0] == step:  # re-planned again before any step of the last plan
                self.plans.pop()
            self.plans.append((step, total))

    def lr(self, step: int) -> float:
        if not self.plans:
            return lr_at(step, self.max_lr, self.min_lr, self.warmup_steps, OPEN_HORIZON)
        index = max(i for i, (start, _) in enumerate(self.plans) if start <= step)
        return self._lr(index, step)

    def _lr(self, index: int, step: int) -> float:
        start, total = self.plans[index]
        curve = lr_at(step, self.max_lr, self.min_lr, self.warmup_steps, total)
        if index == 0:
            return curve
        rewarm = rewarm_steps(start, total, self.warmup_steps)
        if step >= start + rewarm:
            return curve
        begin = self._lr(index - 1, start)
        end = lr_at(start + rewarm, self.max_lr, self.min_lr, self.warmup_steps, total)
        return begin + (end - begin) * (step - start + 1) / (rewarm + 1)
