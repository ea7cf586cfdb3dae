"""Scoring over the engine's paged KV cache, so that contexts which begin alike compute their
common beginning once and reuse what the prefix cache already holds.

Evaluation contexts often share a long beginning: a few-shot task puts the same examples
before every question, a chat evaluation the same system prompt. lmforge.infer.score packs
each distinct context with its continuations into one row, so it computes every context whole.
Here a context that has a full block (lmforge.infer.blocks) in common with another context of
the job, or one the pool has cached, goes over the engine's cache instead:

1. each prefix of full blocks that two or more contexts share is computed once, shortest first
   (a longer one then reuses a shorter one's blocks), and registered in the prefix cache;
2. each context takes its cached blocks and computes only the rest, several contexts to a
   forward; its last position's logits predict its continuations' first tokens;
3. each continuation but its last token continues its context in a row of its own, reading the
   context's blocks; its keys and values serve that forward alone (`ModelRunner.extend` without
   commit: no one extends a scored continuation), so a context's rows share its blocks
   without copying them.

The full blocks computed here stay cached for later requests and jobs. Contexts with nothing
shared or cached keep score.py's trees: one forward computes them and their continuations
together, which nothing here would make cheaper. So do contexts the pool has no free blocks
for while the engine's requests hold them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import torch

from lmforge.infer.scheduler import Sequence as Tokens
from lmforge.infer.score import BATCH_TOKENS, TokenScores, check_requests, score, token_scores

if TYPE_CHECKING:
    from lmforge.infer.runner import ModelRunner
    from lmforge.infer.scheduler import Scheduler


class Companion(Protocol):
    """What else must see every chunk the model computes (the draft model's cache)."""

    def prefill(self, seq: Tokens, start: int, end: int) -> None: ...

    def forget(self, seq: Tokens) -> None: ...


def score_over_cache(
    runner: ModelRunner,
    scheduler: Scheduler,
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    top_n: int = 0,
    batch_tokens: int = BATCH_TOKENS,
    companion: Companion | None = None,
) -> list[TokenScores]:
    """The scores of each request's continuation given its context, in request order, as
    `score(runner.model, ...)` gives them (to float rounding)."""
    check_requests(requests, runner.model.config.max_seq_len)
    job = _Job(runner, scheduler, requests, top_n, batch_tokens, companion)
    if scheduler.prefix_caching:
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
        requests: Sequence[tuple[Sequence[int], Sequence[int]]],
        top_n: int,
        batch_tokens: int,
        companion: Companion | None,
    ) -> None:
        self.runner, self.scheduler, self.pool = runner, scheduler, scheduler.pool
        self.requests, self.top_n, self.batch_tokens = requests, top_n, batch_tokens
        self.companion = companion
        self.limit = runner.model.config.max_seq_len
        self.results: list[TokenScores | None] = [None] * len(requests)
        self.owners: dict[tuple[int, ...], list[int]] = {}
        for i, (context, _) in enumerate(requests):
            self.owners.setdefault(tuple(context), []).append(i)
        self.done: set[tuple[int, ...]] = set()  # contexts scored here
        self._reused: dict[tuple[int, ...], int] = {}  # blocks each context should find cached

    def reusable(self) -> list[Tokens]:
        """The contexts worth computing over the cache, after computing (and caching) every
        prefix of full blocks that two or more of them share."""
        size = self.pool.block_size
        seqs = [Tokens(list(c)) for c in self.owners]
        keys = [s.block_keys((len(s.tokens) - 1) // size, size) for s in seqs]
        counts = Counter(k for row in keys for k in row)
        prefixes: dict[int, list[int]] = {}
        out = []
        for seq, row in zip(seqs, keys, strict=True):
            # A chain hash covers every block before it, so a key's count is at least that of
            # every key after it: the shared keys are a run from the first.
            shared = sum(counts[k] > 1 for k in row)
            cached = self.pool.cached_run(row)
            if shared > cached:
                prefixes[row[shared - 1]] = seq.tokens[: shared * size]
            if max(shared, cached):
                self._reused[tuple(seq.tokens)] = max(shared, cached)
                out.append(seq)
        for tokens in sorted(prefixes.values(), key=len):
            prefix = Tokens(tokens)
            if self._admit([prefix], logits=False):
                self._prefill([prefix])
                self._release([prefix])
        return out

    def chunks(self, seqs: list[Tokens]) -> list[list[Tokens]]:
        """The contexts in groups whose uncached blocks take at most half the free pool (at
        least one context a group): each group's blocks are held until it is scored."""
        size = self.pool.block_size
        budget = max(1, self.pool.n_free // 2)
        out: list[list[Tokens]] = []
        used = 0
        for seq in seqs:
            need = -(-len(seq.tokens) // size) - self._reused[tuple(seq.tokens)]
            if not out or used + need > budget:
                out.append([])
                used = 0
            out[-1].append(seq)
            used += need
        return out

    def run(self, seqs: list[Tokens]) -> None:
        """Score the requests of these contexts, each context's cached blocks reused."""
        admitted = self._admit(seqs, logits=True)
        firsts = self._prefill(admitted)
        rows: list[tuple[Tokens, int]] = []  # (context, request) of each continuation row
        for seq in admitted:
            context = tuple(seq.tokens)
            self.done.add(context)
            for i in self.owners[context]:
                if len(self.requests[i][1]) > 1:
                    rows.append((seq, i))
        rest = self._extend_all(
            [seq.blocks for seq, _ in rows],
            [len(seq.tokens) for seq, _ in rows],
            [list(self.requests[i][1][:-1]) for _, i in rows],
            commit=False,
        )
        later = {i: logits for (_, i), logits in zip(rows, rest, strict=True)}
        for seq, first in zip(admitted, firsts, strict=True):
            for i in self.owners[tuple(seq.tokens)]:
                continuation = list(self.requests[i][1])
                if not continuation:
                    self.results[i] = TokenScores([], [], [] if self.top_n else None)
                    continue
                steps = first[None] if i not in later else torch.cat([first[None], later[i]])
                logprobs = steps.float().log_softmax(-1)
                self.results[i] = token_scores(logprobs, continuation, self.top_n)
        self._release(admitted)

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

    def _prefill(self, seqs: list[Tokens]) -> list[torch.Tensor]:
        """Compute each sequence's uncached tokens into its blocks and offer its full blocks
        to the prefix cache: the logits (vocab,) after its last token (or none, when all
        were cached)."""
        has = [s.pending > 0 for s in seqs]
        pending = [s for s, h in zip(seqs, has, strict=True) if h]
        computed = self._extend_all(
            [s.blocks for s in pending],
            [s.computed for s in pending],
            [s.tokens[s.computed :] for s in pending],
            commit=True,
            last_only=True,
        )
        for seq in pending:
            start = seq.computed
            self.scheduler.computed(seq, seq.pending)
            if self.companion is not None:
                self.companion.prefill(seq, start, seq.computed)
        last = iter(computed)
        return [next(last)[0] if h else None for h in has]  # type: ignore[misc]

    def _release(self, seqs: list[Tokens]) -> None:
        for seq in seqs:
            self.pool.release(seq.blocks)
            seq.blocks = []
            if self.companion is not None:
                self.companion.forget(seq)

    def _extend_all(
        self,
        tables: list[list[int]],
        positions: list[int],
        tokens: list[list[int]],
        commit: bool,
        last_only: bool = False,
    ) -> list[torch.Tensor]:
        """`ModelRunner.extend` over rows packed into forwards of at most `batch_tokens`
        padded tokens: each row's logits (len(row), vocab), or (1, vocab) after its last."""
        out: list[torch.Tensor | None] = [None] * len(tokens)
        for batch in _forwards(positions, [len(t) for t in tokens], self.batch_tokens, self.limit):
            rows = [tokens[i] for i in batch]
            logits_at = torch.tensor([len(r) - 1 for r in rows]) if last_only else None
            logits = self.runner.extend(
                [tables[i] for i in batch],
                [positions[i] for i in batch],
                rows,
                None if logits_at is None else logits_at.to(self.runner.device),
                commit,
            )
            for i, row_logits, row in zip(batch, logits, rows, strict=True):
                out[i] = row_logits if last_only else row_logits[: len(row)]
        return out  # type: ignore[return-value]


def _forwards(
    positions: list[int], lengths: list[int], batch_tokens: int, limit: int
) -> list[list[int]]:
    """Rows (their indices) for each forward, longest first: at most `batch_tokens` tokens
    once padded to its longest row (one row at least), and no row padded past position
    `limit` (the model's context)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    out = []
    while order:
        width = lengths[order[0]]
        room = max(1, batch_tokens // width)
        batch, rest = [], []
        for i in order:
            if len(batch) < room and positions[i] + width <= limit:
                batch.append(i)
            else:
                rest.append(i)
        out.append(batch)
        order = rest
    return out
