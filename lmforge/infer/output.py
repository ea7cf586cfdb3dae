"""The engine's output side: each request's events as they come, its result, and how a step's
tokens become them.

`RequestHandle` is what a caller holds: it iterates the request's `TokenEvent`s (blocking or
asyncio), cancels it or waits for its `Completion`. `deliver` hands one step's sampled tokens to
their requests on the engine's thread: log-probabilities, UTF-8 text released as characters
complete, stop tokens and stop strings, the length limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from lmforge.infer.text_assembler import TextAssembler


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
    cached_tokens: int = 0  # prompt tokens whose keys and values came from the prefix cache


class RequestHandle:
    """One submitted request: its events as they come, a way to cancel it, its result."""

    def __init__(self, cancel: Callable[[RequestHandle], None]) -> None:
        self._cancel = cancel
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
        self._cancel(self)

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens found in the prefix cache (known once the request finished)."""
        return self._completion.cached_tokens if self._completion is not None else 0

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


class Delivered(Protocol):
    """What delivering tokens asks of a request."""

    params: Any  # lmforge.infer.engine.SamplingParams
    handle: RequestHandle
    text: TextAssembler
    stops: frozenset[int]
    prompt_tokens: int
    cached_tokens: int
    logprobs: list[float]
    top: list[list[tuple[int, float]]]

    @property
    def token_ids(self) -> list[int]: ...


def deliver(
    requests: list[Delivered],
    tokens: torch.Tensor,
    logprobs: torch.Tensor | None,
    top_n: int,
    token_bytes: Callable[[int], bytes],
) -> list[Delivered]:
    """Hand each request its newly sampled token (already appended to its token_ids) as an
    event; return those that are now finished. `logprobs` (n, vocab): the rows' log-softmax."""
    ids = tokens.tolist()
    chosen = top_ids = top_values = None
    if logprobs is not None:
        chosen = logprobs.gather(-1, tokens[:, None])[:, 0].tolist()
    if top_n:
        values, top = logprobs.topk(top_n, dim=-1)
        top_ids, top_values = top.tolist(), values.tolist()
    finished = []
    for i, (request, token) in enumerate(zip(requests, ids, strict=True)):
        logprob = alternatives = None
        if request.params.logprobs:
            logprob = chosen[i]
            request.logprobs.append(logprob)
            if n := request.params.top_logprobs:
                alternatives = list(zip(top_ids[i][:n], top_values[i][:n], strict=True))
                request.top.append(alternatives)
        reason = None
        if token in request.stops:
            reason, text = "stop", ""
        else:
            text = request.text.push(token_bytes(token))
            if request.text.stopped:
                reason = "stop"
            elif len(request.token_ids) == request.params.max_tokens:
                reason = "length"
        if reason is None:
            request.handle._push(TokenEvent(token, text, logprob, None, alternatives))
        else:
            text += request.text.flush()
            event = TokenEvent(token, text, logprob, reason, alternatives)
            request.handle._push(event, completion(request, reason))
            finished.append(request)
    return finished


def finish(request: Delivered, reason: str) -> None:
    """End a request that stops without a token of its own (aborted, or the engine closed)."""
    text = request.text.flush()
    request.handle._push(TokenEvent(-1, text, None, reason), completion(request, reason))


def completion(request: Delivered, reason: str) -> Completion:
    top = request.params.logprobs and request.params.top_logprobs
    return Completion(
        token_ids=list(request.token_ids),
        text=request.text.text,
        logprobs=list(request.logprobs) if request.params.logprobs else None,
        finish_reason=reason,
        prompt_tokens=request.prompt_tokens,
        top_logprobs=list(request.top) if top else None,
        cached_tokens=request.cached_tokens,
    )
