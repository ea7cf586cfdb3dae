"""The inference engine: continuous batching of requests over a preallocated slot KV cache.

Requests wait in a FIFO queue and are admitted into free batch slots between decode steps, as
long as their prompt + max_tokens fits the KV-token budget. An admitted prompt is prefilled in
one forward pass into its slot; then each decode step runs every slot at once (static shapes,
optionally compiled), every slot at its own position, and samples one token per active request
with that request's own settings and random generator. Finished and cancelled requests free
their slot and budget at once. A background thread runs this loop; callers hold a
RequestHandle to iterate its tokens (blocking or asyncio), cancel it or wait for its result.

Scoring jobs (`score`, `submit_score`: log-likelihoods of continuations, lmforge.infer.score)
and weight loads (`load_weights`: an RL trainer's new weights, copied in place) queue beside
the requests and run on the same thread between decode steps, since that thread alone runs the
model; their result or error comes back through a concurrent Future. Requests admitted together
with the same prompt (n samples of one prompt) share one prefill: the first one's KV slot is
copied into the others'.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from lmforge.device.capability import use_compile
from lmforge.errors import LmforgeError
from lmforge.infer.kv_cache import SlotKVCache
from lmforge.infer.sampling import apply_penalties, check_sampling_args, filter_logits
from lmforge.infer.score import TokenScores, score
from lmforge.infer.text import TextAssembler
from lmforge.infer.weight_layouts import lay_out_for_decode

if TYPE_CHECKING:
    from lmforge.model.transformer import Transformer


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


@dataclass
class TokenEvent:
    token_id: int  # -1 on the event that reports an abort
    text: str  # newly released UTF-8 text; "" while a character or a stop prefix is pending
    logprob: float | None
    finish_reason: str | None  # None until the last event: "stop" | "length" | "abort"
    top: list[tuple[int, float]] | None = None  # top_logprobs (id, logprob), most likely first


@dataclass
class Completion:
    token_ids: list[int]
    text: str
    logprobs: list[float] | None
    finish_reason: str
    prompt_tokens: int
    top_logprobs: list[list[tuple[int, float]]] | None = None


class RequestHandle:
    """One submitted request: its events as they come, a way to cancel it, its result."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._events: list[TokenEvent] = []
        self._done = threading.Condition()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
        self._completion: Completion | None = None
        self._error: BaseException | None = None
        self.cancelled = False

    def __iter__(self) -> Iterator[TokenEvent]:
        seen = 0
        while True:
            with self._done:
                self._done.wait_for(lambda n=seen: len(self._events) > n or self._error)
                event = self._next(seen)
            seen += 1
            yield event
            if event.finish_reason is not None:
                return

    async def __aiter__(self) -> AsyncIterator[TokenEvent]:
        loop = asyncio.get_running_loop()
        seen = 0
        while True:
            with self._done:
                ready = len(self._events) > seen or self._error is not None
                if not ready:
                    wakeup = loop.create_future()
                    self._waiters.append((loop, wakeup))
            if not ready:
                await wakeup
                continue
            event = self._next(seen)
            seen += 1
            yield event
            if event.finish_reason is not None:
                return

    def cancel(self) -> None:
        """Stop generating; the slot and its KV budget are freed before the next step."""
        self._engine._cancel(self)

    def result(self) -> Completion:
        """The finished request (blocks until then)."""
        for _ in self:
            pass
        assert self._completion is not None
        return self._completion

    def _next(self, seen: int) -> TokenEvent:
        if seen < len(self._events):
            return self._events[seen]
        assert self._error is not None
        raise self._error

    def _push(self, event: TokenEvent, completion: Completion | None = None) -> None:
        """Called by the scheduler thread: one more event, and the result with the last one."""
        self._record(event, completion, None)

    def _fail(self, error: BaseException) -> None:
        self._record(None, None, error)

    def _record(
        self, event: TokenEvent | None, completion: Completion | None, error: BaseException | None
    ) -> None:
        with self._done:
            if event is not None:
                self._events.append(event)
            self._completion = completion or self._completion
            self._error = error or self._error
            waiters, self._waiters = self._waiters, []
            self._done.notify_all()
        for loop, wakeup in waiters:
            with contextlib.suppress(RuntimeError):  # that event loop has closed meanwhile
                loop.call_soon_threadsafe(_wake, wakeup)


