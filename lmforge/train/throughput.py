"""Throughput between log lines: tokens/s, step time and MFU over the steps since the last reset."""

from __future__ import annotations

import time

import torch

from lmforge.train.mfu import mfu


class Throughput:
    def __init__(
        self, tokens_per_step: int, flops_per_token: float, peak: float, device: torch.device
    ) -> None:
        self.tokens_per_step = tokens_per_step
        self.flops_per_token = flops_per_token
        self.peak = peak
        self.device = device
        self.reset()

    def reset(self) -> None:
        """Start a new window (after a log line, or after time spent outside training)."""
        self.start, self.steps = time.perf_counter(), 0

    def step(self) -> None:
        self.steps += 1

    def read(self) -> dict[str, float]:
        """The window's numbers; waits for the device to finish the queued steps."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - self.start
        tokens_per_s = self.steps * self.tokens_per_step / seconds
        return {
            "tokens_per_s": round(tokens_per_s, 1),
            "step_time_s": round(seconds / self.steps, 4),
            "mfu": round(mfu(self.flops_per_token, tokens_per_s, self.peak), 4),
        }
