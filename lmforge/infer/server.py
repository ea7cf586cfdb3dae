"""The OpenAI-compatible HTTP server and the web chat page, over one continuous-batching Engine.

Routes: `GET /v1/models`, `POST /v1/completions`, `POST /v1/chat/completions` and the chat page
at `/`; vLLM's tokenizer routes `GET /tokenizer_info`, `POST /tokenize` and `POST /detokenize`,
which lm-evaluation-harness's `tokenizer_backend=remote` uses. With `"stream": true` a reply
comes as server-sent events, one `data: {chunk}` per piece of text, a last chunk with the finish
reason, then `data: [DONE]`. Each choice of each prompt is one engine request, batched by the
engine with everything else in flight; a client that disconnects mid-stream cancels its
requests, which frees their batch slots.

Completions take `echo` and `logprobs` up to 20, as OpenAI's legacy API and vLLM do: the
generated tokens' alternatives come from the engine as it samples; an echoed prompt is scored
by an engine scoring job (`Engine.submit_score`), and `max_tokens: 0` with `echo` scores the
prompt only (lm-eval's log-likelihoods are `echo` + `logprobs: 1` + `max_tokens: 1`).

Errors follow OpenAI's format, `{"error": {"message", "type", "param", "code"}}`: 400 for bad
JSON, invalid fields and prompts that do not fit the context window (or the server's
`--max-prompt-tokens` and `--max-tokens` caps), 404 for an unknown model or route; 401 without
the API key, 413 for a body too large and 429 when too many requests wait come from
lmforge.infer.server_limits, which guards the app. Nothing is truncated unless a chat request
opts in with lmforge's `"truncate": "oldest"`: then the oldest messages are left out as in
`lmforge chat`, and the response's `x-lmforge-dropped-messages` header says how many.
"""

from __future__ import annotations

import asyncio
import errno
import json
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException

from lmforge.errors import LmforgeError
from lmforge.infer import openai_schema as api
from lmforge.infer.engine import (
    Engine,
    RequestHandle,
    SamplingParams,
    TokenEvent,
    serving_engine,
)
from lmforge.infer.score import BATCH_TOKENS
from lmforge.infer.server_limits import (
    Guard,
    LimitError,
    ServerLimits,
    check_request,
    exposure_warning,
)
from lmforge.infer.text import prompt_ids
from lmforge.infer.weight_layouts import load_for_decode
from lmforge.tokenizer.chat_template import ChatTemplate, ReplyStripper, check_messages
from lmforge.tokenizer.tokenizer import EOT
from lmforge.tokens.encode import document_start

if TYPE_CHECKING:
    from lmforge.tokenizer import Tokenizer

STATIC = Path(__file__).with_name("static")
# How many messages a chat request with "truncate" left out (0 when the whole conversation fits).
DROPPED_HEADER = "x-lmforge-dropped-messages"


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.body = status, api.error_body(message, kind, param, code)


Alternatives = list[tuple[int, float]]  # (token id, logprob), most likely first


@dataclass
class _Echo:
    """An echoed prompt: its text, and with logprobs its tokens' scores (the first token has
    none: nothing precedes it) and where the generated tokens' text offsets start."""

    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    top: list[Alternatives | None] = field(default_factory=list)
    end: int = 0  # the length of its tokens' texts together


@dataclass
class _Choice:
    """One engine request of an API call and the output it has produced so far."""

    index: int
    handle: RequestHandle | None  # None when there is nothing to generate (max_tokens 0)
    stripper: ReplyStripper
    alternatives: int = 0  # how many likeliest tokens each token's logprobs list
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[Alternatives] = field(default_factory=list)
    finish_reason: str | None = None
    reported: int = 0  # tokens whose log-probabilities a stream chunk has carried
    echo: _Echo | None = None
    prompt: int = 0  # which of the call's prompts it continues

    def add(self, event: TokenEvent) -> str:
        """Record one event; return its new reply text."""
        if event.token_id >= 0:  # an abort's event carries no token
            self.token_ids.append(event.token_id)
        if event.logprob is not None:
            self.logprobs.append(event.logprob)
        if event.top is not None:
            self.top.append(event.top)
        piece = self.stripper.feed(event.text)
        self.text += piece
        self.finish_reason = event.finish_reason
        return piece

    def new_tokens(self) -> tuple[list[int], list[float], list[Alternatives]]:
        """Tokens (with log-probabilities and alternatives) not yet reported in a stream chunk."""
        start, self.reported = self.reported, len(self.token_ids)
        return self.token_ids[start:], self.logprobs[start:], self.top[start:]


