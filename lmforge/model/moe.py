"""Sparse mixture of experts: an fp32 router (top-k, capacity, balance) over stacked SwiGLU experts.

`MoE.forward` is route → sort the (token, choice) rows by expert → drop rows over capacity →
`experts(x_sorted, counts)` → weighted combine back to the tokens with `index_add_`, plus the
always-on shared experts. The router (fp32) turns logits into softmax or sigmoid scores, picks
each token's top k by score + `expert_bias` (the bias only chooses, DeepSeek-V3's auxiliary-loss
-free balance) and mixes the chosen experts with their scores, renormalised over the k by
default. The defaults are Mixtral's router: softmax, top-k, renormalise (= softmax of the k
logits), dropless. Capacity applies in training only, so at inference a token's output never
depends on the other sequences of its batch.

The experts are `GroupedExperts` (model/experts.py): stacked weights, grouped matmuls.

After each forward an MoE keeps its metrics (`last_counts`, `last_dropped`, `last_aux_loss`,
`last_z_loss`; the losses stay in the autograd graph). `moe_losses`, `moe_metrics` and
`update_biases` collect them over a model for the trainer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.model.experts import GroupedExperts
from lmforge.model.layers import Linear, SwiGLU

if TYPE_CHECKING:
    from lmforge.model.config import ModelConfig

# -- the layer ----------------------------------------------------------------------------


class Routing(NamedTuple):
    experts: torch.Tensor  # (N, k) int64: each token's chosen experts, best first
    weights: torch.Tensor  # (N, k) fp32: their mixing weights
    scores: torch.Tensor  # (N, E) fp32: softmax or sigmoid of the logits (no bias)
    logits: torch.Tensor  # (N, E) fp32


class MoE(nn.Module):
    """y = Σ over the token's kept top-k experts e of w_e · expert_e(x), plus shared experts."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        n_experts: int,
        top_k: int,
        *,
        router: str = "softmax",
        renormalize: bool = True,
        capacity_factor: float | None = None,
        drop_policy: str = "probability",
        aux_loss_coef: float = 0.0,
        z_loss_coef: float = 0.0,
        bias_update_rate: float = 0.0,
        shared_experts: int = 0,
    ) -> None:
        super().__init__()
        self.n_experts, self.top_k = n_experts, top_k
        self.router_kind, self.renormalize = router, renormalize
        self.capacity_factor, self.drop_policy = capacity_factor, drop_policy
        self.aux_loss_coef, self.z_loss_coef = aux_loss_coef, z_loss_coef
        self.bias_update_rate = bias_update_rate
        self.router = Linear(d_model, n_experts)
        self.experts = GroupedExperts(n_experts, d_model, d_ff)
        # n shared SwiGLUs of width d_ff summed equal one of width n·d_ff.
        self.shared_experts = SwiGLU(d_model, shared_experts * d_ff) if shared_experts else None
        bias = torch.zeros(n_experts) if bias_update_rate else None
        self.register_buffer("expert_bias", bias)
        # Rows routed to each expert since the last update_bias (training forwards only).
        pending = torch.zeros(n_experts, dtype=torch.int64) if bias_update_rate else None
        self.register_buffer("pending_counts", pending, persistent=False)
        self.last_counts: torch.Tensor | None = None
        self.last_dropped = 0.0
        self.last_aux_loss: torch.Tensor | None = None
        self.last_z_loss: torch.Tensor | None = None

    @classmethod
    def from_config(cls, config: ModelConfig) -> MoE:
        return cls(
            config.d_model,
            config.expert_ffn_dim,
            config.n_experts,
            config.experts_per_token,
            router=config.moe_router,
            renormalize=config.moe_renormalize,
            capacity_factor=config.moe_capacity_factor,
            drop_policy=config.moe_drop_policy,
            aux_loss_coef=config.moe_aux_loss_coef,
            z_loss_coef=config.moe_z_loss_coef,
            bias_update_rate=config.moe_bias_update_rate,
            shared_experts=config.moe_shared_experts,
        )

    def route(self, x: torch.Tensor) -> Routing:
        """The routing of tokens x (N, d_model), all in fp32."""
        logits = F.linear(x.float(), self.router.weight.float())
        scores = logits.softmax(-1) if self.router_kind == "softmax" else logits.sigmoid()
        choice = scores if self.expert_bias is None else scores + self.expert_bias.float()
        experts = choice.topk(self.top_k, dim=-1).indices
        weights = scores.gather(1, experts)
        if self.renormalize:
            weights = weights / weights.sum(-1, keepdim=True)
        return Routing(experts, weights, scores, logits)

    def capacity(self, n_tokens: int) -> int | None:
        """Rows each expert takes from n_tokens tokens in training: ceil(cf·N·k/E), or None."""
        if self.capacity_factor is None or not self.training:
            return None
        return math.ceil(self.capacity_factor * n_tokens * self.top_k / self.n_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        r = self.route(x)
        flat = r.experts.flatten()  # row i is (token i // k, choice i % k)
        counts = torch.bincount(flat, minlength=self.n_experts)
        order, kept = self._dispatch(flat, r.scores.gather(1, r.experts).flatten(), counts, len(x))
        tokens = order // self.top_k
        out = self.experts(x[tokens], kept)
        out = out * r.weights.flatten()[order, None].to(out.dtype)
        y = torch.zeros_like(x).index_add_(0, tokens, out.to(x.dtype))
        if self.shared_experts is not None:
            y = y + self.shared_experts(x)
        aux, z = self._balance_losses(r, counts)
        # An activation checkpoint's recompute runs inside backward: it records nothing twice.
        if torch._C._current_graph_task_id() == -1:
            self.last_counts, self.last_aux_loss, self.last_z_loss = counts.detach(), aux, z
            self.last_dropped = 1.0 - len(order) / flat.numel() if len(flat) else 0.0
            if self.pending_counts is not None and self.training:
                self.pending_counts += counts.detach()
        return y.reshape(shape)

    def _dispatch(
        self, flat: torch.Tensor, priority: torch.Tensor, counts: torch.Tensor, n_tokens: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The kept rows sorted by expert, and the kept rows per expert."""
        capacity = self.capacity(n_tokens)
        if capacity is None:
            return flat.argsort(stable=True), counts
        if self.drop_policy == "probability":
            # Within each expert the rows then run from the highest score down.
            by_score = priority.argsort(descending=True, stable=True)
            order = by_score[flat[by_score].argsort(stable=True)]
        else:
            order = flat.argsort(stable=True)  # within each expert in token order
        starts = counts.cumsum(0) - counts
        rank = torch.arange(len(order), device=flat.device) - starts[flat[order]]
        return order[rank < capacity], counts.clamp(max=capacity)

    def _balance_losses(
        self, r: Routing, counts: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Switch's E·Σ_e f_e·P_e and the z-loss mean(logsumexp(logits)²).

        f_e: the fraction of the N·k routed rows that chose e (before any drop); P_e: the mean
        router probability of e (sigmoid scores normalised per token to sum to 1).
        """
        probs = r.scores if self.router_kind == "softmax" else r.scores / r.scores.sum(-1, True)
        fraction = counts.to(probs.dtype) / max(r.experts.numel(), 1)
        aux = self.n_experts * (fraction * probs.mean(0)).sum()
        return aux, r.logits.logsumexp(-1).square().mean()

    @torch.no_grad()
    def update_bias(self, counts: torch.Tensor | None = None) -> None:
        """bias += rate · sign(mean(counts) − counts), from `counts` (E,) or the pending ones.

        Call after the optimizer step; pass counts all-reduced over the data ranks so every rank
        moves its bias alike. The pending counts restart from zero.
        """
        if self.expert_bias is None:
            raise LmforgeError(
                "this MoE has no balance bias: set model.moe_bias_update_rate above 0"
            )
        c = (self.pending_counts if counts is None else counts).to(self.expert_bias.device)
        c = c.float()
        self.expert_bias += self.bias_update_rate * torch.sign(c.mean() - c)
        self.pending_counts.zero_()


# -- over a model -------------------------------------------------------------------------


def moe_layers(model: nn.Module) -> list[MoE]:
    return [m for m in model.modules() if isinstance(m, MoE)]


def moe_losses(model: nn.Module) -> torch.Tensor:
    """Σ over the MoE blocks of aux_coef · aux loss + z_coef · z loss of their last forward.

    Add it to the loss before backward; a dense model (or zero coefficients) gives a 0 tensor.
    """
    device = next(model.parameters()).device
    total = torch.zeros((), device=device)
    for m in moe_layers(model):
        if m.aux_loss_coef and m.last_aux_loss is not None:
            total = total + m.aux_loss_coef * m.last_aux_loss
        if m.z_loss_coef and m.last_z_loss is not None:
            total = total + m.z_loss_coef * m.last_z_loss
    return total


def moe_metrics(model: nn.Module) -> dict[str, float | list[int]]:
    """The last forward's routing over all MoE blocks (empty for a dense model).

    `moe/counts`: rows routed to each expert, summed over the blocks; `moe/dropped`: the
    fraction of (token, choice) rows dropped for capacity; `moe/aux_loss`, `moe/z_loss`: the
    mean over the blocks, unweighted; `moe/bias_drift`: the largest |bias| of any block.
    """
    layers = [m for m in moe_layers(model) if m.last_counts is not None]
    if not layers:
        return {}
    counts = torch.stack([m.last_counts.cpu() for m in layers]).sum(0)
    drift = [m.expert_bias.abs().max().item() for m in layers if m.expert_bias is not None]
    return {
        "moe/counts": counts.tolist(),
        "moe/dropped": sum(m.last_dropped for m in layers) / len(layers),
        "moe/aux_loss": sum(m.last_aux_loss.item() for m in layers) / len(layers),
        "moe/z_loss": sum(m.last_z_loss.item() for m in layers) / len(layers),
        "moe/bias_drift": max(drift, default=0.0),
    }


def update_biases(
    model: nn.Module,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    mirror: nn.Module | None = None,
) -> None:
    """Nudge every balance bias of `model` from its pending counts, after an optimizer step.

    `reduce` gets the pending counts of all blocks as one (layers, E) int64 tensor and returns
    them summed over the data ranks (one all-reduce), so all ranks keep equal biases. `mirror`
    (the fp32 master of a compute copy) receives the updated biases.
    """
    layers = [m for m in moe_layers(model) if m.expert_bias is not None]
    if not layers:
        return
    counts = torch.stack([m.pending_counts for m in layers])
    if reduce is not None:
        counts = reduce(counts)
    for m, c in zip(layers, counts, strict=True):
        m.update_bias(c)
    if mirror is not None:
        targets = [m for m in moe_layers(mirror) if m.expert_bias is not None]
        with torch.no_grad():
            for target, m in zip(targets, layers, strict=True):
                target.expert_bias.copy_(m.expert_bias)