def _wake(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


@dataclass(eq=False)
class _Request:
    prompt: list[int]
    params: SamplingParams
    handle: RequestHandle
    generator: torch.Generator
    stops: frozenset[int]
    text: TextAssembler
    slot: int = -1
    position: int = 0  # where the next fed token goes in the slot's cache
    decoding: bool = False  # prefilled and not finished
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)

    @property
    def kv_tokens(self) -> int:
        return len(self.prompt) + self.params.max_tokens

    def uniform(self) -> torch.Tensor:
        """The next number in [0, 1) of this request's own random stream, shape (1,)."""
        return torch.rand(1, generator=self.generator, device=self.generator.device)


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


@dataclass
class _Batch:
    """The sampling settings of some requests, stacked as (n, 1) columns; None: no row uses it."""

    requests: list[_Request]
    rows: torch.Tensor  # their slots
    temperature: torch.Tensor  # 1 where greedy, to divide safely
    sampled: list[int]  # rows that sample (temperature > 0); the others take the argmax
    sampled_rows: torch.Tensor  # the same, as an index tensor
    top_k: torch.Tensor | None
    top_p: torch.Tensor | None
    min_p: torch.Tensor | None
    penalties: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    logprobs: bool
    top_n: int  # the most top_logprobs any row asks for

    @classmethod
    def of(cls, requests: list[_Request], vocab_size: int, device: torch.device) -> _Batch:
        params = [r.params for r in requests]

        def column(values: list[Any], dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device)[:, None]

        def optional(values: list[Any], off: Any, dtype=torch.float32) -> torch.Tensor | None:
            sampled = [v for v, p in zip(values, params, strict=True) if p.temperature > 0]
            if all(v is None or v == off for v in sampled):
                return None
            return column([off if v is None else v for v in values], dtype)

        penalties = None
        if any(p.penalised for p in params):
            penalties = (
                column([p.repetition_penalty for p in params]),
                column([p.frequency_penalty for p in params]),
                column([p.presence_penalty for p in params]),
            )
        sampled = [i for i, p in enumerate(params) if p.temperature > 0]
        return cls(
            requests=requests,
            rows=torch.tensor([r.slot for r in requests], dtype=torch.long, device=device),
            temperature=column([p.temperature or 1.0 for p in params]),
            sampled=sampled,
            sampled_rows=torch.tensor(sampled, dtype=torch.long, device=device),
            top_k=optional([p.top_k for p in params], vocab_size, torch.long),
            top_p=optional([p.top_p for p in params], 1.0),
            min_p=optional([p.min_p for p in params], 0.0),
            penalties=penalties,
            logprobs=any(p.logprobs for p in params),
            top_n=max(p.top_logprobs if p.logprobs else 0 for p in params),
        )


