"""Sparse mixture of experts: an fp32 router (top-k, capacity, balance) over stacked SwiGLU experts.

`MoE.forward` is route → sort the (token, choice) rows by expert → drop rows over capacity →
`experts(x_sorted, counts)` → weighted combine back to the tokens with `index_add_`, plus the
always-on shared experts. The router (fp32) turns logits into softmax or sigmoid scores, picks
each token's top k by score + `expert_bias` (the bias only chooses, DeepSeek-V3's auxiliary-loss
-free balance) and mixes the chosen experts with their scores, renormalised over the k by
default. The defaults are Mixtral's router: softmax, top-k, renormalise (= softmax of the k
logits), dropless. Capacity applies in training only, so at inference a token's output never
depends on the other sequences of its batch.

`GroupedExperts` holds the experts as STACKED parameters `gate_proj`/`up_proj` (E, d_ff, d_model)
and `down_proj` (E, d_model, d_ff); its forward depends only on those and its two arguments, so
expert parallelism (lmforge/parallel/expert_parallel.py) can shard dim 0 and wrap exactly that
call. Its matmuls use `torch._grouped_mm` where a one-time probe per device and dtype shows it
works (`grouped_mm_available`), else a per-expert loop: the one place that chooses the backend.

After each forward an MoE keeps its metrics (`last_counts`, `last_dropped`, `last_aux_loss`,
`last_z_loss`; the losses stay in the autograd graph). `moe_losses`, `moe_metrics` and
`update_biases` collect them over a model for the trainer.
"""

from __future__ import annotations

import concurrent.futures
import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import flop_registry, register_flop_formula

from lmforge.errors import LmforgeError
from lmforge.model.layers import Linear, SwiGLU

if TYPE_CHECKING:
    from lmforge.model.config import ModelConfig

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


# -- grouped matmul -----------------------------------------------------------------------


@functools.cache
def _probe(device_type: str, dtype: torch.dtype) -> bool:
    # In a thread of its own: the caller's autograd state (no_grad, inference mode, an
    # activation checkpoint's saved-tensor hooks) is per thread and must not touch the probe.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(_try_grouped_mm, device_type, dtype).result()


def _try_grouped_mm(device_type: str, dtype: torch.dtype) -> bool:
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        g = torch.Generator().manual_seed(0)
        a = torch.randn(24, 16, generator=g).to(device_type, dtype).requires_grad_()
        b = torch.randn(2, 16, 16, generator=g).to(device_type, dtype).requires_grad_()
        offs = torch.tensor([8, 24], dtype=torch.int32, device=device_type)
        out = torch._grouped_mm(a, b, offs=offs)
        ref = torch.cat([a[:8] @ b[0], a[8:] @ b[1]])
        out.backward(torch.ones_like(out))
        return bool(torch.allclose(out.float(), ref.float(), atol=1e-2, rtol=1e-2))
    except (RuntimeError, NotImplementedError, TypeError):
        return False


