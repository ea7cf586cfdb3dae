"""The reference training recipes benchmarks/bench_recipe.py compares lmforge's with.

Each module rewrites one public recipe from its source (what it keeps and leaves out is in its
docstring) behind the same small surface, so one budget loop and one evaluator serve both:

    run = build(vocab_size, seed=..., dtype=...)       # model and optimizer, as the recipe sets
    run.set_iterations(n)                              # the planned step count, for the schedule
    loss = run.step(it, batch)                         # one optimizer step; batch() -> (x, y)
    run.model(ids) -> logits (B, T, vocab)             # what the evaluator reads
    run.context, run.batch_size                        # window length and windows per batch

Batches for both are nanoGPT's get_batch: random windows of the flat token stream.
"""

from __future__ import annotations

import numpy as np
import torch


def random_batch(
    tokens: np.ndarray, batch_size: int, context: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """`batch_size` windows of `context` + 1 tokens at uniformly random starts: inputs and the
    targets one token on (nanoGPT train.py, get_batch)."""
    starts = torch.randint(len(tokens) - context, (batch_size,), generator=generator).tolist()
    window = np.stack([np.asarray(tokens[s : s + context + 1]) for s in starts])
    window = torch.from_numpy(window.astype(np.int64))
    return window[:, :-1].contiguous(), window[:, 1:].contiguous()


def autocast(dtype: torch.dtype | None):
    """bf16 autocast on the CPU when `dtype` is given, else fp32 (a disabled context)."""
    return torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None)
