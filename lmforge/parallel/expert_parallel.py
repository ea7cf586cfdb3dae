"""Expert parallelism: stacked expert weights sharded over the ep ranks, rows moved by all-to-all.

An MoE's `experts` module holds stacked parameters of leading size E (one slice per expert) and
is called as `experts(x_sorted, counts)`: rows sorted by expert, `counts[e]` rows for expert e.
`shard_experts` keeps this rank's E/ep consecutive experts (rank r owns experts
r·E/ep … (r+1)·E/ep − 1); `ExpertParallel` wraps the sharded module so the same call
1. exchanges the per-expert counts (all_to_all_single of E integers),
2. sends each rank the rows of the experts it owns (all_to_all_single with uneven splits),
3. re-sorts the received rows (grouped by source rank, then expert) by local expert, runs the
   local experts, restores the arrival order,
4. sends the results back (the inverse all-to-all).
Both all-to-alls are autograd functions whose backward is the inverse all-to-all, so gradients
of rows and of the local experts flow exactly as in the single-process call.

Gradient rule (for composing with data parallelism): expert params are summed over the tokens of
the whole ep group by the all-to-all itself, so they must be averaged only over the ranks that
hold the same experts (the "edp" group: same ep rank, different data-parallel replica); the
non-expert params are averaged over all ranks as today. gloo (CPU) and NCCL (GPU) both provide
all_to_all_single in torch 2.13.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from lmforge.errors import LmforgeError

__all__ = ["ExpertParallel", "all_to_all", "shard_experts"]


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


def shard_experts(experts: nn.Module, rank: int, size: int) -> None:
    """Keep, in place, experts rank·E/size … of every stacked parameter (dim 0 is the expert)."""
    for name, param in list(experts.named_parameters(recurse=False)):
        n_experts = param.shape[0]
        if n_experts % size:
            raise LmforgeError(
                f"ep={size} does not divide the {n_experts} experts of {name}: pick ep "
                "dividing model.n_experts"
            )
        local = n_experts // size
        piece = param.detach()[rank * local : (rank + 1) * local].clone()
        setattr(experts, name, nn.Parameter(piece, requires_grad=param.requires_grad))


class ExpertParallel(nn.Module):
    """`experts(x_sorted, counts)` over all E experts, with only E/ep of them on this rank."""

    def __init__(self, experts: nn.Module, n_experts: int, group=None) -> None:
        super().__init__()
        self.size = dist.get_world_size(group)
        if n_experts % self.size:
            raise LmforgeError(
                f"ep={self.size} does not divide model.n_experts={n_experts}: pick ep dividing "
                "the number of experts"
            )
        self.experts, self.n_experts, self.group = experts, n_experts, group

    def forward(self, x_sorted: torch.Tensor, counts) -> torch.Tensor:
        local = self.n_experts // self.size
        counts = torch.as_tensor(counts, dtype=torch.int64).reshape(self.n_experts)
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts, group=self.group)
        in_splits = counts.view(self.size, local).sum(1).tolist()
        out_splits = received.view(self.size, local).sum(1).tolist()
        rows = all_to_all(x_sorted, out_splits, in_splits, self.group)
        expert_of_row = torch.arange(local, device=received.device).repeat(self.size)
        expert_of_row = expert_of_row.repeat_interleave(received)
        order = expert_of_row.argsort(stable=True)
        y = self.experts(rows[order], received.view(self.size, local).sum(0).tolist())
        y = y[order.argsort()]
        return all_to_all(y, in_splits, out_splits, self.group)
