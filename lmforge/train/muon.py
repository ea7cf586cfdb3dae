"""Muon (momentum orthogonalised by Newton–Schulz) for the hidden matrices, AdamW for the rest.

One optimizer, so checkpoints, ZeRO-1 and DCP see a single state dict: parameter groups with
`muon=True` take Muon steps, the others lmforge's AdamW steps (`optim.AdamW`). A Muon step on a
matrix W with gradient G (Jordan et al., 2024, as modded-nanogpt and nanochat use it):

    B ← μ·B + (1 − μ)·G                      momentum (an EMA)
    U ← (1 − μ)·G + μ·B                      Nesterov: look one step ahead (else U = B)
    O ← NS5(U) ≈ U' V'ᵀ for U = U' Σ V'ᵀ     all singular values pushed towards 1
    W ← W·(1 − lr·wd) − lr·√max(1, rows/cols)·O

NS5 is five steps of the quintic X ← aX + (bA + cA²)X with A = XXᵀ and (a, b, c) = (3.4445,
−4.7750, 2.0315), from X = U/‖U‖_F (so every singular value starts ≤ 1). These coefficients
trade exactness for speed: the singular values land in about [0.68, 1.16], not at 1 (those
below ~1e-3 of the largest are not lifted that far in 5 steps), which is all Muon needs. It
runs in bf16 on CUDA and in fp32 on CPUs (`ns_dtype`). An orthogonal
rows×cols matrix has per-element RMS 1/√max(rows, cols); the √max(1, rows/cols) factor makes
the update's RMS 1/√cols (1/√fan-in) for tall matrices as for square and wide ones.

Sharded parameters (FSDP, tensor parallelism: DTensors): momentum and weight decay are
elementwise, done on the local shard; the orthogonalisation needs the whole matrix (U V'ᵀ of a
row block is not the row block of U V'ᵀ), so each rank all-gathers the momentum update, runs
NS5 on the full matrix (identically on every rank) and keeps its own shard of the result. That
is one all-gather of every hidden matrix per step, as large as FSDP's own weight all-gather.
Under ZeRO-1 each rank steps whole (replicated) matrices, so nothing is gathered.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from lmforge.device.capability import cpu_capability
from lmforge.train.adamw import AdamW, _local, param_groups

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
CPU_BF16 = False


def ns_dtype(device: torch.device) -> torch.dtype:
    """bf16 on CUDA, fp32 elsewhere. On a CPU with fast bf16 it would be about 4x faster in
    isolation, but its rounding makes data-parallel runs drift from one process's beyond the
    layouts' equality tests, so CPUs keep fp32 (`cpu_bf16=True` opts in, for measurements)."""
    if device.type == "cuda" or (
        device.type == "cpu" and CPU_BF16 and cpu_capability().fast_bf16()
    ):
        return torch.bfloat16
    return torch.float32


def newton_schulz(
    g: torch.Tensor, steps: int = 5, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """An approximately orthogonal matrix with `g`'s singular vectors (see the module docstring);
    computed in `dtype` (default: `ns_dtype`), returned in `g`'s dtype."""
    if g.dim() != 2:
        raise ValueError(f"Newton–Schulz orthogonalises matrices, got shape {tuple(g.shape)}")
    dtype = dtype or ns_dtype(g.device)
    a, b, c = NS_COEFFICIENTS
    x = g.to(dtype)
    tall = x.size(0) > x.size(1)
    if tall:  # iterate on the wide form: A = XXᵀ is the smaller Gram matrix
        x = x.T
    x = x / (x.norm() + 1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.T if tall else x).to(g.dtype)


def shape_scale(rows: int, cols: int) -> float:
    return max(1.0, rows / cols) ** 0.5


class Muon(AdamW):
    """Muon on groups with `muon=True`, AdamW (lmforge's, with its betas and eps) on the rest.

    Honours PyTorch's amp protocol like AdamW (`found_inf` skips the step on the device).
    `train.optimizer.fused_adamw` does not apply: the AdamW groups always use lmforge's AdamW.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict],
        lr: float = 0.02,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ):
        if not 0 <= momentum < 1 or ns_steps < 1:
            raise ValueError(f"invalid Muon settings momentum={momentum} ns_steps={ns_steps}")
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        for group in self.param_groups:
            group.setdefault("muon", False)
            group.setdefault("momentum", momentum)
            group.setdefault("nesterov", nesterov)
            group.setdefault("ns_steps", ns_steps)
        self.defaults.update(muon=False, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps)

    def _update(self, p: torch.Tensor, grad: torch.Tensor, ok: torch.Tensor, group: dict) -> None:
        if not group["muon"]:
            super()._update(p, grad, ok, group)
            return
        if p.dim() != 2:
            raise ValueError(f"Muon steps matrices; a parameter of shape {tuple(p.shape)} is not")
        state = self.state[p]
        if not state:  # like p: a DTensor for a sharded parameter (for DCP)
            state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        mu, lr = group["momentum"], group["lr"]
        buffer = _local(state["momentum_buffer"])
        buffer.lerp_(grad, (1 - mu) * ok)
        update = grad.lerp(buffer, mu) if group["nesterov"] else buffer
        update = _orthogonalised_shard(update, p, group["ns_steps"])
        param = _local(p)
        param.mul_(1 - lr * group["weight_decay"] * ok)
        param.sub_(update * (lr * shape_scale(*p.shape) * ok))


def _orthogonalised_shard(update: torch.Tensor, p: torch.Tensor, steps: int) -> torch.Tensor:
    """NS5 of the whole matrix whose local shard (of DTensor `p`'s layout) is `update`, as this
    rank's shard; for a plain tensor, NS5 of `update`."""
    if not hasattr(p, "to_local"):
        return newton_schulz(update, steps)
    from torch.distributed.tensor import DTensor, distribute_tensor

    mesh, placements = p.device_mesh, p.placements
    sharded = DTensor.from_local(
        update, mesh, placements, run_check=False, shape=p.shape, stride=p.stride()
    )
    full = newton_schulz(sharded.full_tensor(), steps)
    # Every rank holds the same `full`: src_data_rank=None slices it locally, no communication.
    return distribute_tensor(full, mesh, placements, src_data_rank=None).to_local()


def muon_param_groups(
    model: nn.Module, weight_decay: float, lr: float, muon_lr: float, embed_lr: float = 0.0
) -> list[dict]:
    """Muon at `muon_lr` for the 2-D weights inside the blocks (`layers.*`: attention and MLP
    projections), AdamW at `lr` for the rest, as `optim.param_groups` splits it (output head
    decayed; embeddings and gains not; the input embedding at `embed_lr` where set). The Muon
    group's `lr_scale` (muon_lr / lr) keeps the ratio when the schedule sets every group's
    learning rate."""
    hidden = {
        id(p)
        for name, p in model.named_parameters()
        if p.requires_grad and p.dim() == 2 and name.startswith("layers.")
    }
    groups = [
        {**g, "params": [p for p in g["params"] if id(p) not in hidden]}
        for g in param_groups(model, weight_decay, lr, embed_lr)
    ]
    matrices = [p for p in model.parameters() if id(p) in hidden]
    return [
        {
            "params": matrices,
            "muon": True,
            "lr": muon_lr,
            "lr_scale": muon_lr / lr,
            "weight_decay": weight_decay,
        },
        *groups,
    ]
