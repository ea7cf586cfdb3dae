"""The OpenAI API's request bodies (validated with pydantic), response bodies and error format.

Requests accept OpenAI's fields plus the engine's extra sampling knobs as top-level body fields
(`top_k`, `min_p`, `repetition_penalty`, as vLLM does: the `openai` client sends them through
`extra_body`), and for chat lmforge's own `truncate`. Unknown fields are ignored. Responses are
plain dicts shaped as OpenAI's. The bodies of vLLM's tokenizer routes (`/tokenize`,
`/detokenize`) live here too.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from lmforge.infer.engine import SamplingParams
from lmforge.tokenizer.chat_template import Message

# OpenAI allows 4 stop strings; like vLLM, more are accepted: lm-eval's API backends send a
# task's `until` plus the end-of-text token (HumanEval's 5 + 1).
MAX_STOPS = 16
MAX_LOGPROBS = 20  # alternatives per token, as OpenAI and vLLM allow


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingRequest(BaseModel):
    """The fields both generation endpoints share, and the engine parameters they make."""

    model_config = ConfigDict(extra="ignore")

    model: str
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    n: int = Field(1, ge=1, le=16)
    stop: str | Annotated[list[str], Field(max_length=MAX_STOPS)] | None = None
    seed: int | None = Field(None, ge=0, lt=2**63)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    stream: bool = False
    stream_options: StreamOptions | None = None
    # The engine's knobs beyond OpenAI's; top_k <= 0 means off, as in vLLM.
    top_k: int | None = None
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float = Field(1.0, gt=0)

    def stops(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return tuple(s for s in stops if s)

    def sampling(
        self,
        max_tokens: int,
        index: int,
        stop: tuple[str, ...] = (),
        stop_ids: tuple[int, ...] = (),
    ) -> SamplingParams:
        """The engine's parameters for choice `index` (seeded choices get seeds seed, seed+1...)."""
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_k=self.top_k if self.top_k and self.top_k > 0 else None,
            top_p=self.top_p if self.top_p < 1 else None,
            min_p=self.min_p or None,
            repetition_penalty=self.repetition_penalty,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            stop=self.stops() + stop,
            stop_ids=stop_ids,
            seed=None if self.seed is None else self.seed + index,
            logprobs=self.wants_logprobs(),
            top_logprobs=self.alternatives(),
        )

    def wants_logprobs(self) -> bool:
        raise NotImplementedError

    def alternatives(self) -> int:
        """How many of the likeliest tokens each token's log-probabilities come with."""
        return 0

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int = Field(16, ge=0)  # 0 only with echo: score the prompt, generate nothing
    # The chosen tokens' log-probabilities and, from 1 up, the `logprobs` likeliest tokens'.
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False  # the prompt comes first in the text and (with logprobs) the tokens

    def wants_logprobs(self) -> bool:
        return self.logprobs is not None

    def alternatives(self) -> int:
        return self.logprobs or 0


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None

    def message(self) -> Message:
        parts = self.content if isinstance(self.content, list) else [self.content or ""]
        text = "".join(p if isinstance(p, str) else p.text for p in parts)
        return Message("system" if self.role == "developer" else self.role, text)


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = None
    # lmforge's extension: "oldest" leaves out the oldest messages (a leading system message
    # stays) until prompt + max_tokens fits the context window, as `lmforge chat` does.
    truncate: Literal["oldest"] | None = None

    @field_validator("top_logprobs")
    @classmethod
    def _no_alternatives(cls, top_logprobs: int | None) -> int | None:
        return _chosen_only(top_logprobs)

    def wants_logprobs(self) -> bool:
        return self.logprobs

    def requested_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def _chosen_only(alternatives: int | None) -> int | None:
    if alternatives:
        raise ValueError(
            "only the chosen tokens' log-probabilities are returned, not alternatives: pass 0"
        )
    return alternatives


# -- responses ---------------------------------------------------------------------------------


class TokenizeRequest(BaseModel):
    """vLLM's `POST /tokenize`: the ids start with `<|endoftext|>`, as lmforge starts every
    document, whatever `add_special_tokens` says (accepted for vLLM's clients); special-token
    text in the prompt becomes its id."""

    model_config = ConfigDict(extra="ignore")

    prompt: str
    add_special_tokens: bool = True
    model: str | None = None


class DetokenizeRequest(BaseModel):
    """vLLM's `POST /detokenize`."""

    model_config = ConfigDict(extra="ignore")

    tokens: list[int]
    model: str | None = None


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def envelope(object_id: str, kind: str, model: str, choices: list[dict], **extra: Any) -> dict:
    return {
        "id": object_id,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        **extra,
    }


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def completion_logprobs(
    tokens: list[str],
    logprobs: list[float | None],
    offset: int,
    top: list[dict[str, float] | None] | None = None,
) -> dict:
    """The legacy completions format: parallel lists of tokens, their log-probabilities, the
    likeliest tokens at each position ({token: logprob}, or None throughout when not asked
    for) and where each token starts in the text. An echoed prompt's first token has None."""
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": logprobs,
        "top_logprobs": top,
        "text_offset": offsets,
    }


def chat_logprobs(tokens: list[bytes], logprobs: list[float]) -> dict:
    return {
        "content": [
            {
                "token": token.decode("utf-8", errors="replace"),
                "logprob": logprob,
                "bytes": list(token),
                "top_logprobs": [],
            }
            for token, logprob in zip(tokens, logprobs, strict=True)
        ]
    }