@dataclass
class _Job:
    """The engine requests behind one API call, and their events merged as they arrive."""

    choices: list[_Choice]
    prompt_tokens: int
    _tasks: list[asyncio.Task] = field(default_factory=list)

    async def events(self) -> AsyncIterator[tuple[_Choice, str]]:
        live = [c for c in self.choices if c.handle is not None]
        if len(live) <= 1:
            for choice in live:
                async for event in choice.handle:  # type: ignore[union-attr]
                    yield choice, choice.add(event)
            return
        queue: asyncio.Queue[tuple[_Choice, TokenEvent | BaseException | None]] = asyncio.Queue()

        async def pump(choice: _Choice) -> None:
            try:
                async for event in choice.handle:
                    queue.put_nowait((choice, event))
            except Exception as e:
                queue.put_nowait((choice, e))
            finally:  # also when `cancel` stops it: the loop below must not wait for it forever
                queue.put_nowait((choice, None))

        self._tasks = [asyncio.create_task(pump(c)) for c in live]
        running = len(live)
        while running:
            choice, item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if item is None:
                running -= 1
                continue
            yield choice, choice.add(item)

    def cancel(self) -> None:
        """Stop the unfinished requests, which frees their batch slots."""
        for choice in self.choices:
            if choice.finish_reason is None and choice.handle is not None:
                choice.handle.cancel()
        for task in self._tasks:
            task.cancel()

    def usage(self) -> dict:
        """Token counts; cached: the prompt tokens whose keys and values the prefix cache held
        (the most any choice of a prompt found, for each prompt)."""
        cached: dict[int, int] = {}
        for c in self.choices:
            if c.handle is not None:
                cached[c.prompt] = max(cached.get(c.prompt, 0), c.handle.cached_tokens)
        completion = sum(len(c.token_ids) for c in self.choices)
        return api.usage(self.prompt_tokens, completion, sum(cached.values()))