def grouped_mm_available(
    device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> bool:
    """Whether torch._grouped_mm runs forward and backward on this device type and dtype."""
    return _probe(torch.device(device).type, dtype)


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the upstream gradient contiguous (grouped mm requires it)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def _grouped_mm_flops(a_shape, b_shape, *_, **__) -> int:
    """Every row of a meets one (K, N) matrix, whatever the grouping: 2·numel(a)·N."""
    return 2 * math.prod(a_shape) * b_shape[-1]


# FlopCounterMode (the planner's tests, MFU checks) does not know grouped mm by itself.
if hasattr(torch.ops.aten, "_grouped_mm") and torch.ops.aten._grouped_mm not in flop_registry:
    register_flop_formula(torch.ops.aten._grouped_mm)(_grouped_mm_flops)


def _grouped(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Rows of x (N, in) grouped by the int32 end offsets times w (E, out, in) transposed."""
    return _ContiguousGrad.apply(torch._grouped_mm(x, w.transpose(1, 2), offs=offs))


class GroupedExperts(nn.Module):
    """E SwiGLU experts with stacked weights; forward(x_sorted, counts) runs counts[e] rows on e.

    Expert parallelism shards dim 0 of every parameter (parallel/expert_parallel.py makes them
    DTensors); the module then computes with its E_local experts and `counts` has E_local
    entries. State dicts of the old ModuleList layout
    (`experts.N.gate_proj.weight`) load too: a pre-hook stacks them.
    """

    def __init__(self, n_experts: int, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.gate_proj = nn.Parameter(torch.empty(n_experts, d_ff, d_model))
        self.up_proj = nn.Parameter(torch.empty(n_experts, d_ff, d_model))
        self.down_proj = nn.Parameter(torch.empty(n_experts, d_model, d_ff))
        self.use_grouped_mm: bool | None = None  # None: ask grouped_mm_available(); tests force
        self.reset_parameters()
        self.register_load_state_dict_pre_hook(_stack_module_list_names)

    @property
    def local_experts(self) -> int:
        return self.weights()[0].shape[0]

    def weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """gate, up and down projections of the experts this process holds."""
        return tuple(_local(w) for w in (self.gate_proj, self.up_proj, self.down_proj))

    def reset_parameters(self) -> None:
        for w in (self.gate_proj, self.up_proj, self.down_proj):
            std = math.sqrt(2.0 / (w.shape[1] + w.shape[2]))  # as Linear, per expert
            nn.init.trunc_normal_(w, std=std, a=-3 * std, b=3 * std)

    def forward(self, x: torch.Tensor, counts: list[int] | torch.Tensor) -> torch.Tensor:
        if len(counts) != self.local_experts:
            raise LmforgeError(
                f"{len(counts)} expert counts for {self.local_experts} experts: pass one per expert"
            )
        dtype = x.dtype
        if torch.is_autocast_enabled(x.device.type):
            dtype = torch.get_autocast_dtype(x.device.type)
        use = self.use_grouped_mm
        if use is None:
            use = grouped_mm_available(x.device, dtype) and self._aligned(dtype)
        if use:
            return self._forward_grouped(x.to(dtype), counts)
        return self._forward_loop(x, counts)

    def _aligned(self, dtype: torch.dtype) -> bool:
        # grouped mm needs 16-byte aligned strides: inner sizes a multiple of 16 bytes.
        step = 16 // torch.empty((), dtype=dtype).element_size()
        d_ff, d_model = self.gate_proj.shape[1:]
        return d_ff % step == 0 and d_model % step == 0

    def _forward_grouped(self, x: torch.Tensor, counts: list[int] | torch.Tensor) -> torch.Tensor:
        counts = torch.as_tensor(counts, device=x.device)
        offs = counts.cumsum(0).to(torch.int32)
        w1, w3, w2 = (w.to(x.dtype) for w in self.weights())
        x = x.contiguous()
        h = F.silu(_grouped(x, w1, offs)) * _grouped(x, w3, offs)
        return _grouped(h, w2, offs)

    def _forward_loop(self, x: torch.Tensor, counts: list[int] | torch.Tensor) -> torch.Tensor:
        sizes = counts.tolist() if isinstance(counts, torch.Tensor) else [int(c) for c in counts]
        w1, w3, w2 = (w.to(x.dtype) for w in self.weights())
        outs = []
        for e, rows in enumerate(x.split(sizes)):
            h = F.silu(rows @ w1[e].T) * (rows @ w3[e].T)
            outs.append(h @ w2[e].T)
        return torch.cat(outs)


def _local(w: torch.Tensor) -> torch.Tensor:
    return w.to_local() if hasattr(w, "to_local") else w  # an expert-parallel DTensor shard


def _stack_module_list_names(module: GroupedExperts, state: dict, prefix: str, *_) -> None:
    """Rewrite `{prefix}N.gate_proj.weight` (N = 0 … E−1) to the stacked `{prefix}gate_proj`."""
    n = module.local_experts
    for proj in PROJECTIONS:
        names = [f"{prefix}{e}.{proj}.weight" for e in range(n)]
        if all(name in state for name in names):
            state[prefix + proj] = torch.stack([state.pop(name) for name in names])


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
