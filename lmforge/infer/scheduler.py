"""The engine's scheduler: which requests run in the next step, and what each computes.

Each step has a token budget (`max_step_tokens`). Running sequences go first, oldest first: one
that is decoding computes its newest token; one still prefilling computes the next chunk of its
prompt that the budget allows, so a long prompt is prefilled a chunk per step while the others
keep decoding (chunked prefill). Then waiting requests are admitted, in order, while a sequence
slot, the budget and free blocks allow: admission asks only for the blocks of the tokens it
computes now, not for the request's longest possible length. A new request first takes every
block of its prefix that the pool has cached (lmforge.infer.blocks) and computes only the rest;
a request identical to one admitted in the same step forks it, sharing its blocks and its
prefill. When a running sequence needs a block and none is free, the newest running sequence is
preempted: its blocks go back to the pool and it waits at the head of the queue, to be
recomputed (through the prefix cache, usually cheaply) when blocks free up.

Pure Python over token lists and block ids: tested without a model (tests/infer/test_scheduler.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from lmforge.infer.blocks import BlockPool, chain_hash


@dataclass(eq=False)
class Sequence:
    """A request as the scheduler sees it: its tokens and where its keys and values are."""

    tokens: list[int]  # the prompt, then every token generated so far
    max_len: int | None = None  # the most tokens it may reach (prompt + max_tokens)
    computed: int = 0  # tokens whose keys and values are in the cache
    blocks: list[int] = field(default_factory=list)  # its block table
    keys: list[int] = field(default_factory=list)  # chain hashes of its full blocks, in order
    registered: int = 0  # full blocks offered to the prefix cache so far
    cached_tokens: int | None = None  # of its prompt, found in the cache when first admitted
    preemptions: int = 0

    @property
    def pending(self) -> int:
        """Tokens still to compute: 1 when decoding, more while (re)prefilling."""
        return len(self.tokens) - self.computed

    def block_keys(self, n: int, block_size: int) -> list[int]:
        """The chain hashes of its first n full blocks."""
        while len(self.keys) < n:
            i = len(self.keys)
            parent = self.keys[-1] if self.keys else None
            self.keys.append(chain_hash(parent, self.tokens[i * block_size : (i + 1) * block_size]))
        return self.keys[:n]


@dataclass
class Chunk:
    """Compute tokens[start:end] of `seq` (a prefill chunk); sample after it when it reaches the
    end. With `source`, copy that sequence's result instead (a fork of an identical request)."""

    seq: Sequence
    start: int
    end: int
    source: Sequence | None = None

    @property
    def completes(self) -> bool:
        return self.end == len(self.seq.tokens)


@dataclass
class Step:
    chunks: list[Chunk] = field(default_factory=list)
    decodes: list[Sequence] = field(default_factory=list)  # each computes its newest token
    preempted: list[Sequence] = field(default_factory=list)


