"""Inference: KV caches, sampling, the batching engine, beam search and text completion."""

from lmforge.infer.beam import Beam, beam_search
from lmforge.infer.engine import Completion, Engine, RequestHandle, SamplingParams, TokenEvent
from lmforge.infer.generate import generate, stream
from lmforge.infer.kv_cache import KVCache
from lmforge.infer.sampling import sample_next_token
from lmforge.infer.text import complete, prompt_ids, stream_text

__all__ = [
    "Beam",
    "Completion",
    "Engine",
    "KVCache",
    "RequestHandle",
    "SamplingParams",
    "TokenEvent",
    "beam_search",
    "complete",
    "generate",
    "prompt_ids",
    "sample_next_token",
    "stream",
    "stream_text",
]
