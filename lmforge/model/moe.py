"""Mixtral-style sparse mixture of experts: a top-k router over SwiGLU experts.

Each token's router logits pick its `top_k` experts; their outputs are mixed with the softmax of
those k logits (Mixtral's order: top-k first, then softmax). Dispatch groups the tokens by expert,
runs each expert once on its group and adds the weighted results back with `index_add_`, so an
expert costs FLOPs only for the tokens routed to it. Parameter names (`router`,
`experts.N.{gate,up,down}_proj`) follow Mixtral's `block_sparse_moe` layout one to one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.model.layers import Linear, SwiGLU


class MoE(nn.Module):
    """y = Σ over the token's top-k experts e of softmax(top-k logits)_e · expert_e(x)."""

    def __init__(self, d_model: int, d_ff: int, n_experts: int, top_k: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.router = Linear(d_model, n_experts)
        self.experts = nn.ModuleList(SwiGLU(d_model, d_ff) for _ in range(n_experts))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Expert ids (N, k) and mixing weights (N, k) for tokens x of shape (N, d_model)."""
        logits, experts = self.router(x).topk(self.top_k, dim=-1)
        return experts, F.softmax(logits, dim=-1, dtype=torch.float32).to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        experts, weights = self.route(x)
        # One row per (token, choice), sorted by expert so each expert's tokens are contiguous.
        order = experts.flatten().argsort(stable=True)
        tokens = order // self.top_k
        counts = torch.bincount(experts.flatten(), minlength=len(self.experts)).tolist()
        y = torch.zeros_like(x)
        for expert, rows, idx in zip(
            self.experts, order.split(counts), tokens.split(counts), strict=True
        ):
            if len(idx):
                out = expert(x[idx]) * weights.flatten()[rows, None]
                y.index_add_(0, idx, out)
        return y.reshape(shape)
