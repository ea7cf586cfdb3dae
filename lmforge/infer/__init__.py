"""Inference: KV cache, sampling, autoregressive generation and text completion."""

from lmforge.infer.generate import generate, stream
from lmforge.infer.kv_cache import KVCache
from lmforge.infer.sampling import sample_next_token
from lmforge.infer.text import complete, prompt_ids, stream_text

__all__ = [
    "KVCache",
    "complete",
    "generate",
    "prompt_ids",
    "sample_next_token",
    "stream",
    "stream_text",
]
