"""The engine's model runner: forwards over the paged KV cache, and nothing else.

`prefill` computes chunks of sequences' tokens, each from its position on; `decode` computes
the newest token of many sequences at once, each at its own position, and can be compiled: the
rows are padded to a power of two (padding rows write to the null block) and the block tables'
width is symbolic, so a growing context does not recompile. A decode batch's blocks are gathered
once, with room to grow, and reused while the batch stays the same (PagedKVCache.bind). Which
tokens to compute, and in which blocks, is the scheduler's business (lmforge.infer.scheduler).

On a CPU a compiled decode step is a hundred small operations: Inductor's wrapper is C++ and
its elementwise loops run on one thread (they cover a few rows of d_model elements; waking
threads for each costs more than it saves), and for up to cpu_decode.MAX_ROWS rows (the decode
kernels' products) the step's thread count is chosen per row count by timing the first steps
(lmforge.threads): on a 2-core Zen 3 host a batch-1 int8 step of an 85M model took 9.9 ms on one
thread and 12.8 ms on two, where a larger model or a larger machine gains from more. More rows
are torch's matrix products, bound by arithmetic, and keep every thread (512 rows of a 5M
model: 60 ms a step on two threads, 116 on one): a trial there only risks a noisy choice.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from lmforge.infer.blocks import NULL_BLOCK
from lmforge.infer.kv_cache import PagedKVCache
from lmforge.kernels.cpu_decode import MAX_ROWS
from lmforge.threads import ThreadTrial, using_threads

# Blocks a decode batch's gathered cache has room for beyond its longest table: each sequence
# grows into them before the batch is gathered again.
GROWTH_BLOCKS = 1
# The most bytes of keys and values a forward of several rows gathers (PagedKVCache.bind): rows
# that continue long contexts go to a forward in fewer numbers than their new tokens allow.
GATHER_BYTES = 256 << 20
TRIAL_STEPS = 8  # decode steps timed at each thread count before one is chosen

if TYPE_CHECKING:
    from lmforge.infer.scheduler import Sequence
    from lmforge.model.transformer import Transformer


class ModelRunner:
    def __init__(
        self, model: Transformer, n_blocks: int, block_size: int, max_rows: int, compile: bool
    ) -> None:
        self.model = model
        self.device = model.tok_embeddings.weight.device
        self.cache = PagedKVCache(model, n_blocks, block_size, compile)
        self.max_rows = max_rows
        self.compiled = compile
        self._step = self._compile() if compile else self._forward
        self._batch: tuple | None = None  # the decode batch whose blocks the cache has gathered
        self.thread_trials: dict[int, ThreadTrial] = {}  # by row count: compiled CPU steps

    def prefill(self, chunks: list[tuple[Sequence, int, int]], max_tokens: int) -> torch.Tensor:
        """Compute each chunk, tokens[start:end] of its sequence, into its blocks: the logits
        (len(chunks), vocab) after each chunk's last token. Chunks of similar length share a
        forward of at most `max_tokens` padded tokens (one chunk at least), so that requests
        admitted together (chat turns after one system prompt) are not prefilled one by one."""
        size = self.cache.block_size
        lengths = [end - start for _, start, end in chunks]
        out: list[torch.Tensor] = [torch.empty(0)] * len(chunks)
        for group in self.forwards(lengths, [end for _, _, end in chunks], max_tokens):
            batch = [chunks[i] for i in group]
            if len(batch) == 1:
                logits = self._prefill_one(*batch[0])
            else:  # padding at the rows' ends: branches of their own (see `extend`)
                tokens = [seq.tokens[start:end] for seq, start, end in batch]
                logits = self.extend(
                    [seq.blocks[: -(-end // size)] for seq, _, end in batch],
                    [start for _, start, _ in batch],
                    tokens,
                    torch.tensor([len(t) - 1 for t in tokens], device=self.device),
                    [[0] * len(t) for t in tokens],
                )[:, 0]
            for i, row in zip(group, logits, strict=True):
                out[i] = row
        return torch.stack(out)

    def forwards(self, lengths: list[int], ends: list[int], max_tokens: int) -> list[list[int]]:
        """Rows (their indices) for each forward of `extend`, longest first: at most
        `max_tokens` tokens once padded to its longest row, and at most GATHER_BYTES of keys and
        values gathered for rows that reach positions `ends` (one row a forward at least)."""
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        out: list[list[int]] = []
        for i in order:
            group = out[-1] if out else []
            rows = len(group) + 1
            reach = max([ends[j] for j in group] + [ends[i]]) * self.cache.position_bytes
            if not group or rows * lengths[group[0]] > max_tokens or rows * reach > GATHER_BYTES:
                out.append([i])
            else:
                group.append(i)
        return out

    def _prefill_one(self, seq: Sequence, start: int, end: int) -> torch.Tensor:
        ids = torch.tensor([seq.tokens[start:end]], dtype=torch.long, device=self.device)
        n_blocks = -(-end // self.cache.block_size)
        self.cache.bind([seq.blocks[:n_blocks]], start, end - start)
        logits = self.model(ids, self.cache, last_only=True)[:, -1]
        self.cache.commit()
        return logits

    def decode(self, seqs: list[Sequence]) -> torch.Tensor:
        """Compute each sequence's newest token; the logits (len(seqs), vocab) after each."""
        rows = len(seqs)
        if self.compiled:  # one compiled graph per power of two
            rows = min(self.max_rows, 1 << (rows - 1).bit_length())
        pad = rows - len(seqs)
        reuse = self._batch_unchanged(seqs, rows)
        if not reuse:  # gather the batch's blocks again, with room to grow into
            width = max(len(s.blocks) for s in seqs) + GROWTH_BLOCKS
            self._batch = (list(seqs), [list(s.blocks) for s in seqs], rows, width)
        width = self._batch[3]
        tables = [s.blocks + [NULL_BLOCK] * (width - len(s.blocks)) for s in seqs]
        positions = [s.computed for s in seqs]
        self.cache.bind(
            tables + [[NULL_BLOCK] * width] * pad,
            positions + [0] * pad,
            1,
            reuse=reuse,
            kv_len=None if self.compiled else max(positions) + 1,  # compiled: symbolic width
        )
        tokens = [[s.tokens[-1]] for s in seqs] + [[0]] * pad
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        logits = self._timed_step(ids, rows)[: len(seqs)]
        self.cache.commit()
        return logits

    def _timed_step(self, ids: torch.Tensor, rows: int) -> torch.Tensor:
        """The decode step, on a CPU at the thread count its trial for this many rows chose or
        is trying (its first call, which compiles, is not timed); more than MAX_ROWS rows keep
        the caller's count."""
        if not self.compiled or self.device.type != "cpu" or rows > MAX_ROWS:
            return self._step(ids)
        trial = self.thread_trials.get(rows)
        if trial is None:
            self.thread_trials[rows] = ThreadTrial(torch.get_num_threads(), TRIAL_STEPS)
            return self._step(ids)
        start = time.perf_counter()
        if trial.threads == torch.get_num_threads():
            logits = self._step(ids)
        else:  # prefills, and whatever the caller's thread runs next, keep every thread
            with using_threads(trial.threads):
                logits = self._step(ids)
        trial.record(time.perf_counter() - start)
        return logits

    def _batch_unchanged(self, seqs: list[Sequence], rows: int) -> bool:
        """Whether the last decode batch's gathered cache still serves these sequences: the
        same ones in the same order, each holding the blocks it held then and maybe more,
        within the width gathered."""
        if self._batch is None:
            return False
        last, blocks, last_rows, width = self._batch
        return (
            rows == last_rows
            and len(seqs) == len(last)
            and all(a is b for a, b in zip(seqs, last, strict=True))
            and all(
                len(s.blocks) <= width and s.blocks[: len(held)] == held
                for s, held in zip(seqs, blocks, strict=True)
            )
        )

    def verify(self, seqs: list[Sequence], drafts: list[list[int]]) -> torch.Tensor:
        """Compute each sequence's newest token and its k drafts (all rows k long); the logits
        (len(seqs), k + 1, vocab) after each of them."""
        tokens = [[s.tokens[-1], *d] for s, d in zip(seqs, drafts, strict=True)]
        return self.extend([s.blocks for s in seqs], [s.computed for s in seqs], tokens)

    def extend(
        self,
        tables: list[list[int]],
        positions: list[int],
        tokens: list[list[int]],
        logits_at: torch.Tensor | None = None,
        branches: list[list[int]] | None = None,
        commit: bool = True,
    ) -> torch.Tensor:
        """Compute rows of tokens, each continuing its block table from its position: the
        logits (rows, T, vocab) after each token, T the longest row, or after `logits_at` (the
        model's argument). Shorter rows are padded at their end, which nothing before it sees;
        with `branches` (the model's argument, a trunk and its branches per row) each padding
        token is a branch of its own, placed at the trunk's end. Keys and values past a table's
        blocks go to the null block; without `commit` none reach the pool."""
        self._batch = None  # this bind gathers a batch of its own
        width = max(map(len, tokens))
        size = self.cache.block_size
        blocks = max(*(-(-(p + width) // size) for p in positions), *map(len, tables))
        padded = [t + [NULL_BLOCK] * (blocks - len(t)) for t in tables]
        self.cache.bind(padded, positions, width)
        rows = [row + [0] * (width - len(row)) for row in tokens]
        ids = torch.tensor(rows, dtype=torch.long, device=self.device)
        tree = None
        if branches is not None:  # padding: one new branch a token
            pads = [range(max(row) + 1, max(row) + 1 + width - len(row)) for row in branches]
            trees = [[*row, *pad] for row, pad in zip(branches, pads, strict=True)]
            tree = torch.tensor(trees, dtype=torch.long, device=self.device)
        logits = self.model(ids, self.cache, logits_at=logits_at, branches=tree)
        if commit:
            self.cache.commit()
        return logits

    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(ids, self.cache)[:, -1]

    def _compile(self) -> Any:
        """The decode step compiled once per row count (1, 2, 4, ... rows)."""
        shapes = self.max_rows.bit_length() + 1
        # isolate_recompiles: this engine's variants count against its own limit, not those of
        # every engine's step (one code object). No guards on the modules' attributes: the
        # engine owns its model and only ever copies weights into it in place, and checking the
        # ~250 weight tensors' guards cost 0.7 ms of a 5 ms step (an 85M model, int8). No
        # checks of the inputs' sizes, strides and alignment inside the compiled step either:
        # the engine made every input; in a C++ wrapper each check builds a stringstream, and a
        # 12-layer int4 model's ~400 checks took 1.2 ms of a 2.6 ms step (d_model 128).
        options: dict[str, Any] = {
            "guard_filter_fn": _step_guards,
            "size_asserts": False,
            "alignment_asserts": False,
            "scalar_asserts": False,
        }
        if self.device.type == "cpu":  # see the module's docstring
            options |= {"cpp_wrapper": True, "cpp.threads": 1}
        return torch.compile(
            self._forward,
            dynamic=False,
            recompile_limit=shapes,
            isolate_recompiles=True,
            options=options,
        )


def _step_guards(entries: list[Any]) -> list[bool]:
    """The compiled decode step's guards: none on the modules' attributes (see `_compile`), and
    none on the global state. Every step runs under inference mode (on the engine's thread, or
    inside single_prompt's), and the thread count, the one global the engine changes (the
    thread trial), is read by the step's kernels when they run, not built into its code:
    guarding it recompiled each row count's step once per count tried, and past the recompile
    limit the rest ran uncompiled."""
    keep = torch.compiler.skip_guard_on_all_nn_modules_unsafe(entries)
    return [k and e.guard_type != "GLOBAL_STATE" for k, e in zip(keep, entries, strict=True)]
