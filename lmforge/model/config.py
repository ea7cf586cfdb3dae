"""The model's shape and options: a torch-free dataclass, so configs load without torch."""

from __future__ import annotations

from dataclasses import dataclass

from lmforge.errors import LmforgeError


@dataclass
class ModelConfig:
    vocab_size: int = 4096
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None  # None: as many as n_heads (plain multi-head attention)
    d_ff: int | None = None  # None: 8/3 · d_model rounded up to a multiple of 64
    max_seq_len: int = 256
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    n_experts: int = 0  # above 0: every block's MLP is a sparse mixture of this many experts
    experts_per_token: int = 2  # top-k experts each token is routed to

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def ffn_dim(self) -> int:
        if self.d_ff is not None:
            return self.d_ff
        return -(-8 * self.d_model // (3 * 64)) * 64

    def validate(self) -> None:
        sizes = ("vocab_size", "d_model", "n_layers", "n_heads", "max_seq_len")
        for name in (*sizes, "n_kv_heads", "d_ff"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise LmforgeError(f"model.{name} is {value}: set it to a positive integer")
        for name in ("rope_theta", "norm_eps"):
            if not getattr(self, name) > 0:
                raise LmforgeError(f"model.{name} is {getattr(self, name)}: set it above 0")
        if self.n_experts < 0 or (
            self.n_experts and not 1 <= self.experts_per_token <= self.n_experts
        ):
            raise LmforgeError(
                f"model.n_experts={self.n_experts}, model.experts_per_token="
                f"{self.experts_per_token}: use n_experts 0 (dense) or 1 <= experts_per_token "
                "<= n_experts"
            )
        if self.d_model % self.n_heads:
            raise LmforgeError(
                f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}: "
                "pick n_heads dividing d_model"
            )
        if self.n_heads % self.kv_heads:
            raise LmforgeError(
                f"model.n_heads={self.n_heads} is not divisible by "
                f"model.n_kv_heads={self.kv_heads}: pick n_kv_heads dividing n_heads"
            )
        if self.head_dim % 2:
            raise LmforgeError(
                f"head_dim = d_model / n_heads = {self.head_dim} is odd but RoPE needs it even: "
                "change d_model or n_heads"
            )
