"""Speculative decoding: guess a request's next tokens cheaply, check them all in one forward.

A proposer drafts up to k tokens for each decoding request; the model then computes the newest
token and the k drafts in one forward (the cost of a decode step while weights, not arithmetic,
bound it), and `accept` keeps the longest run of drafts the model agrees with, plus one token of
the model's own. Two proposers:

- `NgramProposer` (prompt lookup): the tokens that followed the latest earlier occurrence of the
  request's last n tokens, n from `max_n` down to 1. Free to compute, and good wherever output
  repeats its context: code, edits, quotes, extraction.
- `DraftModelProposer`: a smaller lmforge model with the same tokenizer decodes k tokens greedily
  over its own paged cache, which shares the engine's block tables.

Both draft deterministically, so `accept` is exact rejection sampling: a greedy request keeps a
draft when it equals the model's argmax; a sampled one keeps draft d with probability p(d) (p
is the request's own distribution: temperature, top-k, top-p, min-p) and otherwise draws from p
without d. Either way every token has exactly the distribution plain decoding gives it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from lmforge.infer.kv_cache import PagedKVCache
from lmforge.infer.sampler import SamplingBatch
from lmforge.infer.sampling import filter_logits

if TYPE_CHECKING:
    from lmforge.infer.scheduler import Sequence
    from lmforge.model.transformer import Transformer


class NgramProposer:
    """Prompt-lookup drafts from an index of each sequence's n-grams, kept up to date."""

    def __init__(self, k: int, max_n: int = 3) -> None:
        self.k = k
        self.max_n = max_n
        self._index: dict[Sequence, tuple[list[dict[tuple[int, ...], int]], list[int]]] = {}

    def propose(self, seqs: list[Sequence], k: int) -> list[list[int]]:
        return [self._lookup(seq, k) for seq in seqs]

    def prefill(self, seq: Sequence, start: int, end: int) -> None:
        """Nothing to compute: the index follows the tokens."""

    def copy_block(self, source: int, target: int) -> None:
        """No cache of its own."""

    def forget(self, seq: Sequence) -> None:
        self._index.pop(seq, None)

    def _lookup(self, seq: Sequence, k: int) -> list[int]:
        tables, done = self._index.setdefault(seq, ([{} for _ in range(self.max_n)], [1]))
        tokens = seq.tokens
        # Each n-gram maps to where its latest continuation starts; the newest n-grams have no
        # continuation yet, so a lookup finds the latest *earlier* occurrence of the tail.
        for p in range(done[0], len(tokens)):
            for n in range(1, min(self.max_n, p) + 1):
                tables[n - 1][tuple(tokens[p - n : p])] = p
        done[0] = len(tokens)
        for n in range(min(self.max_n, len(tokens)), 0, -1):
            start = tables[n - 1].get(tuple(tokens[-n:]))
            if start is not None:
                return tokens[start : start + k]
        return []


class DraftModelProposer:
    """Greedy drafts from a smaller model, over a paged cache that shares the engine's blocks.

    The draft computes every chunk the model does (`prefill`), so a block holds both models'
    keys and values, cached prefixes included; before drafting it catches up on the tokens
    the model accepted since.
    """

    def __init__(self, draft: Transformer, n_blocks: int, block_size: int, k: int) -> None:
        self.model = draft.eval()
        self.k = k
        self.cache = PagedKVCache(draft, n_blocks, block_size)
        self.device = draft.tok_embeddings.weight.device
        self._computed: dict[Sequence, int] = {}  # positions of its cache the draft has written

    def prefill(self, seq: Sequence, start: int, end: int) -> None:
        """Compute the draft's keys and values for a chunk the model computed."""
        self._forward(seq, start, end)

    def propose(self, seqs: list[Sequence], k: int) -> list[list[int]]:
        drafts = []
        for seq in seqs:
            tokens = list(seq.tokens)
            logits = self._forward(seq, min(self._computed.get(seq, 0), seq.computed), len(tokens))
            row = []
            for _ in range(k):
                token = int(logits.argmax())
                row.append(token)
                tokens.append(token)
                if len(row) < k:
                    logits = self._forward(seq, len(tokens) - 1, len(tokens), tokens)
            drafts.append(row)
        return drafts

    def copy_block(self, source: int, target: int) -> None:
        self.cache.copy_block(source, target)

    def forget(self, seq: Sequence) -> None:
        self._computed.pop(seq, None)

    def _forward(
        self, seq: Sequence, start: int, end: int, tokens: list[int] | None = None
    ) -> torch.Tensor:
        tokens = seq.tokens if tokens is None else tokens
        ids = torch.tensor([tokens[start:end]], dtype=torch.long, device=self.device)
        n_blocks = -(-end // self.cache.block_size)
        self.cache.bind([seq.blocks[:n_blocks]], start, end - start)
        logits = self.model(ids, self.cache, last_only=True)[0, -1]
        self.cache.commit()
        self._computed[seq] = end
        return logits


def accept(
    logits: torch.Tensor, drafts: torch.Tensor, batch: SamplingBatch
) -> tuple[list[list[int]], torch.Tensor]:
    """The tokens each row keeps: its accepted drafts, then one of the model's own.

    logits (B, k+1, vocab) follow the newest token and each of the k drafts (B, k). Returns the
    kept tokens of each row and the token at every position as if every draft were kept (B, k+1),
    whose rows' first len(kept) entries are the kept tokens."""
    rows, width, vocab = logits.shape
    k = width - 1
    logits = logits.float()
    greedy = logits.argmax(dim=-1)  # (B, k+1)
    chosen = greedy.clone()
    kept: list[list[int]] = []
    probs = None
    if batch.sampled:
        flat = logits.reshape(rows * width, vocab)

        def spread(column: torch.Tensor | None) -> torch.Tensor | None:
            return None if column is None else column.repeat_interleave(width, dim=0)

        scaled = filter_logits(
            flat / spread(batch.temperature),
            spread(batch.top_k),
            spread(batch.top_p),
            spread(batch.min_p),
        )
        probs = scaled.softmax(dim=-1).view(rows, width, vocab)
    sampled = set(batch.sampled)
    drafted = drafts.tolist()
    for row in range(rows):
        request = batch.requests[row]
        n = 0
        if row not in sampled:
            while n < k and drafted[row][n] == int(greedy[row, n]):
                n += 1
        else:
            p = probs[row]
            while n < k and request.uniform() < float(p[n, drafted[row][n]]):
                chosen[row, n] = drafted[row][n]
                n += 1
            last = p[n].clone()
            if n < k:  # rejected: draw from p without the draft
                last[drafted[row][n]] = 0
            cdf = last.cumsum(dim=0)
            u = cdf[-1:] * request.uniform()
            chosen[row, n] = torch.searchsorted(cdf, u, right=True).clamp(max=vocab - 1)[0]
        kept.append([*drafted[row][:n], int(chosen[row, n])])
        chosen[row, :n] = drafts[row, :n]
    return kept, chosen
