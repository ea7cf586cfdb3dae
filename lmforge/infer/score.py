"""Log-likelihoods of continuations: what task evaluation and the server's `echo` scoring ask of a
model, computed with each distinct context prefilled once.

A request is (context ids, continuation ids). Requests that share a context (the choices of a
multiple-choice question) are one group: the context runs through the model once, batched with
other groups' contexts (right-padded: a causal model's real tokens never see the padding after
them), and its keys and values are then copied to one row per continuation, which runs at that
row's own positions (`RowCache`). A 4-choice question costs one context and four continuations,
where scoring each (context + continuation) whole costs four contexts.

The first continuation token is predicted by the context's last logits, the rest by the
continuation's own. Log-probabilities are log_softmax in fp32; `greedy` says whether each token
was the argmax (lm-eval's `is_greedy` is all of them); `top` lists the `top_n` most likely ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from lmforge.errors import LmforgeError

if TYPE_CHECKING:
    from lmforge.model.transformer import Transformer

BATCH_TOKENS = 4096  # context tokens per forward pass, padding included
CONTINUATION_ROWS = 16  # continuations per forward pass, grouped by length


@dataclass
class TokenScores:
    """The scores of one continuation, one entry per continuation token."""

    logprobs: list[float]
    greedy: list[bool]
    top: list[list[tuple[int, float]]] | None = None  # (id, logprob), most likely first

    @property
    def total(self) -> float:
        return sum(self.logprobs)

    @property
    def is_greedy(self) -> bool:
        return all(self.greedy)


class RowCache:
    """A KV cache whose rows each continue from their own position (the model's Cache protocol).

    Row b writes T new keys at positions pos[b] .. pos[b]+T-1 and attends to its keys 0 ..
    pos[b]+t; what lies beyond a row's own positions (another row's longer context) is masked
    by attention, given per-row positions.
    """

    def __init__(
        self, k: list[torch.Tensor], v: list[torch.Tensor], pos: int | torch.Tensor
    ) -> None:
        self.k, self.v, self.pos = k, v, pos
        self._rows = torch.arange(k[0].shape[0], device=k[0].device)[:, None]

    @classmethod
    def empty(cls, model: Transformer, batch_size: int, length: int) -> RowCache:
        """A cache whose rows all start at position 0: its first forward pass attends causally
        (SDPA's fused causal kernel), as an int position tells attention."""
        c, weight = model.config, model.tok_embeddings.weight
        shape = (batch_size, c.kv_heads, length, c.head_dim)
        k = [weight.new_zeros(shape) for _ in range(c.n_layers)]
        v = [weight.new_zeros(shape) for _ in range(c.n_layers)]
        return cls(k, v, 0)

    def rows(self, index: torch.Tensor, length: int) -> RowCache:
        """A cache of the rows `index` (repeats allowed), with room for `length` positions."""

        def take(t: torch.Tensor) -> torch.Tensor:
            out = t.new_zeros((len(index), t.shape[1], length, t.shape[3]))
            keep = min(length, t.shape[2])
            out[:, :, :keep] = t[index, :, :keep]
            return out

        return RowCache([take(k) for k in self.k], [take(v) for v in self.v], 0)

    def _last(self) -> int:
        return self.pos if isinstance(self.pos, int) else int(self.pos.max())

    def check_fits(self, batch_size: int, n_new: int) -> None:
        rows, length = self.k[0].shape[0], self.k[0].shape[2]
        if batch_size != rows or self._last() + n_new > length:
            raise LmforgeError(
                f"{batch_size} x {n_new} new tokens do not fit a row cache of {rows} "
                f"rows x {length} positions"
            )

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        t = k.shape[2]
        if isinstance(self.pos, int):  # every row at the same position
            end = self.pos + t
            self.k[layer][:, :, self.pos : end] = k
            self.v[layer][:, :, self.pos : end] = v
            return self.k[layer][:, :, :end], self.v[layer][:, :, :end]
        at = self.pos[:, None] + torch.arange(t, device=k.device)  # (B, T)
        self.k[layer][self._rows, :, at] = k.transpose(1, 2)
        self.v[layer][self._rows, :, at] = v.transpose(1, 2)
        end = int(self.pos.max()) + t
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def advance(self, n: int) -> None:
        self.pos = self.pos + n


def score(
    model: Transformer,
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    top_n: int = 0,
    batch_tokens: int = BATCH_TOKENS,
) -> list[TokenScores]:
    """The scores of each request's continuation given its context, in request order.

    Every context needs at least one token, and context + continuation but its last token must
    fit the model's context window (callers left-truncate, as lm-eval does, before they get
    here).
    """
    limit = model.config.max_seq_len
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, (context, continuation) in enumerate(requests):
        if not context:
            raise LmforgeError(
                f"request {i} has an empty context: start it with a token (lm-eval uses the "
                "end-of-text token)"
            )
        if len(context) + len(continuation) - 1 > limit:  # the last token is never input
            raise LmforgeError(
                f"request {i} has {len(context) + len(continuation)} tokens, more than the "
                f"model's {limit}-token context holds (+1, the last token is only predicted): "
                "left-truncate its context"
            )
        groups.setdefault(tuple(context), []).append(i)
    results: list[TokenScores | None] = [None] * len(requests)
    ordered = sorted(groups.items(), key=lambda g: -len(g[0]))  # similar lengths batch together
    longest = [max(len(requests[i][1]) for i in indices) for _, indices in ordered]
    with torch.inference_mode():
        for batch in _batches(ordered, longest, batch_tokens, limit):
            for i, scores in _score_batch(model, batch, requests, top_n):
                results[i] = scores
    return results  # type: ignore[return-value]


def _batches(
    groups: list[tuple[tuple[int, ...], list[int]]],
    longest: list[int],
    batch_tokens: int,
    limit: int,
) -> list[list[tuple[tuple[int, ...], list[int]]]]:
    """Groups (longest context first) cut into batches of at most `batch_tokens` padded context
    tokens, each within the context window when its longest context meets its longest
    continuation (the padded positions still need rotary positions)."""
    batches, current, width, tail = [], [], 0, 0
    for group, cont in zip(groups, longest, strict=True):
        if current and (
            (len(current) + 1) * width > batch_tokens or width + max(tail, cont) - 1 > limit
        ):
            batches.append(current)
            current = []
        if not current:
            width, tail = len(group[0]), 0
        current.append(group)
        tail = max(tail, cont)
    return [*batches, current] if current else batches


def _score_batch(
    model: Transformer,
    groups: list[tuple[tuple[int, ...], list[int]]],
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    top_n: int,
) -> list[tuple[int, TokenScores]]:
    device = model.tok_embeddings.weight.device
    lengths = [len(context) for context, _ in groups]
    width = max(lengths)
    ids = torch.zeros(len(groups), width, dtype=torch.long, device=device)
    for row, (context, _) in enumerate(groups):
        ids[row, : len(context)] = torch.tensor(context)
    cache = RowCache.empty(model, len(groups), width)
    last = torch.tensor(lengths, device=device) - 1
    first_logprobs = model(ids, kv_cache=cache, logits_at=last)[:, 0].float().log_softmax(-1)

    members = [(row, i) for row, (_, indices) in enumerate(groups) for i in indices]
    # Continuations run longest first in chunks of similar length, so little is padding.
    members.sort(key=lambda m: -len(requests[m[1]][1]))
    out = []
    for start in range(0, len(members), CONTINUATION_ROWS):
        chunk = members[start : start + CONTINUATION_ROWS]
        rest = len(requests[chunk[0][1]][1]) - 1
        rest_logprobs = None
        if rest > 0:
            index = torch.tensor([row for row, _ in chunk], device=device)
            rows = cache.rows(index, int(last[index].max()) + 1 + rest)
            rows.pos = last[index] + 1
            cont = torch.zeros(len(chunk), rest, dtype=torch.long, device=device)
            for r, (_, i) in enumerate(chunk):
                tail = list(requests[i][1][:-1])
                cont[r, : len(tail)] = torch.tensor(tail, dtype=torch.long)
            rest_logprobs = model(cont, kv_cache=rows).float().log_softmax(-1)
        for r, (row, i) in enumerate(chunk):
            continuation = list(requests[i][1])
            if not continuation:
                out.append((i, TokenScores([], [], [] if top_n else None)))
                continue
            steps = [first_logprobs[row][None]]
            if len(continuation) > 1:
                steps.append(rest_logprobs[r, : len(continuation) - 1])
            out.append((i, _token_scores(torch.cat(steps), continuation, top_n)))
    return out


def _token_scores(logprobs: torch.Tensor, tokens: list[int], top_n: int) -> TokenScores:
    """Scores of `tokens` under per-position log-probabilities (len(tokens), vocab)."""
    target = torch.tensor(tokens, device=logprobs.device)
    chosen = logprobs.gather(1, target[:, None])[:, 0]
    greedy = logprobs.argmax(-1) == target
    top = None
    if top_n:
        values, ids = logprobs.topk(top_n, dim=-1)
        top = [
            list(zip(row_ids, row_values, strict=True))
            for row_ids, row_values in zip(ids.tolist(), values.tolist(), strict=True)
        ]
    return TokenScores(chosen.tolist(), greedy.tolist(), top)
