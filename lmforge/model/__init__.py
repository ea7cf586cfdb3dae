"""The Llama-style model: layers, attention, RoPE and the Transformer with its config."""

from lmforge.model.attention import Attention
from lmforge.model.layers import Embedding, Linear, RMSNorm, SwiGLU
from lmforge.model.rope import RotaryEmbedding, apply_rope
from lmforge.model.transformer import Block, ModelConfig, Transformer

__all__ = [
    "Attention",
    "Block",
    "Embedding",
    "Linear",
    "ModelConfig",
    "RMSNorm",
    "RotaryEmbedding",
    "SwiGLU",
    "Transformer",
    "apply_rope",
]
