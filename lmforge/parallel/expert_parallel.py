"""Expert parallelism: a mixture of experts' stacked expert weights split over the ep ranks,
each token's rows moved to its experts' rank and back by all-to-all.

An MoE's `experts` module (model/experts.py's GroupedExperts) holds stacked parameters of leading
size E, one slice per expert, and is called as `experts(x_sorted, counts)`: rows sorted by
expert, `counts[e]` rows for expert e. `apply_expert_parallel` makes each parameter a DTensor
sharded on dim 0 over the ep mesh (rank r holds experts r·E/ep … (r+1)·E/ep − 1), so clipping,
the optimizer and distributed checkpoints see one global tensor, and registers two hooks on the
module, keeping its state-dict names and its call unchanged:
1. before the forward: exchange the per-expert counts (all_to_all_single of E integers), send
   each rank the rows of the experts it owns (all_to_all_single with uneven splits), and re-sort
   the received rows (grouped by source rank, then expert) by local expert;
2. after it: restore the arrival order and send the results back (the inverse all-to-all).
Both all-to-alls are autograd functions whose backward is the inverse all-to-all, so gradients
of rows and of the local experts flow exactly as in the single-process call.

Gradient rule: data parallelism leaves the expert parameters alone (DDP ignores them, FSDP
gets them as ignored_params). The all-to-all has already summed each expert's gradient over the
tokens of its ep group; `sync_expert_gradients` sums it over the edp ranks holding the same
experts and divides by the data-parallel degree, which is the mean DDP and FSDP take of every
other gradient. gloo (CPU) and NCCL (GPU) both provide all_to_all_single in torch 2.13.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_tensor

from lmforge.errors import LmforgeError
from lmforge.model.moe import moe_layers

__all__ = ["all_to_all", "apply_expert_parallel", "expert_parameters", "sync_expert_gradients"]


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


def all_to_all(
    x: torch.Tensor, out_splits: list[int], in_splits: list[int], group=None
) -> torch.Tensor:
    """Rows of x (in_splits[j] for rank j) exchanged; returns out_splits[j] rows from rank j."""
    return _AllToAll.apply(x, out_splits, in_splits, group)


def apply_expert_parallel(model: nn.Module, mesh: DeviceMesh) -> list[nn.Parameter]:
    """Split every MoE's experts of `model` over `mesh` (1-D, the ep ranks), in place; returns
    the expert parameters, which data parallelism must leave to `sync_expert_gradients`."""
    params = []
    for moe in moe_layers(model):
        experts = moe.experts
        if moe.n_experts % mesh.size():
            raise LmforgeError(
                f"ep={mesh.size()} does not divide model.n_experts={moe.n_experts}: pick ep "
                "dividing the number of experts"
            )
        for name, param in list(experts.named_parameters(recurse=False)):
            sharded = distribute_tensor(param.detach(), mesh, [Shard(0)])
            setattr(experts, name, nn.Parameter(sharded, requires_grad=param.requires_grad))
            params.append(getattr(experts, name))
        route = _Route(moe.n_experts, mesh.get_group())
        experts.register_forward_pre_hook(route.dispatch)
        experts.register_forward_hook(route.combine)
    return params


def expert_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [p for moe in moe_layers(model) for p in moe.experts.parameters()]


def sync_expert_gradients(
    params: list[nn.Parameter], replicas: dist.ProcessGroup | None, data_parallel: int
) -> None:
    """Each expert gradient summed over the ranks of `replicas` (the edp group: None or one
    rank for none) and divided by `data_parallel`: the mean over every data rank's tokens."""
    grads = [p.grad.to_local() for p in params if p.grad is not None]
    if not grads:
        return
    if replicas is not None and dist.get_world_size(replicas) > 1:
        flat = torch.cat([g.flatten() for g in grads])
        dist.all_reduce(flat, group=replicas)
        for g, piece in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
            g.copy_(piece.view_as(g))
    torch._foreach_div_(grads, data_parallel)


class _Route:
    """The two hooks of one MoE's experts: rows out to their experts' ranks, results back."""

    def __init__(self, n_experts: int, group: dist.ProcessGroup) -> None:
        self.n_experts, self.group = n_experts, group
        self.size = dist.get_world_size(group)
        self.pending: tuple[torch.Tensor, list[int], list[int]] | None = None

    def dispatch(self, module: nn.Module, args: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        x, counts = args
        local = self.n_experts // self.size
        counts = torch.as_tensor(counts, dtype=torch.int64, device=x.device)
        counts = counts.reshape(self.n_experts)
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts, group=self.group)
        in_splits = counts.view(self.size, local).sum(1).tolist()
        out_splits = received.view(self.size, local).sum(1).tolist()
        rows = all_to_all(x, out_splits, in_splits, self.group)
        expert_of_row = torch.arange(local, device=x.device).repeat(self.size)
        order = expert_of_row.repeat_interleave(received).argsort(stable=True)
        self.pending = (order, in_splits, out_splits)
        return rows[order], received.view(self.size, local).sum(0)

    def combine(self, module: nn.Module, args: tuple, y: torch.Tensor) -> torch.Tensor:
        order, in_splits, out_splits = self.pending
        self.pending = None
        return all_to_all(y[order.argsort()], in_splits, out_splits, self.group)
