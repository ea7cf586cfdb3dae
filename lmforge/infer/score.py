"""Log-likelihoods of continuations: what task evaluation and the server's `echo` scoring ask of a
model, computed with each distinct context run once.

A request is (context ids, continuation ids). Requests that share a context (the choices of a
multiple-choice question) are one group, packed into one row as a tree: the context is the
trunk and each continuation a branch that attends to the context and to itself alone, at the
positions it would have after the context (`Transformer(ids, branches=...)`). A 4-choice
question costs one context and four continuations in one forward pass, where scoring each
(context + continuation) whole costs four contexts; no keys or values are copied, and rows of
similar length (longest first) fill each batch. Only the positions that predict a
continuation token reach the output head.

The first continuation token is predicted by the context's last position, the rest by the
continuation's own. Log-probabilities are log_softmax in fp32; `greedy` says whether each token
was the argmax (lm-eval's `is_greedy` is all of them); `top` lists the `top_n` most likely ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from lmforge.errors import LmforgeError

if TYPE_CHECKING:
    from lmforge.model.transformer import Transformer

BATCH_TOKENS = 4096  # tokens per forward pass, padding included


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


@dataclass
class _Tree:
    """One row's contents: a context and the requests continuing it, each continuation's
    inputs (all but its last token) a branch after the context."""

    context: tuple[int, ...]
    length: int  # context + branches
    requests: list[int] = field(default_factory=list)


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
    check_requests(requests, limit)
    trees: dict[tuple[int, ...], list[_Tree]] = {}
    for i, (context, continuation) in enumerate(requests):
        key = tuple(context)
        branch = max(len(continuation) - 1, 0)
        row = trees.setdefault(key, [])
        # A row holds at most two context windows, so attention per token stays bounded.
        if not row or row[-1].length + branch > 2 * limit:
            row.append(_Tree(key, len(key)))
        row[-1].requests.append(i)
        row[-1].length += branch
    ordered = sorted((t for row in trees.values() for t in row), key=lambda t: -t.length)
    results: list[TokenScores | None] = [None] * len(requests)
    with torch.inference_mode():
        for start, stop in _batches([t.length for t in ordered], batch_tokens):
            for i, scores in _score_rows(model, ordered[start:stop], requests, top_n):
                results[i] = scores
    return results  # type: ignore[return-value]


def check_requests(requests: Sequence[tuple[Sequence[int], Sequence[int]]], limit: int) -> None:
    """Refuse a request with no context, or one too long for a `limit`-token context window."""
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


def _batches(lengths: list[int], batch_tokens: int) -> list[tuple[int, int]]:
    """(start, stop) slices of rows, longest first, each at most `batch_tokens` padded tokens
    (one row at least)."""
    out, start = [], 0
    while start < len(lengths):
        width = lengths[start]
        stop = start + max(1, batch_tokens // width)
        out.append((start, min(stop, len(lengths))))
        start = stop
    return out


def _score_rows(
    model: Transformer,
    trees: list[_Tree],
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    top_n: int,
) -> list[tuple[int, TokenScores]]:
    device = model.tok_embeddings.weight.device
    width = max(t.length for t in trees)
    ids = torch.zeros(len(trees), width, dtype=torch.long)
    branches = torch.zeros(len(trees), width, dtype=torch.long)
    segments = torch.zeros(len(trees), width, dtype=torch.long)
    offsets: list[list[int]] = []  # where each request's branch starts, after its context
    for row, tree in enumerate(trees):
        c = len(tree.context)
        ids[row, :c] = torch.tensor(tree.context)
        at, starts = c, []
        for branch, i in enumerate(tree.requests, start=1):
            tail = list(requests[i][1][:-1])
            ids[row, at : at + len(tail)] = torch.tensor(tail, dtype=torch.long)
            branches[row, at : at + len(tail)] = branch
            starts.append(at - c)
            at += len(tail)
        # padding: one-token documents of their own, so their positions stay in the window
        segments[row, at:] = torch.arange(1, width - at + 1)
        offsets.append(starts)
    # Each row's predicting positions run from its context's last token to its end.
    n = max(t.length - len(t.context) + 1 for t in trees)
    first = torch.tensor([len(t.context) - 1 for t in trees])
    logits_at = (first[:, None] + torch.arange(n)).clamp(max=width - 1)
    logits = model(
        ids.to(device),
        logits_at=logits_at.to(device),
        segments=segments.to(device),
        branches=branches.to(device),
    )
    out = []
    for row, (tree, starts) in enumerate(zip(trees, offsets, strict=True)):
        logprobs = logits[row].float().log_softmax(-1)
        for i, offset in zip(tree.requests, starts, strict=True):
            continuation = list(requests[i][1])
            if not continuation:
                out.append((i, TokenScores([], [], [] if top_n else None)))
                continue
            rest = logprobs[1 + offset : offset + len(continuation)]
            steps = torch.cat([logprobs[:1], rest])
            out.append((i, token_scores(steps, continuation, top_n)))
    return out


def token_scores(logprobs: torch.Tensor, tokens: list[int], top_n: int) -> TokenScores:
    """Scores of `tokens` under per-position log-probabilities (len(tokens), vocab): the
    first predicted by the context's last position, each next one by the token before it."""
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
