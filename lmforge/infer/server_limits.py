"""What `lmforge serve` guards before a request reaches the engine: the API key, the size of a
request body, how many requests may wait for a batch slot, and the caps on prompt and reply.

`Guard` is ASGI middleware around the FastAPI app. With an API key (`--api-key`, or the
LMFORGE_API_KEY environment variable, as vLLM's `--api-key` and VLLM_API_KEY) every `/v1` route
wants `Authorization: Bearer <key>`, compared in constant time; the chat page at `/` and its
files are served without it, and the page asks for the key when the API answers 401. The
tokenizer routes stay open, as in vLLM. A body over `max_body_bytes` is refused with 413 before
it is parsed, and a generation request that finds `max_queue` requests already waiting for a
slot with 429 and a `Retry-After` header. Each refusal has OpenAI's error shape.

`check_request` (called by the routes, which know the prompt's length) refuses a prompt over
`max_prompt_tokens` and a `max_tokens` over its cap with 400.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from lmforge.errors import LmforgeError
from lmforge.infer.openai_schema import error_body

API_KEY_ENV = "LMFORGE_API_KEY"
GENERATION_ROUTES = frozenset({"/v1/completions", "/v1/chat/completions"})
LOOPBACK_NAMES = frozenset({"localhost"})

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass
class ServerLimits:
    """The server's guards; None for a cap means the model's context window is the only one."""

    api_key: str | None = None
    max_body_bytes: int = 4 * 2**20  # 4 MiB: a full 128k-token prompt as JSON ids fits
    max_prompt_tokens: int | None = None
    max_tokens: int | None = None
    max_queue: int = 256  # requests waiting for a batch slot (not yet admitted)
    retry_after_s: int = 1  # what a 429's Retry-After header asks a client to wait

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_prompt_tokens", "max_tokens", "retry_after_s"):
            value = getattr(self, name)
            if value is not None and value < 1:
                flag = name.replace("_", "-")
                raise LmforgeError(f"--{flag} {value} is invalid: use 1 or more")
        if self.max_queue < 0:
            raise LmforgeError(f"--max-queue {self.max_queue} is invalid: use 0 or more")
        if self.api_key == "":
            raise LmforgeError("the API key is empty: pass a non-empty --api-key, or none")

    @classmethod
    def from_env(cls, api_key: str | None = None, **limits: Any) -> ServerLimits:
        """Limits with `api_key`, else the LMFORGE_API_KEY environment variable's (if set)."""
        return cls(api_key=api_key or os.environ.get(API_KEY_ENV) or None, **limits)

    def authorized(self, header: str | None) -> bool:
        """Whether an `Authorization` header carries the key (always, without a key)."""
        if self.api_key is None:
            return True
        scheme, _, token = (header or "").partition(" ")
        # compare_digest's time does not depend on where the strings first differ
        return scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode(), self.api_key.encode()
        )


class LimitError(Exception):
    """A request the limits refuse: its HTTP status and OpenAI-shaped body."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.param, self.code = status, param, code


def check_request(limits: ServerLimits, n_prompt: int, max_tokens: int | None, param: str) -> None:
    """Refuse (LimitError, 400) a prompt longer than max_prompt_tokens or a max_tokens above
    the server's cap. `max_tokens` None: the client asked for none (the server picks)."""
    cap = limits.max_prompt_tokens
    if cap is not None and n_prompt > cap:
        raise LimitError(
            400,
            f"the {param} holds {n_prompt} tokens, more than this server's limit of {cap} "
            f"(--max-prompt-tokens): shorten the {param}",
            param,
            "context_length_exceeded",
        )
    cap = limits.max_tokens
    if cap is not None and max_tokens is not None and max_tokens > cap:
        raise LimitError(
            400,
            f"max_tokens={max_tokens} is above this server's limit of {cap} (--max-tokens): "
            f"ask for {cap} or fewer",
            "max_tokens",
        )


def is_loopback(host: str) -> bool:
    """Whether `host` binds loopback alone (127.0.0.0/8, ::1, localhost)."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a hostname: it may resolve to anything


def exposure_warning(host: str, limits: ServerLimits) -> str | None:
    """The one-line warning for a server reachable beyond this machine without a key."""
    if limits.api_key is not None or is_loopback(host):
        return None
    return (
        f"warning: serving on {host} without an API key: anyone who reaches this address can "
        f"use the model; pass --api-key (or set {API_KEY_ENV}), or bind 127.0.0.1"
    )


class Guard:
    """ASGI middleware: the API key on `/v1`, the body size, and the waiting-queue bound."""

    def __init__(self, app: Asgi, limits: ServerLimits, queued: Callable[[], int]) -> None:
        self.app, self.limits, self.queued = app, limits, queued

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        limits = self.limits
        if (path == "/v1" or path.startswith("/v1/")) and not limits.authorized(
            headers.get("authorization")
        ):
            await _refuse(
                send,
                401,
                "no valid API key: send the server's key as 'Authorization: Bearer <key>'",
                code="invalid_api_key",
                headers={"www-authenticate": "Bearer"},
            )
            return
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limits.max_body_bytes:
            await _too_large(send, limits.max_body_bytes)
            return
        body, more = bytearray(), scope["method"] in ("POST", "PUT", "PATCH")
        while more:  # read the body here, so that a chunked one is bounded too
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > limits.max_body_bytes:
                await _too_large(send, limits.max_body_bytes)
                return
        if path in GENERATION_ROUTES and self.queued() >= limits.max_queue:
            await _refuse(
                send,
                429,
                f"{self.queued()} requests are waiting for the model already (--max-queue "
                f"{limits.max_queue}): retry after {limits.retry_after_s} s",
                kind="requests",
                code="rate_limit_exceeded",
                headers={"retry-after": str(limits.retry_after_s)},
            )
            return
        await self.app(scope, _replay(bytes(body), receive), send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the read body once, then the client's own messages (the
    disconnect the routes watch for)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _too_large(send: Send, limit: int) -> None:
    await _refuse(
        send,
        413,
        f"the request body is larger than this server's limit of {limit} bytes "
        "(--max-body-bytes): send a shorter prompt",
        code="request_too_large",
    )


async def _refuse(
    send: Send,
    status: int,
    message: str,
    kind: str = "invalid_request_error",
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> None:
    payload = json.dumps(error_body(message, kind, None, code)).encode()
    raw = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        *((k.encode(), v.encode()) for k, v in (headers or {}).items()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})