class _EventStream(StreamingResponse):
    """Server-sent events of `job` that end as soon as the client disconnects, even while no
    token is ready to send, and then cancel the job's engine requests."""

    media_type = "text/event-stream"

    def __init__(
        self, events: AsyncIterator[str], job: _Job, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(events, headers={"Cache-Control": "no-cache", **(headers or {})})
        self.job = job

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async with anyio.create_task_group() as group:

            async def stop_on_disconnect() -> None:
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()

            group.start_soon(stop_on_disconnect)
            try:
                await self.stream_response(send)
            except OSError:
                pass  # the client went away while a chunk was being written
            finally:
                self.job.cancel()
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
                group.cancel_scope.cancel()


def _sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


class _Server:
    """Request handling shared by the routes: prompts to engine requests to response bodies."""

    def __init__(
        self, engine: Engine, tokenizer: Tokenizer, model_name: str, limits: ServerLimits
    ) -> None:
        self.engine, self.tokenizer, self.model_name = engine, tokenizer, model_name
        self.template = ChatTemplate(tokenizer)
        self.limits = limits

    def check_model(self, name: str) -> None:
        if name != self.model_name:
            raise ApiError(
                404,
                f"the model {name!r} does not exist: this server serves {self.model_name!r}",
                param="model",
                code="model_not_found",
            )

    def check_fits(self, n_prompt: int, max_tokens: int, param: str) -> None:
        limit = self.engine.max_context
        if n_prompt >= limit and max_tokens:
            raise ApiError(
                400,
                f"{n_prompt} tokens in the {param} leave no room to generate: the context window "
                f"holds {limit} tokens; shorten the {param}",
                param=param,
                code="context_length_exceeded",
            )
        if n_prompt + max_tokens > limit:
            raise ApiError(
                400,
                f"the context window holds {limit} tokens but this request needs "
                f"{n_prompt + max_tokens} ({n_prompt} in the {param}, {max_tokens} to generate): "
                f"shorten the {param} or lower max_tokens",
                param=param,
                code="context_length_exceeded",
            )

    def chat_prompt(self, body: api.ChatCompletionRequest) -> tuple[list[int], int]:
        """The prompt of the conversation and how many of its messages were left out: none,
        unless the request asks to truncate; then as `lmforge chat` does (`ChatTemplate.fit`)."""
        messages = [m.message() for m in body.messages]
        try:
            check_messages(messages)
        except LmforgeError as e:
            raise ApiError(400, str(e), param="messages") from e
        if not body.truncate:
            return self.template.prompt_ids(messages), 0
        limit, max_tokens = self.engine.max_context, body.requested_tokens() or 1
        if max_tokens >= limit:
            raise ApiError(
                400,
                f"max_tokens={max_tokens} leaves no room for the messages in the {limit}-token "
                "context window: lower max_tokens",
                param="max_tokens",
                code="context_length_exceeded",
            )
        try:
            return self.template.fit(messages, limit - max_tokens)
        except LmforgeError as e:
            raise ApiError(400, str(e), param="messages", code="context_length_exceeded") from e

    def completion_prompts(self, prompt: str | list) -> list[list[int]]:
        if isinstance(prompt, str):
            return [prompt_ids(self.tokenizer, prompt)]
        if not prompt:
            raise ApiError(400, "prompt is an empty list: send a string", param="prompt")
        if isinstance(prompt[0], int):
            prompt = [prompt]
        prompts = [p if isinstance(p, list) else prompt_ids(self.tokenizer, p) for p in prompt]
        vocab = self.tokenizer.vocab_size
        if any(not ids or not all(0 <= t < vocab for t in ids) for ids in prompts):
            raise ApiError(
                400, f"a token-id prompt is empty or has ids outside [0, {vocab})", param="prompt"
            )
        return prompts

    async def echoes(
        self, prompt: str | list, prompts: list[list[int]], logprobs: int | None
    ) -> list[_Echo]:
        """Each prompt to echo: its text (a text prompt as sent, token ids decoded) and, when
        logprobs are asked for, its tokens scored by engine jobs of at most BATCH_TOKENS
        (padded) tokens, awaited without blocking the event loop."""
        texts = [prompt] if isinstance(prompt, str) else list(prompt)
        if texts and isinstance(texts[0], int):
            texts = [texts]
        texts = [t if isinstance(t, str) else self.decode(t, "prompt") for t in texts]
        if logprobs is None:
            return [_Echo(text) for text in texts]
        requests = [(ids[:1], ids[1:]) for ids in prompts]
        futures = [self.engine.submit_score(chunk, logprobs) for chunk in _chunks(requests)]
        try:
            scores = [s for future in futures for s in await asyncio.wrap_future(future)]
        except LmforgeError as e:
            raise ApiError(400, str(e), param="prompt") from e
        finally:
            for future in futures:
                future.cancel()  # those not started yet, when one failed or the call is cancelled
        echoes = []
        for text, ids, scored in zip(texts, prompts, scores, strict=True):
            top = [None, *scored.top] if logprobs else []
            end = sum(len(_token_text(self.tokenizer, t)) for t in ids)
            echoes.append(_Echo(text, list(ids), [None, *scored.logprobs], top, end))
        return echoes

    def start(
        self,
        requests: list[tuple[list[int], SamplingParams]],
        prompt_tokens: int,
        strip: Callable[[], ReplyStripper],
    ) -> _Job:
        """Submit one engine request per choice (none for max_tokens 0: such a choice is done,
        at "length"); on a refused one, cancel those already sent."""
        choices: list[_Choice] = []
        try:
            prompts: dict[tuple[int, ...], int] = {}
            for index, (ids, params) in enumerate(requests):
                handle = self.engine.submit(ids, params) if params.max_tokens else None
                choice = _Choice(index, handle, strip(), params.top_logprobs)
                choice.prompt = prompts.setdefault(tuple(ids), len(prompts))
                choice.finish_reason = None if handle else "length"
                choices.append(choice)
        except LmforgeError as e:
            for choice in choices:
                if choice.handle is not None:
                    choice.handle.cancel()
            raise ApiError(400, str(e)) from e
        return _Job(choices, prompt_tokens)

    def tokenizer_info(self) -> dict:
        """vLLM's `/tokenizer_info`, as lm-eval's RemoteTokenizer reads it: `<|endoftext|>` is
        eos and bos (it starts every document, as the Hugging Face export's bos does)."""
        eot = EOT if self.tokenizer.eot_id is not None else None
        others = sorted(s for s in self.tokenizer.special_tokens if s != EOT)
        return {
            "tokenizer_class": "lmforge",
            "eos_token": eot,
            "bos_token": eot,
            "pad_token": None,
            "unk_token": None,
            "additional_special_tokens": others,
            "model_max_length": self.engine.max_context,
            "vocab_size": self.tokenizer.vocab_size,
            "chat_template": self.template.jinja(),
        }

    def tokenize(self, body: api.TokenizeRequest) -> dict:
        """vLLM's `/tokenize`: special-token text becomes its id, and the ids start a document
        (`<|endoftext|>` first, lmforge.tokens.encode.document_start) as a text prompt to
        /v1/completions does, whatever `add_special_tokens` says: lm-eval's remote tokenizer
        sends false, and its log-likelihoods then equal the hf backend's and `lmforge eval`'s."""
        self.check_optional_model(body.model)
        ids = document_start(
            self.tokenizer, self.tokenizer.encode(body.prompt, allowed_special="all")
        )
        limit = self.engine.max_context
        return {"count": len(ids), "max_model_len": limit, "tokens": ids, "token_strs": None}

    def detokenize(self, body: api.DetokenizeRequest) -> dict:
        self.check_optional_model(body.model)
        return {"prompt": self.decode(body.tokens, "tokens")}

    def check_optional_model(self, name: str | None) -> None:
        if name is not None:
            self.check_model(name)

    def decode(self, ids: list[int], param: str) -> str:
        vocab = self.tokenizer.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ApiError(400, f"{param}: token id {bad} is outside [0, {vocab})", param=param)
        try:
            return self.tokenizer.decode(ids)
        except LmforgeError as e:
            raise ApiError(400, f"{param}: {e}", param=param) from e


def _chunks(
    requests: list[tuple[list[int], list[int]]], budget: int = BATCH_TOKENS
) -> list[list[tuple[list[int], list[int]]]]:
    """Consecutive requests cut so that each chunk's rows x longest row stay within `budget`
    tokens (a single longer one goes alone): what one scoring forward pass holds."""
    chunks: list[list[tuple[list[int], list[int]]]] = []
    width = 0
    for request in requests:
        length = len(request[0]) + len(request[1])
        if chunks and (len(chunks[-1]) + 1) * max(width, length) <= budget:
            chunks[-1].append(request)
            width = max(width, length)
        else:
            chunks.append([request])
            width = length
    return chunks


def _token_text(tokenizer: Tokenizer, token: int) -> str:
    """A token's own text, as logprobs list it (the bytes of a cut character become U+FFFD;
    an id the model has but the tokenizer lacks, "")."""
    try:
        return tokenizer.token_bytes(token).decode("utf-8", errors="replace")
    except LmforgeError:
        return ""


class _Format:
    """How one endpoint shapes choices, stream chunks and the final body."""

    object = ""
    chunk_object = ""
    id_prefix = ""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def choice(self, choice: _Choice, logprobs: bool) -> dict:
        raise NotImplementedError

    def first_chunk(self, choice: _Choice, logprobs: bool) -> dict | None:
        return None

    def piece(self, choice: _Choice, text: str, logprobs: bool) -> dict:
        raise NotImplementedError

    def finish(self, choice: _Choice) -> dict:
        raise NotImplementedError


class _CompletionFormat(_Format):
    object = chunk_object = "text_completion"
    id_prefix = "cmpl"

    def _logprobs(
        self,
        choice: _Choice,
        ids: list[int],
        logprobs: list[float | None],
        top: list[Alternatives | None],
        offset: int,
    ) -> dict:
        tokens = [_token_text(self.tokenizer, t) for t in ids]
        tops = [self._top(t) for t in top] if choice.alternatives else None
        return api.completion_logprobs(tokens, logprobs, offset, tops)

    def _top(self, alternatives: Alternatives | None) -> dict[str, float] | None:
        """{token text: logprob}, most likely first; of two ids with one text, the likelier."""
        if alternatives is None:
            return None
        top: dict[str, float] = {}
        for token, logprob in alternatives:
            top.setdefault(_token_text(self.tokenizer, token), logprob)
        return top

    def choice(self, choice: _Choice, logprobs: bool) -> dict:
        echo = choice.echo or _Echo("")
        lp = None
        if logprobs:
            ids = echo.token_ids + choice.token_ids
            top = [*echo.top, *choice.top]
            lp = self._logprobs(choice, ids, [*echo.logprobs, *choice.logprobs], top, 0)
        text, reason = echo.text + choice.text, choice.finish_reason
        return {"index": choice.index, "text": text, "logprobs": lp, "finish_reason": reason}

    def first_chunk(self, choice: _Choice, logprobs: bool) -> dict | None:
        """The echoed prompt, when asked for, before the generated text."""
        echo = choice.echo
        if echo is None:
            return None
        lp = None
        if logprobs:
            lp = self._logprobs(choice, echo.token_ids, echo.logprobs, echo.top, 0)
        return {"index": choice.index, "text": echo.text, "logprobs": lp, "finish_reason": None}

    def piece(self, choice: _Choice, text: str, logprobs: bool) -> dict:
        offset = (choice.echo.end if choice.echo else 0) + len(choice.text) - len(text)
        lp = self._logprobs(choice, *choice.new_tokens(), offset) if logprobs else None
        return {"index": choice.index, "text": text, "logprobs": lp, "finish_reason": None}

    def finish(self, choice: _Choice) -> dict:
        reason = choice.finish_reason
        return {"index": choice.index, "text": "", "logprobs": None, "finish_reason": reason}


class _ChatFormat(_Format):
    object = "chat.completion"
    chunk_object = "chat.completion.chunk"
    id_prefix = "chatcmpl"

    def _logprobs(self, ids: list[int], logprobs: list[float]) -> dict:
        return api.chat_logprobs([self.tokenizer.token_bytes(t) for t in ids], logprobs)

    def choice(self, choice: _Choice, logprobs: bool) -> dict:
        return {
            "index": choice.index,
            "message": {"role": "assistant", "content": choice.text},
            "logprobs": self._logprobs(choice.token_ids, choice.logprobs) if logprobs else None,
            "finish_reason": choice.finish_reason,
        }

    def first_chunk(self, choice: _Choice, logprobs: bool) -> dict:
        delta = {"role": "assistant", "content": ""}
        return {"index": choice.index, "delta": delta, "logprobs": None, "finish_reason": None}

    def piece(self, choice: _Choice, text: str, logprobs: bool) -> dict:
        lp = self._logprobs(*choice.new_tokens()[:2]) if logprobs else None
        return {
            "index": choice.index,
            "delta": {"content": text},
            "logprobs": lp,
            "finish_reason": None,
        }

    def finish(self, choice: _Choice) -> dict:
        reason = choice.finish_reason
        return {"index": choice.index, "delta": {}, "logprobs": None, "finish_reason": reason}


async def _respond(
    job: _Job,
    fmt: _Format,
    body: api.SamplingRequest,
    model: str,
    request: Request,
    headers: dict[str, str] | None = None,
) -> Any:
    """The whole response body, or an event stream when the request asked for one."""
    logprobs = body.wants_logprobs()
    if not body.stream:
        watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
        try:
            async for _ in job.events():
                pass
        finally:
            watcher.cancel()
            job.cancel()
        choices = [fmt.choice(c, logprobs) for c in job.choices]
        object_id = api.new_id(fmt.id_prefix)
        reply = api.envelope(object_id, fmt.object, model, choices, usage=job.usage())
        return JSONResponse(reply, headers=headers)
    return _EventStream(_stream(job, fmt, logprobs, body.include_usage(), model), job, headers)


async def _cancel_on_disconnect(request: Request, job: _Job) -> None:
    """Once the body is read, the next ASGI message is the client's disconnect, if it comes."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.cancel()


async def _stream(
    job: _Job, fmt: _Format, logprobs: bool, include_usage: bool, model: str
) -> AsyncIterator[str]:
    object_id = api.new_id(fmt.id_prefix)

    def chunk(choices: list[dict], **extra: Any) -> str:
        return _sse(api.envelope(object_id, fmt.chunk_object, model, choices, **extra))

    try:
        for choice in job.choices:
            first = fmt.first_chunk(choice, logprobs)
            if first is not None:
                yield chunk([first])
            if choice.handle is None:  # nothing to generate (max_tokens 0): done already
                yield chunk([fmt.finish(choice)])
        async for choice, text in job.events():
            if text or logprobs:
                yield chunk([fmt.piece(choice, text, logprobs)])
            if choice.finish_reason is not None:
                yield chunk([fmt.finish(choice)])
        if include_usage:
            yield chunk([], usage=job.usage())
    except Exception as e:  # headers are sent: report in band, as OpenAI does
        yield _sse(api.error_body(f"generation failed: {e}", "server_error"))
    yield _sse("[DONE]")


def create_app(
    engine: Engine, tokenizer: Tokenizer, model_name: str, limits: ServerLimits | None = None
) -> FastAPI:
    """The FastAPI app serving `engine` as `model_name`, guarded by `limits` (default: no API
    key, the default caps); the caller owns (and closes) the engine."""
    app = FastAPI(title="lmforge", docs_url=None, redoc_url=None)
    limits = limits or ServerLimits()
    server = _Server(engine, tokenizer, model_name, limits)
    app.add_middleware(Guard, limits=limits, queued=lambda: engine.queued_requests)
    completion_format, chat_format = _CompletionFormat(tokenizer), _ChatFormat(tokenizer)
    _add_error_handlers(app)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [_model_card(model_name, engine)]}

    @app.get("/v1/models/{name}")
    async def model(name: str) -> dict:
        server.check_model(name)
        return _model_card(model_name, engine)

    @app.post("/v1/completions")
    async def completions(body: api.CompletionRequest, request: Request) -> Any:
        server.check_model(body.model)
        prompts = server.completion_prompts(body.prompt)
        if body.max_tokens == 0 and not body.echo:
            raise ApiError(
                400,
                "max_tokens=0 generates nothing: ask for 1 or more, or pass echo=true to "
                "score the prompt alone",
                param="max_tokens",
            )
        for ids in prompts:
            check_request(server.limits, len(ids), body.max_tokens, "prompt")
            server.check_fits(len(ids), body.max_tokens, "prompt")
        echoes = await server.echoes(body.prompt, prompts, body.logprobs) if body.echo else None
        requests = [
            (ids, body.sampling(body.max_tokens, k)) for ids in prompts for k in range(body.n)
        ]
        n_prompt = sum(len(ids) for ids in prompts)
        job = server.start(requests, n_prompt, lambda: ReplyStripper(""))
        if echoes:
            for choice in job.choices:  # prompt-major: n choices a prompt
                choice.echo = echoes[choice.index // body.n]
        return await _respond(job, completion_format, body, model_name, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: api.ChatCompletionRequest, request: Request) -> Any:
        server.check_model(body.model)
        template = server.template
        ids, dropped = server.chat_prompt(body)
        check_request(server.limits, len(ids), body.requested_tokens(), "messages")
        room = max(1, engine.max_context - len(ids))
        max_tokens = body.requested_tokens() or min(room, server.limits.max_tokens or room)
        server.check_fits(len(ids), max_tokens, "messages")
        stops = (template.stop, template.stop_ids)
        requests = [(ids, body.sampling(max_tokens, k, *stops)) for k in range(body.n)]
        job = server.start(requests, len(ids), template.reply_stripper)
        headers = {DROPPED_HEADER: str(dropped)} if body.truncate else None
        return await _respond(job, chat_format, body, model_name, request, headers)

    @app.get("/tokenizer_info")
    async def tokenizer_info() -> dict:
        return server.tokenizer_info()

    @app.post("/tokenize")
    async def tokenize(body: api.TokenizeRequest) -> dict:
        return server.tokenize(body)

    @app.post("/detokenize")
    async def detokenize(body: api.DetokenizeRequest) -> dict:
        return server.detokenize(body)

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


def _model_card(name: str, engine: Engine) -> dict:
    return {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "lmforge",
        "max_model_len": engine.max_context,
    }


def _add_error_handlers(app: FastAPI) -> None:
    def reply(status: int, message: str, kind: str, param: str | None = None) -> JSONResponse:
        return JSONResponse(api.error_body(message, kind, param), status_code=status)

    @app.exception_handler(ApiError)
    async def api_error(_request: Any, e: ApiError) -> JSONResponse:
        return JSONResponse(e.body, status_code=e.status)

    @app.exception_handler(LimitError)
    async def limit_error(_request: Any, e: LimitError) -> JSONResponse:
        body = api.error_body(str(e), "invalid_request_error", e.param, e.code)
        return JSONResponse(body, status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Any, e: RequestValidationError) -> JSONResponse:
        errors = e.errors()  # of a union field: one per member, type mismatches first
        error = next((x for x in errors if not x["type"].endswith("_type")), errors[0])
        if error["type"] == "json_invalid":
            detail = error.get("ctx", {}).get("error", "")
            return reply(
                400, f"the request body is not valid JSON ({detail})", "invalid_request_error"
            )
        param = ".".join(str(p) for p in error["loc"][1:] if not _union_member(p)) or None
        message = f"{param}: {error['msg']}" if param else f"the request body: {error['msg']}"
        return reply(400, message, "invalid_request_error", param)

    @app.exception_handler(HTTPException)
    async def http_error(_request: Any, e: HTTPException) -> JSONResponse:
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return reply(e.status_code, str(e.detail), kind)

    @app.exception_handler(Exception)
    async def server_error(_request: Any, e: Exception) -> JSONResponse:
        return reply(500, f"the server failed: {type(e).__name__}: {e}", "server_error")


def _union_member(loc: int | str) -> bool:
    """pydantic names the member of a union field that failed (`str`, `list[int]`) in `loc`."""
    return isinstance(loc, str) and (loc in ("str", "int", "float", "bool") or "[" in loc)


@contextmanager
def running(
    app: FastAPI, host: str = "127.0.0.1", port: int = 0, shutdown_timeout: float | None = None
) -> Iterator[str]:
    """Serve `app` with uvicorn from a background thread; yield its base URL (port 0: any free
    port). For tests and benchmarks: the server stops when the block ends, after the requests
    in flight finish (as `serve` drains them: at most `shutdown_timeout` seconds)."""
    import uvicorn

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        lifespan="off",
        timeout_graceful_shutdown=shutdown_timeout,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise LmforgeError(f"the server could not start on {host}:{port}: is the port taken?")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join()


def check_port(host: str, port: int) -> None:
    """Raise a one-line LmforgeError unless `host`:`port` can be bound now, as uvicorn binds it
    (IPv6 for a host with a colon, SO_REUSEADDR). The port is free again when this returns."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OverflowError as e:
            raise LmforgeError(f"port {port} is not a TCP port: pass --port 1..65535") from e
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise LmforgeError(
                    f"port {port} on {host} is already in use: stop what listens there, or "
                    "serve on another port with --port"
                ) from e
            raise LmforgeError(
                f"cannot listen on {host}:{port} ({e.strerror or e}): pass another --host or --port"
            ) from e


def serve(
    checkpoint: str | Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_batch_size: int = 8,
    model_name: str | None = None,
    device: str = "cpu",
    *,
    compile: bool = False,
    adapter: str | Path | None = None,
    limits: ServerLimits | None = None,
    shutdown_timeout: float = 30.0,
    speculative: str | None = None,
) -> None:
    """`lmforge serve`: load a checkpoint (and a LoRA adapter) and serve it until Ctrl-C.

    Ctrl-C (or SIGTERM) drains: the server stops accepting connections, the requests in flight
    finish for up to `shutdown_timeout` seconds, those still running then are cancelled, which
    aborts their engine requests, and the engine closes."""
    import uvicorn

    limits = limits or ServerLimits()
    check_port(host, port)  # before the model loads, and before the banner
    warning = exposure_warning(host, limits)
    if warning:
        print(warning, file=sys.stderr)
    model, tokenizer = load_for_decode(checkpoint, device, adapter)
    name = model_name or Path(checkpoint).resolve().name
    with serving_engine(model, tokenizer, max_batch_size, compile, speculative, device) as engine:
        app = create_app(engine, tokenizer, name, limits)
        key = ", API key required" if limits.api_key else ""
        print(f"serving {name!r} on http://{host}:{port} (chat page at /, API at /v1{key})")
        uvicorn.run(
            app,
            host=host,
            port=port,
            log_level="warning",
            timeout_graceful_shutdown=shutdown_timeout,
        )
