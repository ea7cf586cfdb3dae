"""Inference: KV caches, sampling, the batching engine, beam search and text completion.

Names import their module (and torch) on first use, except `generate` and `stream`: a lazy
name equal to its submodule's (`lmforge.infer.generate`) would be shadowed by that module
once anything imports it.
"""

from lmforge.infer.generate import generate, stream
from lmforge.lazy import lazy_exports

_EXPORTS = {
    "Beam": "lmforge.infer.beam",
    "beam_search": "lmforge.infer.beam",
    "Completion": "lmforge.infer.engine",
    "Engine": "lmforge.infer.engine",
    "RequestHandle": "lmforge.infer.engine",
    "SamplingParams": "lmforge.infer.engine",
    "TokenEvent": "lmforge.infer.engine",
    "KVCache": "lmforge.infer.kv_cache",
    "sample_next_token": "lmforge.infer.sampling",
    "complete": "lmforge.infer.text",
    "prompt_ids": "lmforge.infer.text",
    "stream_text": "lmforge.infer.text",
}

__all__ = ["generate", "stream", *_EXPORTS]
__getattr__ = lazy_exports(__name__, _EXPORTS)
