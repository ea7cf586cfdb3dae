"""Inference: KV caches, sampling, the batching engine, beam search and text completion.

Names import their module (and torch) on first use, so `infer/command.py` adds its commands
without torch.
"""

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
    "generate": "lmforge.infer.single_prompt",
    "stream": "lmforge.infer.single_prompt",
    "complete": "lmforge.infer.text",
    "prompt_ids": "lmforge.infer.text",
    "stream_text": "lmforge.infer.text",
}

__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
