"""Dynamic loss scaling for fp16: multiply the loss up, unscale the gradients, adapt the scale.

Every decision stays on the device: the scale halves after a step whose gradients overflowed
(the loop skips that step) and doubles after `growth_interval` clean steps in a row.
"""

from __future__ import annotations

import torch


class DynamicLossScaler:
    def __init__(
        self,
        device: torch.device | str,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 1000,
    ) -> None:
        self.scale = torch.tensor(init_scale, dtype=torch.float32, device=device)
        self.clean_steps = torch.zeros((), dtype=torch.int64, device=device)
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale

    def unscale_(self, grads: list[torch.Tensor]) -> None:
        if grads:
            torch._foreach_mul_(grads, (1.0 / self.scale).to(grads[0].device))

    def update(self, bad_step: torch.Tensor) -> None:
        """Back off after a non-finite step; grow after `growth_interval` clean ones."""
        bad = bad_step.to(self.scale.device)
        clean = torch.where(bad, 0, self.clean_steps + 1)
        grow = clean >= self.growth_interval
        factor = torch.where(
            bad,
            self.backoff_factor,
            torch.where(grow, self.growth_factor, 1.0),
        )
        self.scale.mul_(factor)
        self.clean_steps.copy_(torch.where(grow, 0, clean))

    def state_dict(self) -> dict:
        return {"scale": self.scale.clone(), "clean_steps": self.clean_steps.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.scale.copy_(state["scale"])
        self.clean_steps.copy_(state["clean_steps"])