class Scheduler:
    def __init__(
        self,
        pool: BlockPool,
        max_seqs: int,
        max_step_tokens: int,
        prefix_caching: bool = True,
        lookahead: int = 0,
    ) -> None:
        self.pool = pool
        self.lookahead = lookahead  # positions past its newest token a decode may write (drafts)
        self.max_seqs = max_seqs
        self.max_step_tokens = max_step_tokens
        self.prefix_caching = prefix_caching
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.pool.block_size)

    def schedule(self) -> Step:
        step = Step()
        budget = self.max_step_tokens
        i = 0
        while i < len(self.running):  # preemption takes from the end: the newest, not yet seen
            seq = self.running[i]
            i += 1
            if seq.pending > 1:
                self._extend_from_cache(seq)
            n = min(seq.pending, budget)
            if n == 0:
                continue
            end = seq.computed + n
            if seq.pending == 1 and self.lookahead:
                end = min(end + self.lookahead, seq.max_len or end + self.lookahead)
            if not self._grow_or_preempt(seq, end, step):
                continue
            budget -= n
            if seq.pending == 1:
                step.decodes.append(seq)
            else:
                step.chunks.append(Chunk(seq, seq.computed, seq.computed + n))
        prefilled: dict[tuple[int, ...], Chunk] = {}  # whole prompts computed in this step
        while self.waiting and len(self.running) < self.max_seqs and not step.preempted:
            seq = self.waiting[0]
            source = prefilled.get(tuple(seq.tokens))
            chunk = self._fork(seq, source) if source else self._admit(seq, budget)
            if chunk is None:
                break
            self.waiting.popleft()
            self.running.append(seq)
            step.chunks.append(chunk)
            if chunk.source is None:
                budget -= chunk.end - chunk.start
                if chunk.completes:
                    prefilled[tuple(seq.tokens)] = chunk
        return step

    def finish(self, seq: Sequence) -> None:
        """A sequence is done (finished or aborted): its blocks go back to the pool."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.pool.release(seq.blocks)
        seq.blocks = []

    def computed(self, seq: Sequence, n: int) -> None:
        """The step computed n more of seq's tokens: offer its newly full blocks to the cache."""
        seq.computed += n
        full = seq.computed // self.pool.block_size
        if not self.prefix_caching or full <= seq.registered:  # no block newly full
            return
        keys = seq.block_keys(full, self.pool.block_size)
        for i in range(seq.registered, full):
            self.pool.register(seq.blocks[i], keys[i])
        seq.registered = max(seq.registered, full)

    def _extend_from_cache(self, seq: Sequence) -> None:
        """A prefill that stopped at a block boundary takes the blocks that another request
        computed meanwhile (requests with one long prompt, arriving together)."""
        size = self.pool.block_size
        held = len(seq.blocks)
        if not self.prefix_caching or seq.computed != held * size:
            return
        cacheable = (len(seq.tokens) - 1) // size
        found = self.pool.lookup(seq.block_keys(cacheable, size)[held:])
        seq.blocks += found
        seq.computed += len(found) * size
        seq.registered = len(seq.blocks)

    def _grow_or_preempt(self, seq: Sequence, n_tokens: int, step: Step) -> bool:
        """Give seq blocks for n_tokens, preempting the newest sequences until it fits; False
        when seq itself had to go."""
        while not self._grow(seq, n_tokens):
            victim = self.running[-1]
            self._preempt(victim)
            step.preempted.append(victim)
            if victim is seq:
                return False
        return True

    def _grow(self, seq: Sequence, n_tokens: int) -> bool:
        need = self.blocks_for(n_tokens) - len(seq.blocks)
        if need <= 0:
            return True
        blocks = self.pool.allocate(need)
        if blocks is None:
            return False
        seq.blocks += blocks
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.pool.release(seq.blocks)
        seq.blocks, seq.computed, seq.registered = [], 0, 0
        seq.preemptions += 1
        self.waiting.appendleft(seq)

    def _admit(self, seq: Sequence, budget: int) -> Chunk | None:
        """Admit seq with its cached prefix and a first chunk of what remains, if it fits."""
        if budget == 0:
            return None
        size = self.pool.block_size
        cacheable = (len(seq.tokens) - 1) // size  # the last token is computed for its logits
        if self.prefix_caching:
            seq.blocks = self.pool.lookup(seq.block_keys(cacheable, size))
        seq.computed, seq.registered = len(seq.blocks) * size, len(seq.blocks)
        if seq.cached_tokens is None:
            seq.cached_tokens = seq.computed
        end = seq.computed + min(seq.pending, budget)
        if not self._grow(seq, end):
            self.pool.release(seq.blocks)
            seq.blocks, seq.computed, seq.registered = [], 0, 0
            return None
        return Chunk(seq, seq.computed, end)

    def _fork(self, seq: Sequence, chunk: Chunk) -> Chunk | None:
        """A chunk that copies the prefill of `chunk`, an identical request's in this step."""
        source = chunk.seq
        full = len(seq.tokens) // self.pool.block_size
        partial = self.blocks_for(len(seq.tokens)) - full
        blocks = self.pool.allocate(partial)
        if blocks is None:
            return None
        self.pool.share(source.blocks[:full])
        seq.blocks = source.blocks[:full] + blocks
        seq.computed, seq.registered = chunk.start, source.registered
        if seq.cached_tokens is None:
            seq.cached_tokens = chunk.start
        return Chunk(seq, chunk.start, chunk.end, source)
