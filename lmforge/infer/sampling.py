"""Choosing the next token from logits: penalties, temperature, top-k, top-p, min-p, sampling.

Each transform works on a batch of logits (B, V) with one setting per row, given as a (B, 1)
tensor, so the engine applies every request's own settings in one vectorised pass.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lmforge.errors import LmforgeError
from lmforge.kernels import cpu_decode

CDF_BLOCK = 64  # tokens per block of inverse_cdf's first level


def check_sampling_args(
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    min_p: float | None = None,
) -> None:
    if not temperature >= 0:
        raise LmforgeError(f"temperature={temperature} is invalid: use 0 (greedy) or above")
    if top_k is not None and top_k < 1:
        raise LmforgeError(f"top_k={top_k} is invalid: use an integer >= 1, or None to disable")
    if top_p is not None and not 0 < top_p <= 1:
        raise LmforgeError(f"top_p={top_p} is invalid: use a value in (0, 1], or None to disable")
    if min_p is not None and not 0 <= min_p <= 1:
        raise LmforgeError(f"min_p={min_p} is invalid: use a value in [0, 1], or None to disable")


def apply_penalties(
    logits: torch.Tensor,
    seen: torch.Tensor,
    counts: torch.Tensor,
    repetition: torch.Tensor,
    frequency: torch.Tensor,
    presence: torch.Tensor,
) -> torch.Tensor:
    """Discourage tokens already present.

    Repetition (CTRL, as Hugging Face applies it): a seen token's (prompt or output) logit is
    divided by the penalty when positive and multiplied by it when negative. Frequency and
    presence (OpenAI): subtract frequency · count and presence · [count > 0], counting
    generated tokens only. seen is bool (B, V), counts float (B, V), each penalty (B, 1).
    """
    penalised = torch.where(logits > 0, logits / repetition, logits * repetition)
    logits = torch.where(seen, penalised, logits)
    return logits - frequency * counts - presence * (counts > 0)


def mask_top_k(logits: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Keep each row's k (B, 1) largest logits (and any tied with the k-th); -inf elsewhere."""
    k = k.clamp(max=logits.shape[-1])
    kth = logits.topk(int(k.max()), dim=-1).values.gather(-1, k - 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def mask_top_p(logits: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Keep each row's smallest set of most likely tokens whose probability reaches p (B, 1)."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    sorted_logits = sorted_logits.masked_fill(mass_before >= p, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def mask_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Keep tokens whose probability is at least min_p (B, 1) times the row's largest."""
    probs = logits.softmax(dim=-1)
    floor = min_p * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(probs < floor, float("-inf"))


def filter_logits(
    logits: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    min_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """Apply top-k, then top-p, then min-p (each skipped when None), after temperature."""
    if top_k is not None:
        logits = mask_top_k(logits, top_k)
    if top_p is not None:
        logits = mask_top_p(logits, top_p)
    if min_p is not None:
        logits = mask_min_p(logits, min_p)
    return logits


def draw(logits: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Each row's token (n,) at quantile u (n,) in [0, 1) of softmax(logits) (n, V), -inf where
    masked: lmforge's CPU kernel, which reads the logits in place, where it runs; else the
    weights e^(logits - max) through `inverse_cdf`."""
    if logits.device.type == "cpu" and (isa := cpu_decode.isa_for()):
        return cpu_decode.sample_rows(logits, u, isa)
    return inverse_cdf((logits - logits.amax(dim=-1, keepdim=True)).exp(), u)


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Each row's token (n,) whose share of the row's weights (n, V), unnormalised and >= 0,
    holds u (n,) in [0, 1): the first token whose cumulative weight exceeds u times the total.

    In two levels: the block of CDF_BLOCK tokens that holds it (the blocks' sums, cumulated),
    then the token within that block, so only a block of each row is cumulated token by token
    (a full-row cumsum is a serial pass over the vocabulary: 4 of a 5 ms step's sampling, 512
    rows of 4096 tokens)."""
    n, vocab = weights.shape
    blocks = -(-vocab // CDF_BLOCK)
    if blocks * CDF_BLOCK != vocab:
        weights = F.pad(weights, (0, blocks * CDF_BLOCK - vocab))
    tokens = weights.view(n, blocks, CDF_BLOCK)
    block_cdf = tokens.sum(-1).cumsum(-1)
    target = (u * block_cdf[:, -1])[:, None]
    block = torch.searchsorted(block_cdf, target, right=True).clamp(max=blocks - 1)
    before = torch.where(block > 0, block_cdf.gather(-1, (block - 1).clamp(min=0)), 0.0)
    within = tokens.gather(1, block[:, :, None].expand(n, 1, CDF_BLOCK))[:, 0].cumsum(-1)
    token = torch.searchsorted(within, target - before, right=True).clamp(max=CDF_BLOCK - 1)
    return (block * CDF_BLOCK + token)[:, 0].clamp(max=vocab - 1)


def sample_next_token(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    min_p: float | None = None,
) -> torch.Tensor:
    """One token id per row of logits (B, V), as a LongTensor (B,)."""
    check_sampling_args(temperature, top_k, top_p, min_p)
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    b = logits.shape[0]

    def column(value: float | None, dtype: torch.dtype) -> torch.Tensor | None:
        return (
            None if value is None else torch.full((b, 1), value, dtype=dtype, device=logits.device)
        )

    logits = filter_logits(
        logits,
        column(top_k, torch.long),
        column(top_p if top_p is not None and top_p < 1 else None, logits.dtype),
        column(min_p, logits.dtype),
    )
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
