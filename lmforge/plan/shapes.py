"""ModelShape: the handful of numbers the planner reads, and where they come from.

A shape is built from anything with a `ModelConfig`'s attributes (duck typing, so the planner
never imports torch); preset names and TOML run configs become shapes in
lmforge.planner_inputs, outside the planner. Two families:
- `llama`: what lmforge's Transformer builds (RMSNorm, RoPE, SwiGLU or a sparse MoE of SwiGLU
  experts, no biases), so every lmforge preset plans as exactly the model it trains;
- `gpt2`: the published GPT-2 (learned positions, LayerNorm and linear biases, a 4·d GELU MLP,
  tied embeddings). `gpt2-124m` names this shape in the planner, so its count equals the
  published 124,439,808; lmforge's own Llama-style training preset of that name plans as
  `lmforge-gpt2-124m`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

FAMILIES = ("llama", "gpt2")


@dataclass(frozen=True)
class ModelShape:
    name: str
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    tie_embeddings: bool = False
    n_experts: int = 0  # 0: a dense MLP; else d_ff is each expert's width
    experts_per_token: int = 2
    shared_experts: int = 0  # experts every token runs besides its routed ones
    family: str = "llama"
    max_seq_len: int = 2048  # gpt2: the rows of the learned position table

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def active_experts(self) -> int:
        """MLPs a token runs per block: 1 for a dense model, routed plus shared for a MoE."""
        return self.experts_per_token + self.shared_experts if self.n_experts else 1

    @property
    def block_experts(self) -> int:
        """MLPs a block holds: 1 for a dense model, routed plus shared for a MoE."""
        return self.n_experts + self.shared_experts if self.n_experts else 1


def from_model_config(name: str, cfg: object) -> ModelShape:
    """The shape of lmforge's Transformer built from `cfg` (a ModelConfig or look-alike)."""
    return ModelShape(
        name=name,
        vocab_size=cfg.vocab_size,
        d_model=cfg.d_model,
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
        n_kv_heads=cfg.kv_heads,
        d_ff=cfg.expert_ffn_dim if getattr(cfg, "n_experts", 0) else cfg.ffn_dim,
        tie_embeddings=cfg.tie_embeddings,
        n_experts=getattr(cfg, "n_experts", 0),
        experts_per_token=getattr(cfg, "experts_per_token", 2),
        shared_experts=getattr(cfg, "moe_shared_experts", 0) if getattr(cfg, "n_experts", 0) else 0,
        max_seq_len=cfg.max_seq_len,
    )


def gpt2(name: str, d_model: int, n_layers: int, n_heads: int) -> ModelShape:
    return ModelShape(
        name=name,
        vocab_size=50257,
        d_model=d_model,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_heads,
        d_ff=4 * d_model,
        tie_embeddings=True,
        family="gpt2",
        max_seq_len=1024,
    )


# Published shapes the planner knows beyond lmforge's presets (Radford et al. 2019).
PUBLISHED = {"gpt2-124m": lambda: gpt2("gpt2-124m", 768, 12, 12)}
LMFORGE_PREFIX = "lmforge-"  # `lmforge-gpt2-124m`: the lmforge preset a published name shadows


def with_kv_heads(shape: ModelShape, n_kv_heads: int) -> ModelShape:
    return dataclasses.replace(shape, n_kv_heads=n_kv_heads)
