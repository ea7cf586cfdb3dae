"""The Llama-style model: layers, attention, RoPE and the Transformer with its config.

Names import their module (and torch) on first use; ModelConfig is torch-free.
"""

from lmforge.lazy import lazy_exports

_EXPORTS = {
    "Attention": "lmforge.model.attention",
    "Embedding": "lmforge.model.layers",
    "Linear": "lmforge.model.layers",
    "RMSNorm": "lmforge.model.layers",
    "SwiGLU": "lmforge.model.layers",
    "RotaryEmbedding": "lmforge.model.rope",
    "apply_rope": "lmforge.model.rope",
    "Block": "lmforge.model.transformer",
    "Transformer": "lmforge.model.transformer",
    "ModelConfig": "lmforge.model.config",
    "Cache": "lmforge.model.cache",
    "KVCache": "lmforge.model.cache",
}

__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
