"""The engine's sampler: one token per row of logits, each row with its own request's settings.

`SamplingBatch` stacks the settings of the requests in a step as (n, 1) columns, once per change
of the set of requests; `sample` then filters and draws for all rows at once. Each request draws
from its own random generator, so a seeded request gives the same tokens whatever else is
batched with it. Penalties read each request's own history of seen and generated tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from lmforge.infer.sampling import apply_penalties, draw, filter_logits


class Sampled(Protocol):
    """What the sampler asks of a request."""

    params: Any  # lmforge.infer.engine.SamplingParams
    seen: torch.Tensor | None  # (V,) bool: tokens in its prompt or output, for penalties
    counts: torch.Tensor | None  # (V,) float: how often it generated each token

    def uniform(self) -> float: ...


@dataclass
class SamplingBatch:
    """The sampling settings of some requests as (n, 1) columns; None: no row uses it."""

    requests: list[Sampled]
    temperature: torch.Tensor  # 1 where greedy, to divide safely
    unit_temperature: bool  # every row's is 1: nothing to divide
    sampled: list[int]  # rows that sample (temperature > 0); the others take the argmax
    sampled_rows: torch.Tensor  # the same, as an index tensor
    top_k: torch.Tensor | None
    top_p: torch.Tensor | None
    min_p: torch.Tensor | None
    penalties: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    logprobs: bool
    top_n: int  # the most top_logprobs any row asks for

    @classmethod
    def of(cls, requests: list[Sampled], vocab_size: int, device: torch.device) -> SamplingBatch:
        params = [r.params for r in requests]

        def column(values: list[Any], dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device)[:, None]

        def optional(values: list[Any], off: Any, dtype=torch.float32) -> torch.Tensor | None:
            sampled = [v for v, p in zip(values, params, strict=True) if p.temperature > 0]
            if all(v is None or v == off for v in sampled):
                return None
            return column([off if v is None else v for v in values], dtype)

        penalties = None
        if any(p.penalised for p in params):
            penalties = (
                column([p.repetition_penalty for p in params]),
                column([p.frequency_penalty for p in params]),
                column([p.presence_penalty for p in params]),
            )
        sampled = [i for i, p in enumerate(params) if p.temperature > 0]
        return cls(
            requests=requests,
            temperature=column([p.temperature or 1.0 for p in params]),
            unit_temperature=all(p.temperature in (0, 1) for p in params),
            sampled=sampled,
            sampled_rows=torch.tensor(sampled, dtype=torch.long, device=device),
            top_k=optional([p.top_k for p in params], vocab_size, torch.long),
            top_p=optional([p.top_p for p in params], 1.0),
            min_p=optional([p.min_p for p in params], 0.0),
            penalties=penalties,
            logprobs=any(p.logprobs for p in params),
            top_n=max(p.top_logprobs if p.logprobs else 0 for p in params),
        )


def sample(logits: torch.Tensor, batch: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One token per row of logits (n, vocab), and the rows' log-probabilities when a request
    asks for them."""
    logits = logits.float()
    logprobs = logits.log_softmax(dim=-1) if batch.logprobs else None
    if batch.penalties is not None:
        seen, counts = _history(batch.requests, logits)
        logits = apply_penalties(logits, seen, counts, *batch.penalties)
    every_row = len(batch.sampled) == len(batch.requests)
    tokens = torch.empty(0) if every_row else logits.argmax(dim=-1)
    if batch.sampled:
        scaled = logits if batch.unit_temperature else logits / batch.temperature
        scaled = filter_logits(scaled, batch.top_k, batch.top_p, batch.min_p)
        # Inverse-CDF sampling: one uniform from each request's own generator (drawing a whole
        # row of noise, or multinomial, per request costs ~100x more on a CPU).
        u = torch.tensor([batch.requests[i].uniform() for i in batch.sampled], device=logits.device)
        if every_row:
            tokens = draw(scaled, u)
        else:
            tokens[batch.sampled_rows] = draw(scaled[batch.sampled_rows], u)
    if batch.penalties is not None:
        for request, token in zip(batch.requests, tokens, strict=True):
            if request.seen is not None:
                request.seen[token] = True
                request.counts[token] += 1
    return tokens, logprobs


def _history(requests: list[Sampled], logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, vocab) seen and counts; rows of requests without penalties stay empty."""
    seen = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
    counts = torch.zeros(logits.shape, device=logits.device)
    for i, request in enumerate(requests):
        if request.seen is not None:
            seen[i], counts[i] = request.seen, request.counts
    return seen, counts
