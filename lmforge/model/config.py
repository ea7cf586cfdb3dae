"""The model's shape and options: a torch-free dataclass, so configs load without torch."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from lmforge.config_ranges import AT_LEAST_1, NON_NEGATIVE, POSITIVE, check_fields, ranged
from lmforge.errors import LmforgeError


@dataclass
class ModelConfig:
    vocab_size: int = ranged(4096, AT_LEAST_1)
    d_model: int = ranged(256, AT_LEAST_1)
    n_layers: int = ranged(4, AT_LEAST_1)
    n_heads: int = ranged(4, AT_LEAST_1)
    n_kv_heads: int | None = ranged(None, AT_LEAST_1)  # None: as many as n_heads
    d_ff: int | None = ranged(None, AT_LEAST_1)  # None: 8/3 · d_model rounded up to 64s
    max_seq_len: int = ranged(256, AT_LEAST_1)
    rope_theta: float = ranged(10000.0, POSITIVE)
    norm_eps: float = ranged(1e-5, POSITIVE)
    tie_embeddings: bool = False
    n_experts: int = ranged(0, NON_NEGATIVE)  # above 0: every MLP is a mixture of this many
    experts_per_token: int = ranged(2, AT_LEAST_1)  # top-k experts each token is routed to
    # The mixture's options (model/moe.py); the defaults are Mixtral's router.
    moe_router: str = "softmax"  # "softmax" | "sigmoid": how the fp32 logits become scores
    moe_renormalize: bool = True  # the k chosen weights are rescaled to sum to 1
    # None: dropless; else each expert takes ceil(cf·N·k/E) rows in training (never at inference)
    moe_capacity_factor: float | None = None
    moe_drop_policy: str = "probability"  # over capacity keep "probability" (highest), "position"
    moe_aux_loss_coef: float = 0.0  # Switch load-balancing loss weight
    moe_z_loss_coef: float = 0.0  # router z-loss weight
    moe_bias_update_rate: float = 0.0  # above 0: DeepSeek-V3's auxiliary-loss-free balance bias
    moe_shared_experts: int = 0  # always-on experts added to every token's output
    moe_expert_d_ff: int | None = None  # None: d_ff (fine-grained experts: smaller)

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

    @property
    def expert_ffn_dim(self) -> int:
        """The hidden width of each routed (and each shared) expert."""
        return self.ffn_dim if self.moe_expert_d_ff is None else self.moe_expert_d_ff

    def validate(self) -> None:
        check_fields(self, "model")
        if self.n_experts and self.experts_per_token > self.n_experts:
            raise LmforgeError(
                f"model.n_experts={self.n_experts}, model.experts_per_token="
                f"{self.experts_per_token}: use n_experts 0 (dense) or 1 <= experts_per_token "
                "<= n_experts"
            )
        self._validate_moe()
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

    def _validate_moe(self) -> None:
        choices = {
            "moe_router": ("softmax", "sigmoid"),
            "moe_drop_policy": ("probability", "position"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise LmforgeError(
                    f"model.{name} is {getattr(self, name)!r}: set it to one of "
                    + ", ".join(allowed)
                )
        if not isinstance(self.moe_renormalize, bool):
            raise LmforgeError(
                f"model.moe_renormalize is {self.moe_renormalize!r}: set it to true or false"
            )
        cf = self.moe_capacity_factor
        if cf is not None and not (isinstance(cf, (int, float)) and 0 < cf < math.inf):
            raise LmforgeError(
                f"model.moe_capacity_factor is {cf}: set it above 0, or none for dropless routing"
            )
        for name in ("moe_aux_loss_coef", "moe_z_loss_coef", "moe_bias_update_rate"):
            if not 0 <= getattr(self, name) < math.inf:
                raise LmforgeError(f"model.{name} is {getattr(self, name)}: set it to 0 or above")
        if self.moe_shared_experts < 0:
            raise LmforgeError(
                f"model.moe_shared_experts is {self.moe_shared_experts}: set it to 0 or above"
            )
        if self.moe_expert_d_ff is not None and self.moe_expert_d_ff <= 0:
            raise LmforgeError(
                f"model.moe_expert_d_ff is {self.moe_expert_d_ff}: set it to a positive integer, "
                "or none for d_ff"
            )
        if not self.n_experts:
            for f in fields(self):
                if f.name.startswith("moe_") and getattr(self, f.name) != f.default:
                    raise LmforgeError(
                        f"model.{f.name} is set but model.n_experts=0 (a dense MLP): set "
                        "n_experts above 0 or leave the moe_ options at their defaults"
                    )
