"""Choosing the next token from logits: greedy, temperature, top-k and top-p (nucleus)."""

from __future__ import annotations

import torch

from lmforge.errors import LmforgeError


def check_sampling_args(temperature: float, top_k: int | None, top_p: float | None) -> None:
    if not temperature >= 0:
        raise LmforgeError(f"temperature={temperature} is invalid: use 0 (greedy) or above")
    if top_k is not None and top_k < 1:
        raise LmforgeError(f"top_k={top_k} is invalid: use an integer >= 1, or None to disable")
    if top_p is not None and not 0 < top_p <= 1:
        raise LmforgeError(f"top_p={top_p} is invalid: use a value in (0, 1], or None to disable")


def sample_next_token(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """One token id per row of logits (B, V), as a LongTensor (B,)."""
    check_sampling_args(temperature, top_k, top_p)
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        keep = torch.zeros_like(logits, dtype=torch.bool)
        keep.scatter_(-1, logits.topk(top_k, dim=-1).indices, True)
        logits = logits.masked_fill(~keep, float("-inf"))
    if top_p is not None and top_p < 1:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        sorted_logits = sorted_logits.masked_fill(mass_before >= top_p, float("-inf"))
        logits = torch.empty_like(logits).scatter_(-1, order, sorted_logits)
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
