"""The learning-rate schedule: warmup, then warmup-stable-decay (WSD) or cosine, as a pure function.

Both shapes size their phases as fractions of the run: warmup is `warmup_frac` of it (at most
`warmup_steps`); WSD holds the peak, then decays linearly to the floor over its last
`decay_frac`; cosine decays from the end of warmup to the floor.

A run's length can change while it runs (a budgeted WSD run re-fits its step count to the
time actually left, so a machine that slows down still gets a full cooldown) and when it
resumes (`--max-steps` past a finished run's end, or a new `--minutes` budget). Each change is a
horizon `(first step, total steps)`, kept in a list saved with every checkpoint, so the learning
rate stays a pure function of the step and a resumed run repeats it exactly:
- a new total that leaves every step taken so far unchanged (a WSD run still on its plateau)
  edits the last horizon instead of adding one;
- a horizon that starts inside its own decay (a WSD run shortened while cooling down) decays
  linearly from the learning rate it has there to the floor at its new end;
- any other horizon re-warms linearly from the learning rate the old horizon had there to the new
  horizon's curve a few steps later, then follows it. Continuing a finished run of 100 steps to
  200 thus re-warms from the floor, and its last steps follow the 200-step schedule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

SCHEDULES = ("wsd", "cosine")

OPEN_HORIZON = 10**9
"""The total while a budgeted run's step count is not yet fixed: only warmup applies."""


def lr_at(step: int, max_lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> float:
    """The cosine schedule's learning rate for optimizer step `step` (0-based) of
    `total_steps`, after `warmup_steps` of linear warmup."""
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= total_steps:
        return min_lr
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * progress))


def wsd_lr_at(
    step: int, max_lr: float, min_lr: float, warmup_steps: int, decay_start: int, total_steps: int
) -> float:
    """The WSD schedule's learning rate: linear warmup, the peak until `decay_start`, then a
    linear decay that would reach `min_lr` one step after the last (the last step still
    learns)."""
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= total_steps:
        return min_lr
    if step < decay_start:
        return max_lr
    return max_lr + (min_lr - max_lr) * (step - decay_start + 1) / (total_steps - decay_start + 1)


def rewarm_steps(start: int, total: int, warmup_steps: int) -> int:
    """Steps of the linear re-warm of a horizon that starts at `start`: a tenth of the steps it
    adds, at most the warmup's length, at least 1."""
    return max(1, min(warmup_steps, (total - start) // 10))


Horizon = tuple[int, int]  # (the step it was set at, the step the run decays to)


@dataclass
class Schedule:
    max_lr: float
    min_lr: float
    warmup_steps: int  # the longest warmup; a short run warms up for warmup_frac of its steps
    kind: str = "wsd"
    warmup_frac: float = 1.0
    decay_frac: float = 0.2  # WSD: the share of the run spent decaying
    horizons: list[Horizon] = field(default_factory=list)

    @property
    def total(self) -> int | None:
        return self.horizons[-1][1] if self.horizons else None

    def warmup(self, total: int) -> int:
        return max(1, min(self.warmup_steps, math.ceil(self.warmup_frac * total)))

    def decay_start(self, total: int) -> int:
        """The first step of a `total`-step run's decay (WSD; cosine decays after warmup)."""
        if self.kind == "cosine":
            return self.warmup(total)
        return max(self.warmup(total), total - max(1, round(self.decay_frac * total)))

    def decaying(self, step: int) -> bool:
        """Whether `step` lies in the current horizon's decay."""
        return self.total is not None and step >= self.decay_start(self.total)

    def run_to(self, step: int, total: int) -> None:
        """From `step` on, run to `total` steps."""
        if step == 0:
            self.horizons = [(0, total)]
            return
        horizons = self.horizons or [(0, OPEN_HORIZON)]
        if total == horizons[-1][1]:
            return
        edited = [*horizons[:-1], (horizons[-1][0], total)]
        taken = range(horizons[-1][0], step)
        if all(_lr(self, edited, s) == _lr(self, horizons, s) for s in taken):
            self.horizons = edited
        else:
            self.horizons = [*horizons, (step, total)]

    def lr(self, step: int) -> float:
        return _lr(self, self.horizons or [(0, OPEN_HORIZON)], step)

    def curve(self, step: int, total: int) -> float:
        """The learning rate of a run planned for `total` steps from its start."""
        warmup = self.warmup(total)
        if self.kind == "cosine":
            return lr_at(step, self.max_lr, self.min_lr, warmup, total)
        return wsd_lr_at(step, self.max_lr, self.min_lr, warmup, self.decay_start(total), total)

    def describe_horizon(self) -> str:
        """The current horizon's phases in steps, for the log."""
        total = self.total or OPEN_HORIZON
        start = self.horizons[-1][0] if self.horizons else 0
        if self.kind == "cosine":
            return f"cosine to step {total}"
        decay = self.decay_start(total)
        if start >= decay and start > 0:
            return f"linear decay from step {start} to {total}"
        return f"peak until step {decay}, then linear decay to {total}"


def _lr(schedule: Schedule, horizons: list[Horizon], step: int) -> float:
    index = max(i for i, (start, _) in enumerate(horizons) if start <= step)
    start, total = horizons[index]
    if index == 0:
        return schedule.curve(step, total)
    begin = _lr(schedule, horizons[:index], start)
    if schedule.kind == "wsd" and start >= schedule.decay_start(total):
        if step >= total:
            return schedule.min_lr
        return begin + (schedule.min_lr - begin) * (step - start + 1) / (total - start + 1)
    rewarm = rewarm_steps(start, total, schedule.warmup(total))
    if step >= start + rewarm:
        return schedule.curve(step, total)
    end = schedule.curve(start + rewarm, total)
    return begin + (end - begin) * (step - start + 1) / (rewarm + 1)