class Engine:
    """Continuous batching over `max_batch_size` slots of a preallocated KV cache.

    The cache holds max_batch_size × max_context positions; `max_kv_tokens` caps how many of
    them admitted requests may reserve together (prompt + max_tokens each).

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
    ) -> None:
        if max_batch_size < 1:
            raise LmforgeError(f"max_batch_size={max_batch_size} is invalid: use 1 or more")
        if device is not None:
            model.to(device)
        compile = use_compile(compile, model.tok_embeddings.weight.device)
        self.weight_layout = "row-major"
        if relayout_weights:
            self.weight_layout = lay_out_for_decode(model, max_batch_size, compile)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        capacity = max_batch_size * self.max_context
        self.max_kv_tokens = capacity if max_kv_tokens is None else max_kv_tokens
        if self.max_kv_tokens < 1:
            raise LmforgeError(f"max_kv_tokens={max_kv_tokens} is invalid: use 1 or more")
        self.device = model.tok_embeddings.weight.device
        self.vocab_size = model.config.vocab_size
        self._specials = frozenset(getattr(tokenizer, "special_tokens", {}).values())
        self.cache = SlotKVCache(model, max_batch_size)

        n, v, dev = max_batch_size, self.vocab_size, self.device
        self._tokens = torch.zeros(n, 1, dtype=torch.long, device=dev)  # each slot's next input
        self._token_rows = [self._tokens[:rows] for rows in range(n + 1)]
        self._active = torch.zeros(n, dtype=torch.long, device=dev)  # 1 where a slot decodes
        self._seen = torch.zeros(n, v, dtype=torch.bool, device=dev)  # for repetition penalty
        self._counts = torch.zeros(n, v, device=dev)  # generated tokens, for OpenAI penalties
        self._slots: list[_Request | None] = [None] * n
        self._batch: _Batch | None = None  # the decoding requests' settings, in slot order
        self._step = self._compiled() if compile else self._forward

        self._queue: deque[_Request] = deque()
        self._jobs: list[_Job] = []
        self._cancelled: list[RequestHandle] = []
        self._reserved = 0
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._seeds = random.Random()

    @property
    def max_context(self) -> int:
        return self.model.config.max_seq_len

    @property
    def busy_slots(self) -> int:
        """Batch slots held by admitted requests (prefilled or decoding)."""
        return sum(r is not None for r in self._slots)

    @property
    def queued_requests(self) -> int:
        """Requests submitted and waiting for a batch slot (not yet admitted)."""
        return len(self._queue)

    @property
    def reserved_kv_tokens(self) -> int:
        """KV positions promised to admitted requests (prompt + max_tokens each)."""
        return self._reserved

    # ---- the public, thread-safe side -----------------------------------------------------

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> RequestHandle:
        """Queue a request; its tokens arrive through the returned handle."""
        params.validate(self.max_context)
        self._check_prompt(prompt_ids, params)
        handle = RequestHandle(self)
        seed = self._seeds.getrandbits(63) if params.seed is None else params.seed
        request = _Request(
            prompt=list(prompt_ids),
            params=params,
            handle=handle,
            generator=torch.Generator(self.device).manual_seed(seed),
            stops=frozenset(params.stop_ids) | self._specials,
            text=TextAssembler(params.stop),
        )
        self._enqueue(lambda: self._queue.append(request))
        return handle

    def submit_score(
        self, requests: Sequence[tuple[Sequence[int], Sequence[int]]], top_n: int = 0
    ) -> Future[list[TokenScores]]:
        """Queue a scoring job (lmforge.infer.score.score of the engine's model) that the
        engine's thread runs between decode steps. The Future gives the scores or the error;
        `await asyncio.wrap_future(future)` waits without blocking an event loop, and
        cancelling the Future before the job starts drops it."""
        if not 0 <= top_n <= self.vocab_size:
            raise LmforgeError(f"top_n={top_n} is invalid: use 0 .. {self.vocab_size}")
        pairs = [(list(context), list(continuation)) for context, continuation in requests]
        for i, (context, continuation) in enumerate(pairs):
            if not all(0 <= t < self.vocab_size for t in context + continuation):
                raise LmforgeError(
                    f"scoring request {i} has token ids outside the model's vocabulary of "
                    f"{self.vocab_size}: encode it with the model's own tokenizer"
                )
        job = _Job(lambda model: score(model, pairs, top_n), Future())
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
        handles = [self.submit(p, s) for p, s in zip(prompts, params, strict=True)]
        return [h.result() for h in handles]

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
            if self._queue or self.busy_slots:
                raise LmforgeError(
                    "the engine is serving requests: wait for their results before loading "
                    "new weights"
                )
            for name, tensor in ours.items():
                tensor.copy_(theirs[name])

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
        if len(prompt_ids) + params.max_tokens > self.max_kv_tokens:
            raise LmforgeError(
                f"prompt of {len(prompt_ids)} tokens + max_tokens={params.max_tokens} exceed "
                f"max_kv_tokens={self.max_kv_tokens}: raise the cap or shorten the request"
            )

    def _cancel(self, handle: RequestHandle) -> None:
        with self._wake:
            handle.cancelled = True
            self._cancelled.append(handle)
            self._wake.notify()

    # ---- the scheduler thread --------------------------------------------------------------

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                with self._wake:
                    self._wake.wait_for(
                        lambda: (
                            self._closed
                            or self._queue
                            or self._cancelled
                            or self._batch
                            or self._jobs
                        )
                    )
                    if self._closed:
                        break
                    cancelled, self._cancelled = self._cancelled, []
                    jobs, self._jobs = self._jobs, []
                    self._drop_queued(cancelled)
                    admitted = self._admit()
                try:
                    self._retire([r for r in self._slots if r and r.handle in cancelled], "abort")
                    if admitted:
                        self._prefill(admitted)
                    if self._batch is not None:
                        self._decode()
                except Exception as error:  # the requests in flight fail; the engine goes on
                    self._fail_running(error)
                for job in jobs:
                    job.run(self.model)
        with self._wake:
            queued, self._queue = list(self._queue), deque()
            jobs, self._jobs = self._jobs, []
        self._retire([r for r in self._slots if r is not None], "abort")
        for request in queued:
            self._finish(request, "abort")
        for job in jobs:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(LmforgeError("the engine closed before running this"))

    def _drop_queued(self, cancelled: list[RequestHandle]) -> None:
        for request in [r for r in self._queue if r.handle in cancelled]:
            self._queue.remove(request)
            self._finish(request, "abort")

    def _admit(self) -> list[_Request]:
        """Pop queued requests, in order, while a slot is free and the KV budget allows."""
        admitted = []
        free = [i for i, r in enumerate(self._slots) if r is None]
        while (
            self._queue
            and free
            and self._reserved + self._queue[0].kv_tokens <= (self.max_kv_tokens)
        ):
            request = self._queue.popleft()
            request.slot = free.pop(0)
            self._slots[request.slot] = request
            self._reserved += request.kv_tokens
            admitted.append(request)
        return admitted

    def _prefill(self, requests: list[_Request]) -> None:
        """Each admitted prompt in one forward into its request's slot, then its first token.
        A prompt equal to one prefilled just before it (GRPO's G samples of one prompt, `n`
        completions) copies that slot's keys and values and logits instead of recomputing them."""
        done: dict[tuple[int, ...], tuple[int, torch.Tensor]] = {}
        finished = []
        for request in requests:
            key = tuple(request.prompt)
            if key in done:
                source, logits = done[key]
                self.cache.copy_slot(source, request.slot, len(request.prompt))
            else:
                ids = torch.tensor([request.prompt], dtype=torch.long, device=self.device)
                logits = self.model(ids, self.cache.slot(request.slot), last_only=True)[:, -1]
                done[key] = (request.slot, logits)
            finished += self._first_token(request, logits)
        self._rebatch()
        self._retire(finished)

    def _first_token(self, request: _Request, logits: torch.Tensor) -> list[_Request]:
        """Sample a prefilled request's first token; [request] when that already finishes it."""
        slot = request.slot
        if request.params.penalised:
            self._seen[slot] = False
            self._seen[slot, torch.tensor(request.prompt, device=self.device)] = True
            self._counts[slot] = 0
        request.position = len(request.prompt)
        batch = _Batch.of([request], self.vocab_size, self.device)
        tokens = self._sample(logits, batch)
        self._tokens[slot, 0] = tokens[0]
        finished = self._deliver(batch, tokens)
        if not finished:
            request.decoding = True
            self._active[slot] = 1
        return finished

    def _compiled(self) -> Any:
        """The decode step compiled once per row count (1, 2, 4, ... slots); the number of keys
        attended is symbolic (SlotKVCache.use), so a growing context does not recompile."""
        shapes = self.max_batch_size.bit_length() + 1
        # isolate_recompiles: this engine's variants count against its own limit, not those of
        # every engine's step (one code object).
        return torch.compile(
            self._forward, dynamic=False, recompile_limit=shapes, isolate_recompiles=True
        )

    def _forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """One decode step of the cache's first rows: logits (rows, vocab) of their next tokens."""
        return self.model(tokens, self.cache)[:, -1]

    def _decode(self) -> None:
        batch = self._batch
        assert batch is not None
        kv_len = max(r.position for r in batch.requests) + 1
        last_slot = max(r.slot for r in batch.requests)
        n_rows = min(self.max_batch_size, 1 << last_slot.bit_length())  # 1, 2, 4, 8, ...
        self.cache.use(n_rows, kv_len)
        logits = self._step(self._token_rows[n_rows])
        if len(batch.requests) < n_rows:
            logits = logits[batch.rows]
        tokens = self._sample(logits, batch)
        self.cache.positions.add_(self._active)
        self._tokens[batch.rows, 0] = tokens
        for request in batch.requests:
            request.position += 1
        self._retire(self._deliver(batch, tokens))

    def _sample(self, logits: torch.Tensor, batch: _Batch) -> torch.Tensor:
        """One token per row of logits (n, vocab), each with its own request's settings."""
        logits = logits.float()
        if batch.logprobs:
            self._logprobs = logits.log_softmax(dim=-1)
        if batch.penalties is not None:
            rows = batch.rows
            logits = apply_penalties(logits, self._seen[rows], self._counts[rows], *batch.penalties)
        tokens = logits.argmax(dim=-1)
        if batch.sampled:
            scaled = filter_logits(
                logits / batch.temperature, batch.top_k, batch.top_p, batch.min_p
            )
            rows = batch.sampled_rows
            # Inverse-CDF sampling: one uniform from each request's own generator (drawing a
            # whole row of noise, or multinomial, per request costs ~100x more on a CPU).
            u = torch.cat([batch.requests[i].uniform() for i in batch.sampled])
            cdf = scaled[rows].softmax(dim=-1).cumsum(dim=-1)
            picked = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]
            tokens[rows] = picked.clamp(max=cdf.shape[-1] - 1)
        if batch.penalties is not None:
            self._seen[batch.rows, tokens] = True
            self._counts[batch.rows, tokens] += 1
        return tokens

    def _deliver(self, batch: _Batch, tokens: torch.Tensor) -> list[_Request]:
        """Hand each request its token; return those that are now finished."""
        ids = tokens.tolist()
        logprobs = top_ids = top_values = None
        if batch.logprobs:
            logprobs = self._logprobs.gather(-1, tokens[:, None])[:, 0].tolist()
        if batch.top_n:
            values, top = self._logprobs.topk(batch.top_n, dim=-1)
            top_ids, top_values = top.tolist(), values.tolist()
        finished = []
        for i, (request, token) in enumerate(zip(batch.requests, ids, strict=True)):
            request.token_ids.append(token)
            logprob = alternatives = None
            if request.params.logprobs:
                logprob = logprobs[i]
                request.logprobs.append(logprob)
                if n := request.params.top_logprobs:
                    alternatives = list(zip(top_ids[i][:n], top_values[i][:n], strict=True))
                    request.top.append(alternatives)
            reason = None
            if token in request.stops:
                reason, text = "stop", ""
            else:
                text = request.text.push(self.tokenizer.token_bytes(token))
                if request.text.stopped:
                    reason = "stop"
                elif len(request.token_ids) == request.params.max_tokens:
                    reason = "length"
            if reason is None:
                request.handle._push(TokenEvent(token, text, logprob, None, alternatives))
            else:
                text += request.text.flush()
                request.handle._push(
                    TokenEvent(token, text, logprob, reason, alternatives),
                    self._completion(request, reason),
                )
                finished.append(request)
        return finished

    def _retire(self, requests: list[_Request], reason: str | None = None) -> None:
        """Free the slots and KV budget of finished requests; `reason` first finishes them."""
        if not requests:
            return
        for request in requests:
            if reason is not None:
                self._finish(request, reason)
            self._slots[request.slot] = None
            request.decoding = False
            self._active[request.slot] = 0
            self.cache.positions[request.slot] = 0
        with self._wake:
            self._reserved -= sum(r.kv_tokens for r in requests)
        self._rebatch()

    def _rebatch(self) -> None:
        decoding = [r for r in self._slots if r is not None and r.decoding]
        self._batch = _Batch.of(decoding, self.vocab_size, self.device) if decoding else None
        for r in decoding:
            self.cache.positions[r.slot] = r.position

    def _finish(self, request: _Request, reason: str) -> None:
        text = request.text.flush()
        completion = self._completion(request, reason)
        request.handle._push(TokenEvent(-1, text, None, reason), completion)

    def _completion(self, request: _Request, reason: str) -> Completion:
        return Completion(
            token_ids=list(request.token_ids),
            text=request.text.text,
            logprobs=list(request.logprobs) if request.params.logprobs else None,
            finish_reason=reason,
            prompt_tokens=len(request.prompt),
            top_logprobs=list(request.top)
            if request.params.logprobs and request.params.top_logprobs
            else None,
        )

    def _fail_running(self, error: Exception) -> None:
        running = [r for r in self._slots if r is not None]
        for request in running:
            request.handle._fail(error)
        self._retire(running)
