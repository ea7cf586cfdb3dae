"""Beam search: the k most likely continuations under a length penalty, with their scores.

A hypothesis scores sum(log p) / length**length_penalty (GNMT, as Hugging Face applies it;
length counts generated tokens, a stop token included). Running beams are ranked by their raw
log-probability sum; a beam ends when it emits a stop id or reaches max_tokens, and the k best
ended hypotheses are returned. Exhaustive search is not offered: its cost grows as
vocab_size ** max_tokens.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from lmforge.errors import LmforgeError
from lmforge.model.cache import KVCache

if TYPE_CHECKING:
    from lmforge.model.transformer import Transformer


@dataclass
class Beam:
    token_ids: list[int]  # generated tokens, a final stop id included
    logprob: float  # their summed log-probability
    score: float  # logprob / len(token_ids) ** length_penalty


def score(logprob: float, length: int, length_penalty: float) -> float:
    return logprob / length**length_penalty


@torch.inference_mode()
def beam_search(
    model: Transformer,
    prompt_ids: list[int],
    *,
    num_beams: int,
    max_tokens: int,
    length_penalty: float = 1.0,
    stop_ids: Collection[int] = (),
) -> list[Beam]:
    """The num_beams best continuations of prompt_ids, best first."""
    if num_beams < 1 or max_tokens < 1:
        raise LmforgeError(
            f"num_beams={num_beams}, max_tokens={max_tokens}: both must be at least 1"
        )
    if not prompt_ids or len(prompt_ids) + max_tokens > model.config.max_seq_len:
        raise LmforgeError(
            f"prompt of {len(prompt_ids)} tokens + max_tokens={max_tokens} must be 1 .. "
            f"{model.config.max_seq_len} (the model's context): shorten one of them"
        )
    model.eval()
    device = model.tok_embeddings.weight.device
    cache = KVCache.for_model(model, 1, max_seq_len=len(prompt_ids) + max_tokens)
    logits = model(torch.tensor([prompt_ids], device=device), cache, last_only=True)[:, -1]
    stops = torch.tensor(sorted(set(stop_ids)), dtype=torch.long, device=device)
    running: list[list[int]] = [[]]
    sums = torch.zeros(1, device=device)
    ended: list[Beam] = []

    def end(b: int, token: int) -> None:
        ids, logprob = [*running[b], token], float(totals[b, token])
        ended.append(Beam(ids, logprob, score(logprob, len(ids), length_penalty)))

    for step in range(1, max_tokens + 1):
        totals = sums[:, None] + logits.float().log_softmax(dim=-1)  # (beams, vocab)
        for b, s in _candidates(totals[:, stops], num_beams):
            end(b, int(stops[s]))
        totals[:, stops] = float("-inf")
        keep = _candidates(totals, num_beams)
        if step == max_tokens or not keep:
            for b, t in keep:
                end(b, t)
            break
        ended = _best(ended, num_beams)
        rows = torch.tensor([b for b, _ in keep], device=device)
        tokens = torch.tensor([[t] for _, t in keep], device=device)
        running = [running[b] + [t] for b, t in keep]
        sums = totals[rows, tokens[:, 0]]
        cache = KVCache.from_buffers(
            [k[rows] for k in cache.k], [v[rows] for v in cache.v], cache.pos
        )
        logits = model(tokens, cache)[:, -1]
    return _best(ended, num_beams)


def _candidates(totals: torch.Tensor, k: int) -> list[tuple[int, int]]:
    """(beam, token) of the k largest finite entries of totals (beams, n)."""
    values, flat = totals.flatten().topk(min(k, totals.numel()))
    n = totals.shape[-1]
    pairs = zip(values.tolist(), flat.tolist(), strict=True)
    return [(i // n, i % n) for v, i in pairs if v > float("-inf")]


def _best(beams: list[Beam], k: int) -> list[Beam]:
    return sorted(beams, key=lambda b: b.score, reverse=True)[:k]
