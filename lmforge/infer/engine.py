"""The inference engine: continuous batching over a paged KV cache, on a thread of its own.

Callers `submit` requests and hold a RequestHandle (lmforge.infer.output) to iterate their tokens,
cancel them or wait for their result. One background thread runs the engine's steps; in each, the
scheduler (lmforge.infer.scheduler) picks what to compute under a token budget: the newest token
of every decoding request, a chunk of a prompt being prefilled, new requests admitted by the free
blocks of the KV pool (lmforge.infer.blocks), whose cached prefixes they reuse. The model runner
(lmforge.infer.runner) computes it over the paged cache, the sampler (lmforge.infer.sampler) draws
one token per row with each request's own settings and generator, and `deliver` turns the tokens
into events. Finished and cancelled requests give their blocks back at once; a request the pool
cannot hold any more is preempted and recomputed later, so none fails because others grew.

Scoring jobs (`score`, `submit_score`: log-likelihoods of continuations, over the same prefix
cache, lmforge.infer.cached_score) and weight loads (`load_weights`: an RL trainer's new
weights, copied in place) queue beside the requests and run on the same thread between steps,
since that thread alone runs the model; their result or error comes back through a concurrent
Future.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from lmforge.device.capability import use_compile
from lmforge.errors import LmforgeError
from lmforge.infer.blocks import BlockPool
from lmforge.infer.cached_score import score_over_cache
from lmforge.infer.kv_cache import PagedKVCache
from lmforge.infer.output import (
    Completion,
    RequestHandle,
    TokenEvent,
    deliver,
    finish,
)
from lmforge.infer.runner import ModelRunner
from lmforge.infer.sampler import SamplingBatch, sample
from lmforge.infer.sampling import check_sampling_args
from lmforge.infer.scheduler import Scheduler
from lmforge.infer.scheduler import Sequence as Tokens
from lmforge.infer.score import TokenScores
from lmforge.infer.speculative import DraftModelProposer, NgramProposer, accept
from lmforge.infer.text_assembler import TextAssembler
from lmforge.infer.weight_layouts import lay_out_for_decode, load_drafter

if TYPE_CHECKING:
    from lmforge.model.transformer import Transformer

__all__ = ["Completion", "Engine", "RequestHandle", "SamplingParams", "TokenEvent"]

BLOCK_SIZE = 16  # token positions per KV block
STEP_TOKENS = 2048  # tokens a step computes at most: decodes first, then prefill chunks
UNIFORM_DRAWS = 64  # a request's random numbers drawn at once (one per sampled token)


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # 0 = greedy
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float = 1.0  # HF/CTRL style, >1 discourages repeats
    frequency_penalty: float = 0.0  # OpenAI style
    presence_penalty: float = 0.0  # OpenAI style
    stop: tuple[str, ...] = ()  # stop strings: text stops before them, they are not emitted
    stop_ids: tuple[int, ...] = ()  # stop token ids (the tokenizer's special tokens always stop)
    seed: int | None = None  # same seed -> same output, whatever else is batched
    logprobs: bool = False
    top_logprobs: int = 0  # with logprobs: also this many likeliest tokens (id, logprob) a step

    def validate(self, max_context: int | None = None) -> None:
        check_sampling_args(self.temperature, self.top_k, self.top_p, self.min_p)
        if self.max_tokens < 1:
            raise LmforgeError(f"max_tokens={self.max_tokens} is invalid: use 1 or more")
        if max_context is not None and self.max_tokens >= max_context:
            raise LmforgeError(
                f"max_tokens={self.max_tokens} leaves no room for a prompt in the model's "
                f"{max_context}-token context: use fewer"
            )
        if self.top_logprobs < 0:
            raise LmforgeError(f"top_logprobs={self.top_logprobs} is invalid: use 0 or more")
        if not self.repetition_penalty > 0:
            raise LmforgeError(
                f"repetition_penalty={self.repetition_penalty} is invalid: use a value above 0 "
                "(1 disables it)"
            )
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise LmforgeError(f"{name}={getattr(self, name)} is invalid: use -2 .. 2")

    @property
    def penalised(self) -> bool:
        return (self.repetition_penalty, self.frequency_penalty, self.presence_penalty) != (
            1.0,
            0.0,
            0.0,
        )


@dataclass(eq=False)
class _Request:
    """A submitted request: its tokens in the scheduler's hands, the rest for sampling and
    delivering them."""

    seq: Tokens
    params: SamplingParams
    handle: RequestHandle
    generator: torch.Generator
    stops: frozenset[int]
    text: TextAssembler
    prompt_tokens: int
    seen: torch.Tensor | None = None  # for penalties: tokens in the prompt and output
    counts: torch.Tensor | None = None  # for penalties: how often each was generated
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    _uniforms: list[float] = field(default_factory=list)  # drawn, not yet used, last first

    @property
    def token_ids(self) -> list[int]:
        return self.seq.tokens[self.prompt_tokens :]

    @property
    def cached_tokens(self) -> int:
        return self.seq.cached_tokens or 0

    def uniform(self) -> float:
        """The next number in [0, 1) of this request's own random stream, drawn UNIFORM_DRAWS at
        a time (on a CPU the same numbers one draw at a time gives; a draw per token cost more
        than the rest of its sampling)."""
        if not self._uniforms:
            device = self.generator.device
            draws = torch.rand(UNIFORM_DRAWS, generator=self.generator, device=device)
            self._uniforms = draws.tolist()[::-1]
        return self._uniforms.pop()


@dataclass
class _Job:
    """Work for the engine's thread between decode steps (scoring, loading weights), and where
    its result goes."""

    work: Callable[[Transformer], Any]
    future: Future

    def run(self, model: Transformer) -> None:
        """Run, unless the caller cancelled meanwhile; an error goes to the caller only."""
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            self.future.set_result(self.work(model))
        except Exception as error:
            self.future.set_exception(error)


class Engine:
    """Continuous batching of up to `max_batch_size` requests over a paged KV cache.

    The cache holds `max_kv_tokens` positions (default max_batch_size × the model's context) in
    blocks of `block_size`; a request holds the blocks its tokens fill, not its longest possible
    length. A step computes at most `max_step_tokens` tokens, so a long prompt is prefilled in
    chunks between decode steps. With `prefix_caching`, full blocks are kept by the hash of their
    tokens and reused by any later request that begins with the same tokens.

    `relayout_weights` re-lays the model's Linear weights, in place, for the CPU kernel that
    decodes `max_batch_size` rows fastest, compiled or not (see lmforge.infer.weight_layouts):
    batch-1 and batched, fp32 and bf16 decode steps get 1.2-1.9x faster. Ask for it only when the
    engine owns the model (serving): afterwards the model can no longer be trained or saved.
    """

    def __init__(
        self,
        model: Transformer,
        tokenizer: Any,
        *,
        max_batch_size: int = 8,
        max_kv_tokens: int | None = None,
        compile: bool = False,
        device: torch.device | str | None = None,
        relayout_weights: bool = False,
        block_size: int = BLOCK_SIZE,
        max_step_tokens: int = STEP_TOKENS,
        prefix_caching: bool = True,
        speculative: str | Transformer | None = None,
        speculative_tokens: int = 4,
    ) -> None:
        if max_batch_size < 1:
            raise LmforgeError(f"max_batch_size={max_batch_size} is invalid: use 1 or more")
        if max_step_tokens < max_batch_size:
            raise LmforgeError(
                f"max_step_tokens={max_step_tokens} is fewer than max_batch_size="
                f"{max_batch_size}: a step must hold one token of every running request"
            )
        if device is not None:
            model.to(device)
        compile = use_compile(compile, model.tok_embeddings.weight.device)
        self.weight_layout = "row-major"
        if relayout_weights:
            self.weight_layout = lay_out_for_decode(model, max_batch_size, compile)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        kv_tokens = max_batch_size * self.max_context if max_kv_tokens is None else max_kv_tokens
        if kv_tokens < block_size:
            raise LmforgeError(
                f"max_kv_tokens={max_kv_tokens} holds no block of {block_size} positions: use "
                f"{block_size} or more"
            )
        pool = BlockPool(kv_tokens // block_size + 1, block_size)  # + the null block
        self.device = model.tok_embeddings.weight.device
        self.vocab_size = model.config.vocab_size
        self.speculative_tokens = speculative_tokens if speculative is not None else 0
        self.proposer = self._proposer(speculative, pool)
        self.drafted_tokens = self.accepted_tokens = 0  # for the drafts' acceptance rate
        self.scheduler = Scheduler(
            pool, max_batch_size, max_step_tokens, prefix_caching, self.speculative_tokens
        )
        self.runner = ModelRunner(model, pool.n_blocks, block_size, max_batch_size, compile)
        self._specials = frozenset(getattr(tokenizer, "special_tokens", {}).values())
        self._requests: dict[Tokens, _Request] = {}  # by sequence: those not yet finished
        self._batch: SamplingBatch | None = None  # the last step's, reused while it fits

        self._incoming: deque[_Request] = deque()
        self._jobs: list[_Job] = []
        self._cancelled: list[RequestHandle] = []
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._seeds = random.Random()

    def _proposer(
        self, speculative: str | Transformer | None, pool: BlockPool
    ) -> NgramProposer | DraftModelProposer | None:
        if speculative is None:
            return None
        if self.speculative_tokens < 1:
            raise LmforgeError(
                f"speculative_tokens={self.speculative_tokens} is invalid: draft 1 or more"
            )
        if speculative == "ngram":
            return NgramProposer(self.speculative_tokens)
        if isinstance(speculative, str):
            raise LmforgeError(
                f"speculative={speculative!r} is unknown: use 'ngram' or a draft model"
            )
        if speculative.config.vocab_size != self.vocab_size:
            raise LmforgeError(
                f"the draft model's vocabulary of {speculative.config.vocab_size} tokens is not "
                f"the model's {self.vocab_size}: draft with a model of the same tokenizer"
            )
        speculative.to(self.device)
        return DraftModelProposer(
            speculative, pool.n_blocks, pool.block_size, self.speculative_tokens
        )

    @property
    def acceptance_rate(self) -> float:
        """The share of drafted tokens the model kept so far."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def max_context(self) -> int:
        return self.model.config.max_seq_len

    @property
    def cache(self) -> PagedKVCache:
        """The KV pool's tensors (the runner's)."""
        return self.runner.cache

    @property
    def max_kv_tokens(self) -> int:
        """Positions the KV pool holds for requests."""
        return self.scheduler.pool.capacity * self.scheduler.pool.block_size

    @property
    def busy_slots(self) -> int:
        """Requests admitted and not finished (prefilling or decoding)."""
        return len(self.scheduler.running)

    @property
    def queued_requests(self) -> int:
        """Requests submitted and not running: new ones, and preempted ones waiting for blocks."""
        return len(self._incoming) + len(self.scheduler.waiting)

    @property
    def reserved_kv_tokens(self) -> int:
        """KV positions in blocks that requests hold (cached blocks no one holds are free)."""
        return self.scheduler.pool.n_held * self.scheduler.pool.block_size

    @property
    def prefix_cache_hit_rate(self) -> float:
        """The share of looked-up prompt tokens found in the prefix cache so far."""
        pool = self.scheduler.pool
        return pool.hit_tokens / pool.queried_tokens if pool.queried_tokens else 0.0

    # ---- the public, thread-safe side -----------------------------------------------------

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> RequestHandle:
        """Queue a request; its tokens arrive through the returned handle."""
        request = self._request(prompt_ids, params)
        self._enqueue(lambda: self._incoming.append(request))
        return request.handle

    def run_here(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        around: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    ) -> Iterator[TokenEvent]:
        """One request run on the caller's thread, a step at a time, each step inside
        `around()`: its events as each step makes them. For an engine that serves nothing
        else (lmforge.infer.generate); its background thread never starts."""
        if self._thread is not None:
            raise LmforgeError("this engine runs on its own thread: submit() to it instead")
        request = self._request(prompt_ids, params)
        self._requests[request.seq] = request
        self.scheduler.add(request.seq)
        events = request.handle._events
        seen = 0
        while True:
            with around():
                self._step()
            while seen < len(events):
                seen += 1
                yield events[seen - 1]
                if events[seen - 1].finish_reason is not None:
                    return

    def _request(self, prompt_ids: list[int], params: SamplingParams) -> _Request:
        params.validate(self.max_context)
        self._check_prompt(prompt_ids, params)
        seed = self._seeds.getrandbits(63) if params.seed is None else params.seed
        request = _Request(
            seq=Tokens(list(prompt_ids), max_len=len(prompt_ids) + params.max_tokens),
            params=params,
            handle=RequestHandle(self._cancel),
            generator=torch.Generator(self.device).manual_seed(seed),
            stops=frozenset(params.stop_ids) | self._specials,
            text=TextAssembler(params.stop),
            prompt_tokens=len(prompt_ids),
        )
        if params.penalised:
            request.seen = torch.zeros(self.vocab_size, dtype=torch.bool, device=self.device)
            request.seen[torch.tensor(prompt_ids, device=self.device)] = True
            request.counts = torch.zeros(self.vocab_size, device=self.device)
        return request

    def submit_score(
        self, requests: Sequence[tuple[Sequence[int], Sequence[int]]], top_n: int = 0
    ) -> Future[list[TokenScores]]:
        """Queue a scoring job that the engine's thread runs between decode steps: contexts
        that share a beginning, or begin with blocks the prefix cache holds, compute only the
        rest (lmforge.infer.cached_score), others as lmforge.infer.score.score does. The
        Future gives the scores or the error; `await asyncio.wrap_future(future)` waits
        without blocking an event loop, and cancelling the Future before the job starts drops
        it."""
        if not 0 <= top_n <= self.vocab_size:
            raise LmforgeError(f"top_n={top_n} is invalid: use 0 .. {self.vocab_size}")
        pairs = [(list(context), list(continuation)) for context, continuation in requests]
        for i, (context, continuation) in enumerate(pairs):
            if not all(0 <= t < self.vocab_size for t in context + continuation):
                raise LmforgeError(
                    f"scoring request {i} has token ids outside the model's vocabulary of "
                    f"{self.vocab_size}: encode it with the model's own tokenizer"
                )
        job = _Job(
            lambda model: score_over_cache(
                self.runner, self.scheduler, pairs, top_n, companion=self.proposer
            ),
            Future(),
        )
        self._enqueue(lambda: self._jobs.append(job))
        return job.future

    def score(
        self, requests: Sequence[tuple[Sequence[int], Sequence[int]]], top_n: int = 0
    ) -> list[TokenScores]:
        """The scores of each (context, continuation), as `score(model, ...)` gives them, run
        on the engine's thread (blocks until done; safe from any thread)."""
        return self.submit_score(requests, top_n).result()

    def generate(
        self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[Completion]:
        """Completions of several prompts, batched continuously (blocks until all are done)."""
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise LmforgeError(
                f"{len(prompts)} prompts but {len(params)} sampling settings: pass one per prompt"
            )
        requests = [self._request(p, s) for p, s in zip(prompts, params, strict=True)]
        # queued at once, so that the first steps see them all (the batches do not depend on
        # when the engine's thread wakes up)
        self._enqueue(lambda: self._incoming.extend(requests))
        return [r.handle.result() for r in requests]

    def load_weights(self, source: torch.nn.Module) -> None:
        """Copy `source`'s parameters and buffers (a model of the same shape, e.g. the one a
        trainer is updating) into the engine's model in place, on the engine's thread: the KV
        cache, the compiled step and the slots stay as they are. Only between requests: with
        requests queued or running it raises. Blocks until done."""
        if self.weight_layout != "row-major":
            raise LmforgeError(
                "this engine re-laid its weights for decoding (relayout_weights=True): make the "
                "engine without it to load new weights into it"
            )
        theirs, ours = source.state_dict(), self.model.state_dict()
        if theirs.keys() != ours.keys():
            missing = sorted(ours.keys() - theirs.keys())[:3]
            extra = sorted(theirs.keys() - ours.keys())[:3]
            raise LmforgeError(
                f"the weights do not fit the engine's model (missing {missing}, extra {extra}): "
                "pass a model of the same shape and adapters"
            )

        def copy(model: Transformer) -> None:
            if self._incoming or self.scheduler.has_work():
                raise LmforgeError(
                    "the engine is serving requests: wait for their results before loading "
                    "new weights"
                )
            for name, tensor in ours.items():
                tensor.copy_(theirs[name])
            self.scheduler.pool.clear_cache()

        job = _Job(copy, Future())
        self._enqueue(lambda: self._jobs.append(job))
        job.future.result()

    def _enqueue(self, add: Callable[[], None]) -> None:
        """Run `add` (it queues work) under the lock, starting the scheduler thread if need be."""
        with self._wake:
            if self._closed:
                raise LmforgeError("the engine is closed: make a new Engine to submit requests")
            add()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
                self._thread.start()
            self._wake.notify()

    def close(self) -> None:
        """Abort what is queued or running, fail queued scoring jobs, stop the scheduler thread."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_prompt(self, prompt_ids: list[int], params: SamplingParams) -> None:
        if len(prompt_ids) == 0:
            raise LmforgeError(
                "the prompt is empty: pass at least one token, e.g. the tokenizer's "
                "<|endoftext|> id"
            )
        if not all(0 <= t < self.vocab_size for t in prompt_ids):
            raise LmforgeError(
                f"the prompt has token ids outside the model's vocabulary of {self.vocab_size}: "
                "encode it with the model's own tokenizer"
            )
        if params.top_logprobs > self.vocab_size:
            raise LmforgeError(
                f"top_logprobs={params.top_logprobs} is more than the vocabulary of "
                f"{self.vocab_size} tokens: ask for fewer"
            )
        if len(prompt_ids) + params.max_tokens > self.max_context:
            raise LmforgeError(
                f"prompt of {len(prompt_ids)} tokens + max_tokens={params.max_tokens} exceed the "
                f"model's context of {self.max_context} tokens: shorten one of them"
            )
        if self.scheduler.blocks_for(len(prompt_ids) + params.max_tokens) > (
            self.scheduler.pool.capacity
        ):
            raise LmforgeError(
                f"prompt of {len(prompt_ids)} tokens + max_tokens={params.max_tokens} exceed "
                f"max_kv_tokens={self.max_kv_tokens}: raise the cap or shorten the request"
            )

    def _cancel(self, handle: RequestHandle) -> None:
        with self._wake:
            handle.cancelled = True
            self._cancelled.append(handle)
            self._wake.notify()

    # ---- the engine's thread ---------------------------------------------------------------

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                with self._wake:
                    self._wake.wait_for(
                        lambda: (
                            self._closed
                            or self._incoming
                            or self._cancelled
                            or self._jobs
                            or self.scheduler.has_work()
                        )
                    )
                    if self._closed:
                        break
                    incoming, self._incoming = self._incoming, deque()
                    cancelled, self._cancelled = self._cancelled, []
                    jobs, self._jobs = self._jobs, []
                for request in incoming:
                    self._requests[request.seq] = request
                    self.scheduler.add(request.seq)
                self._abort([r for r in self._requests.values() if r.handle in cancelled])
                try:
                    if self.scheduler.has_work():
                        self._step()
                except Exception as error:  # the requests in flight fail; the engine goes on
                    self._fail_running(error)
                for job in jobs:
                    job.run(self.model)
        with self._wake:
            self._requests.update((r.seq, r) for r in self._incoming)
            jobs, self._jobs = self._jobs, []
        self._abort(list(self._requests.values()))
        for job in jobs:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(LmforgeError("the engine closed before running this"))

    def _step(self) -> None:
        """One scheduler step: its prefill chunks and decodes, then the new tokens of each
        request whose tokens are all computed."""
        step = self.scheduler.schedule()
        ready: list[_Request] = []
        rows: list[torch.Tensor] = []
        computing = [c for c in step.chunks if c.source is None]
        prefilled: dict[Tokens, torch.Tensor] = {}
        if computing:
            chunks = [(c.seq, c.start, c.end) for c in computing]
            logits = self.runner.prefill(chunks, self.scheduler.max_step_tokens)
            prefilled = {c.seq: row[None] for c, row in zip(computing, logits, strict=True)}
        for chunk in step.chunks:
            seq = chunk.seq
            if chunk.source is None:
                logits = prefilled[seq]
                if self.proposer is not None:
                    self.proposer.prefill(seq, chunk.start, chunk.end)
            else:  # a fork: the source's keys and values, its partial last block copied
                logits = prefilled[chunk.source]
                if len(seq.tokens) % self.scheduler.pool.block_size:
                    for cache in (self.runner.cache, self.proposer):
                        if cache is not None:
                            cache.copy_block(chunk.source.blocks[-1], seq.blocks[-1])
            self.scheduler.computed(seq, chunk.end - chunk.start)
            if chunk.completes:
                ready.append(self._requests[seq])
                rows.append(logits)
        k = self._draft_length(step.decodes)
        proposed = self.proposer.propose(step.decodes, k) if k else []
        k = max(map(len, proposed), default=0)  # no draft anywhere: decode plainly
        if step.decodes and not k:
            rows.append(self.runner.decode(step.decodes))
            for seq in step.decodes:
                self.scheduler.computed(seq, 1)
            ready += [self._requests[seq] for seq in step.decodes]
        if ready:
            logits = rows[0] if len(rows) == 1 else torch.cat(rows)
            tokens, logprobs = sample(logits, self._sampling(ready))
            logprobs = None if logprobs is None else logprobs[:, None]
            self._emit(ready, [[t] for t in tokens.tolist()], tokens[:, None], logprobs)
        if step.decodes and k:
            self._speculate(step.decodes, proposed, k)

    def _sampling(self, requests: list[_Request]) -> SamplingBatch:
        """The requests' settings stacked; the last step's while the requests are the same."""
        if self._batch is None or self._batch.requests != requests:
            self._batch = SamplingBatch.of(requests, self.vocab_size, self.device)
        return self._batch

    def _draft_length(self, decodes: list[Tokens]) -> int:
        """How many tokens to draft for these decoding sequences: 0 to decode plainly (no
        proposer, a penalised request, or a request one token from its end)."""
        if self.proposer is None or not decodes:
            return 0
        if any(self._requests[seq].params.penalised for seq in decodes):
            return 0
        room = min(seq.max_len - len(seq.tokens) for seq in decodes)
        return max(0, min(self.speculative_tokens, room - 1))

    def _speculate(self, decodes: list[Tokens], proposed: list[list[int]], k: int) -> None:
        """Verify each sequence's drafts (padded to k) in one forward; keep what `accept`
        keeps."""
        drafts = [
            (row + [seq.tokens[-1]] * k)[:k] for seq, row in zip(decodes, proposed, strict=True)
        ]
        logits = self.runner.verify(decodes, drafts)
        requests = [self._requests[seq] for seq in decodes]
        batch = self._sampling(requests)
        kept, chosen = accept(logits, torch.tensor(drafts, device=self.device), batch)
        logprobs = logits.float().log_softmax(dim=-1) if batch.logprobs else None
        self.drafted_tokens += sum(map(len, proposed))
        self.accepted_tokens += sum(
            min(len(row) - 1, len(draft)) for row, draft in zip(kept, proposed, strict=True)
        )
        finished = self._emit(requests, kept, chosen, logprobs)
        for seq, tokens, request in zip(decodes, kept, requests, strict=True):
            if request not in finished:
                self.scheduler.computed(seq, len(tokens))

    def _emit(
        self,
        requests: list[_Request],
        kept: list[list[int]],
        tokens: torch.Tensor,
        logprobs: torch.Tensor | None,
    ) -> list[_Request]:
        """Append and deliver each request's new tokens (kept[i]; tokens (n, width) and
        logprobs (n, width, vocab) by position), one position at a time; release and return
        those that finish."""
        finished: list[_Request] = []
        batch = self._sampling(requests)
        token_bytes = self.tokenizer.token_bytes
        if all(len(row) == 1 for row in kept):  # a plain step: one token each
            for request, row in zip(requests, kept, strict=True):
                request.seq.tokens.append(row[0])
            done = deliver(
                requests,
                tokens[:, 0],
                None if logprobs is None else logprobs[:, 0],
                batch.top_n,
                token_bytes,
            )
            for request in done:
                self._release(request)
            return done
        for j in range(max(len(row) for row in kept)):
            live = [i for i, r in enumerate(requests) if len(kept[i]) > j and r not in finished]
            if not live:
                break
            for i in live:
                requests[i].seq.tokens.append(kept[i][j])
            index = torch.tensor(live, device=self.device)
            done = deliver(
                [requests[i] for i in live],
                tokens[index, j],
                None if logprobs is None else logprobs[index, j],
                batch.top_n,
                token_bytes,
            )
            for request in done:
                self._release(request)
            finished += done
        return finished

    def _release(self, request: _Request) -> None:
        self.scheduler.finish(request.seq)
        del self._requests[request.seq]
        if self.proposer is not None:
            self.proposer.forget(request.seq)

    def _abort(self, requests: list[_Request]) -> None:
        for request in requests:
            self._release(request)
            finish(request, "abort")

    def _fail_running(self, error: Exception) -> None:
        for seq in list(self.scheduler.running):
            request = self._requests[seq]
            self._release(request)
            request.handle._fail(error)


def serving_engine(
    model: Transformer,
    tokenizer: Any,
    max_batch_size: int,
    compile: bool,
    speculative: str | None,
    device: torch.device | str = "cpu",
) -> Engine:
    """The engine `lmforge generate` and `lmforge serve` run: the weights laid out for this
    CPU's decode kernels and `max_batch_size` rows, and `speculative` ("ngram", a smaller
    checkpoint's folder, or None) as its drafter."""
    return Engine(
        model,
        tokenizer,
        max_batch_size=max_batch_size,
        compile=compile,
        relayout_weights=True,
        speculative=load_drafter(speculative, device),
    )
