"""Scoring over the engine's paged KV cache, so that contexts which begin alike compute their
common beginning once and reuse what the prefix cache already holds.

Evaluation contexts often share a long beginning: a few-shot task puts the same examples
before every question, a chat evaluation the same system prompt. lmforge.infer.score packs
each distinct context with its continuations into one row, a tree, so it computes every
context whole. Here a context that has a full block (lmforge.infer.blocks) in common with
another context of the job, or with a block the pool has cached, goes over the engine's cache:

1. each prefix of full blocks that two or more contexts share is computed once, shortest first
   (a longer one then reuses a shorter one's blocks), and registered in the prefix cache;
2. each context takes its cached blocks and computes the rest in one row with its
   continuations (all but their last tokens) as branches after it, the same tree as
   score.py's, continuing the cache (`Transformer(..., branches=...)` with a kv_cache); rows of
   several contexts fill each forward. The context's last position predicts each
   continuation's first token.

The context's keys and values go into its blocks, and its full blocks stay cached for later
requests and jobs; its branches' land past its end, in its private last block or the null
block, which nothing reads. Contexts with nothing shared or cached keep score.py's trees,
which compute the same row without gathering a cache; so do contexts the pool has no free
blocks for while the engine's requests hold them, and contexts that fill the model's window
(no position is left after them for a padding branch).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import torch

from lmforge.infer.scheduler import Sequence as Tokens
from lmforge.infer.score import (
    BATCH_TOKENS,
    TokenScores,
    check_requests,
    score,
    token_scores,
)

if TYPE_CHECKING:
    from lmforge.infer.runner import ModelRunner
    from lmforge.infer.scheduler import Scheduler

Requests = Sequence[tuple[Sequence[int], Sequence[int]]]


class Companion(Protocol):
    """What else must see every chunk the model computes (the draft model's cache)."""

    def prefill(self, seq: Tokens, start: int, end: int) -> None: ...

    def forget(self, seq: Tokens) -> None: ...


def score_over_cache(
    runner: ModelRunner,
    scheduler: Scheduler,
    requests: Requests,
    top_n: int = 0,
    batch_tokens: int = BATCH_TOKENS,
    companion: Companion | None = None,
) -> list[TokenScores]:
    """The scores of each request's continuation given its context, in request order, as
    `score(runner.model, ...)` gives them (to float rounding)."""
    check_requests(requests, runner.model.config.max_seq_len)
    job = _Job(runner, scheduler, requests, top_n, batch_tokens, companion)
    if scheduler.prefix_caching:
        with torch.inference_mode():
            for chunk in job.chunks(job.reusable()):
                job.run(chunk)
    alone = [i for c, owners in job.owners.items() if c not in job.done for i in owners]
    scored = score(runner.model, [requests[i] for i in alone], top_n, batch_tokens)
    for i, scores in zip(alone, scored, strict=True):
        job.results[i] = scores
    return job.results  # type: ignore[return-value]


class _Job:
    """One scoring job's contexts over the cache: what they share, and their results."""

    def __init__(
        self,
        runner: ModelRunner,
        scheduler: Scheduler,
        requests: Requests,
        top_n: int,
        batch_tokens: int,
        companion: Companion | None,
    ) -> None:
        self.runner, self.scheduler, self.pool = runner, scheduler, scheduler.pool
        self.requests, self.top_n, self.batch_tokens = requests, top_n, batch_tokens
        self.companion = companion
        self.results: list[TokenScores | None] = [None] * len(requests)
        self.owners: dict[tuple[int, ...], list[int]] = {}  # context -> its requests
        for i, (context, _) in enumerate(requests):
            self.owners.setdefault(tuple(context), []).append(i)
        self.done: set[tuple[int, ...]] = set()  # contexts scored here
        self._reused: dict[Tokens, int] = {}  # blocks each context should find cached

    def reusable(self) -> list[Tokens]:
        """The contexts worth computing over the cache, after computing (and caching) every
        prefix of full blocks that two or more of them share."""
        size = self.pool.block_size
        limit = self.runner.model.config.max_seq_len
        seqs = [Tokens(list(c)) for c in self.owners if len(c) < limit]
        keys = [s.block_keys((len(s.tokens) - 1) // size, size) for s in seqs]
        counts = Counter(k for row in keys for k in row)
        prefixes: dict[int, list[int]] = {}
        for seq, row in zip(seqs, keys, strict=True):
            # A chain hash covers every block before it, so a key's count is at least that of
            # every key after it: the shared keys are a run from the first.
            shared = sum(counts[k] > 1 for k in row)
            cached = self.pool.cached_run(row)
            if shared > cached:
                prefixes[row[shared - 1]] = seq.tokens[: shared * size]
            if max(shared, cached):
                self._reused[seq] = max(shared, cached)
        for tokens in sorted(prefixes.values(), key=len):
            prefix = Tokens(tokens)
            if self._admit([prefix], logits=False) and prefix.pending:
                start = prefix.computed
                self.runner.extend([prefix.blocks], [start], [tokens[start:]])
                self._computed(prefix, start)
            self._release([prefix])
        return [seq for seq in seqs if seq in self._reused]

    def chunks(self, seqs: list[Tokens]) -> list[list[Tokens]]:
        """The contexts in groups whose uncached blocks take at most half the free pool (at
        least one context a group): each group's blocks are held until it is scored."""
        size = self.pool.block_size
        budget = max(1, self.pool.n_free // 2)
        out: list[list[Tokens]] = []
        used = 0
        for seq in seqs:
            need = -(-len(seq.tokens) // size) - self._reused[seq]
            if not out or used + need > budget:
                out.append([])
                used = 0
            out[-1].append(seq)
            used += need
        return out

    def run(self, seqs: list[Tokens]) -> None:
        """Score the requests of these contexts: each context's uncached tokens and its
        continuations in one tree row, several rows to a forward (`ModelRunner.forwards`)."""
        admitted = self._admit(seqs, logits=True)
        trees = [_Tree(seq, self.requests, self.owners[tuple(seq.tokens)]) for seq in admitted]
        lengths = [len(t.tokens) for t in trees]
        ends = [t.seq.computed + len(t.tokens) for t in trees]
        for group in self.runner.forwards(lengths, ends, self.batch_tokens):
            batch = [trees[i] for i in group]
            width = max(len(t.tokens) for t in batch)
            n = max(len(t.tokens) - t.trunk + 1 for t in batch)  # predicting positions
            first = torch.tensor([t.trunk - 1 for t in batch])
            logits_at = (first[:, None] + torch.arange(n)).clamp(max=width - 1)
            logits = self.runner.extend(
                [t.seq.blocks for t in batch],
                [t.seq.computed for t in batch],
                [t.tokens for t in batch],
                logits_at.to(self.runner.device),
                [t.branches for t in batch],
            )
            for tree, row in zip(batch, logits, strict=True):
                self._score(tree, row.float().log_softmax(-1))
                self._computed(tree.seq, tree.seq.computed)
                self.done.add(tuple(tree.seq.tokens))
        self._release(admitted)

    def _score(self, tree: _Tree, logprobs: torch.Tensor) -> None:
        """Each request's scores from its tree row's log-probabilities, which start at the
        context's last position."""
        for i, offset in zip(tree.requests, tree.offsets, strict=True):
            continuation = list(self.requests[i][1])
            if not continuation:
                self.results[i] = TokenScores([], [], [] if self.top_n else None)
                continue
            rest = logprobs[1 + offset : offset + len(continuation)]
            steps = torch.cat([logprobs[:1], rest])
            self.results[i] = token_scores(steps, continuation, self.top_n)

    def _admit(self, seqs: list[Tokens], logits: bool) -> list[Tokens]:
        """Give each sequence its cached blocks (all looked up before any block is taken, so
        none evicts another's), then blocks for the rest; those the pool cannot hold give
        theirs back and are left out. `logits`: keep the last token to compute."""
        size = self.pool.block_size
        for seq in seqs:
            cacheable = (len(seq.tokens) - 1 if logits else len(seq.tokens)) // size
            seq.blocks = self.pool.lookup(seq.block_keys(cacheable, size))
            seq.computed, seq.registered = len(seq.blocks) * size, len(seq.blocks)
        admitted = []
        for seq in seqs:
            blocks = self.pool.allocate(-(-len(seq.tokens) // size) - len(seq.blocks))
            if blocks is None:
                self.pool.release(seq.blocks)
                seq.blocks = []
                continue
            seq.blocks += blocks
            admitted.append(seq)
        return admitted

    def _computed(self, seq: Tokens, start: int) -> None:
        """seq's tokens from `start` on are in its blocks: offer its full ones to the prefix
        cache, and let the companion compute the same chunk."""
        self.scheduler.computed(seq, len(seq.tokens) - seq.computed)
        if self.companion is not None:
            self.companion.prefill(seq, start, len(seq.tokens))

    def _release(self, seqs: list[Tokens]) -> None:
        for seq in seqs:
            self.pool.release(seq.blocks)
            seq.blocks = []
            if self.companion is not None:
                self.companion.forget(seq)


class _Tree:
    """A context's row once admitted: its uncached tokens (the trunk), then each continuation
    but its last token as a branch; `offsets`: where each request's branch starts, counted from
    the trunk's end."""

    def __init__(self, seq: Tokens, requests: Requests, owners: list[int]) -> None:
        self.seq, self.requests = seq, owners
        self.trunk = len(seq.tokens) - seq.computed
        self.tokens = seq.tokens[seq.computed :]
        self.branches = [0] * self.trunk
        self.offsets: list[int] = []
        for branch, i in enumerate(owners, start=1):
            tail = list(requests[i][1][:-1])
            self.offsets.append(len(self.tokens) - self.trunk)
            self.tokens += tail
            self.branches += [branch] * len(tail)
