"""Non-finite steps: skip them, count them and stop a run that keeps producing them.

A step whose loss or gradient norm is inf or NaN is decided bad on the device (the optimizer
then leaves the weights as they were, see optim.py); the host reads the counts only on log
steps, and stops the run once `max_bad_steps` bad steps have come in a row.
"""

from __future__ import annotations

from pathlib import Path

import torch

from lmforge.errors import LmforgeError


class Diverged(LmforgeError):
    """A run stopped because `max_bad_steps` steps in a row were non-finite (a user error: the
    CLI prints its one line, naming the last good checkpoint, and exits 2)."""


class NonFiniteGuard:
    def __init__(self, device: torch.device, max_bad_steps: int) -> None:
        self.max_bad_steps = max_bad_steps
        self.skipped = torch.zeros((), dtype=torch.int64, device=device)
        self.streak = torch.zeros((), dtype=torch.int64, device=device)
        self.longest = torch.zeros((), dtype=torch.int64, device=device)

    def check(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> torch.Tensor:
        """A 0-d bool tensor: whether this step must be skipped; updates the counts."""
        loss = loss.to(self.skipped.device)
        grad_norm = grad_norm.to(self.skipped.device)
        bad = ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
        self.skipped += bad
        self.streak.copy_((self.streak + 1) * bad)
        torch.maximum(self.longest, self.streak, out=self.longest)
        return bad

    def diverged(self) -> bool:
        """Whether `max_bad_steps` steps in a row were bad (reads the device)."""
        return int(self.longest) >= self.max_bad_steps

    def stop_if_diverged(
        self,
        step: int,
        last_good: Path | None,
        run: str = "training",
        lr_key: str = "train.optimizer.lr",
    ) -> None:
        """Raise `Diverged` once `max_bad_steps` steps in a row were bad (reads the device)."""
        if not self.diverged():
            return
        where = (
            f"the last good checkpoint is {last_good}"
            if last_good is not None
            else "no checkpoint was saved before it"
        )
        raise Diverged(
            f"{run} stopped at step {step}: {self.max_bad_steps} steps in a row had a non-finite "
            f"loss or gradient norm and were skipped; {where}: lower {lr_key} or change "
            "--precision, then resume from it (or start over with --fresh)"
        )

    def clean(self) -> bool:
        """Whether the latest step was good (reads the device)."""
        return int(self.streak) == 0

    def state_dict(self) -> dict:
        return {"skipped": self.skipped.clone(), "streak": self.streak.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.skipped.copy_(state["skipped"])
        self.streak.copy_(state["streak"])
        self.longest.copy_(state["streak"])
