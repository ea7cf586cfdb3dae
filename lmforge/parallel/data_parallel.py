"""Data parallelism: DDP (optionally with ZeRO-1) and FSDP2 (`fully_shard`, ZeRO-2/3, HSDP).

DDP keeps a full replica per rank and all-reduces gradients in buckets of `bucket_mb` while
backward is still running; during gradient accumulation only the last micro-batch syncs.
ZeRO-1 adds a sharded optimizer on top: each rank keeps and steps 1/dp of the optimizer state,
then broadcasts its updated parameters. FSDP2 shards parameters, gradients and optimizer state:
one `fully_shard` unit per transformer block plus the root, parameters all-gathered before a
unit's forward and backward, gradients reduce-scattered after its backward. With bf16 the
all-gathered compute copy is bf16 while gradients are reduced in fp32.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

from lmforge.model import Transformer
from lmforge.train.optim import param_groups


def apply_ddp(model: nn.Module, mesh: DeviceMesh, bucket_mb: float) -> DistributedDataParallel:
    device_ids = [torch.cuda.current_device()] if mesh.device_type == "cuda" else None
    return DistributedDataParallel(
        model, device_ids=device_ids, process_group=mesh.get_group(), bucket_cap_mb=bucket_mb
    )


def apply_fsdp(
    model: Transformer,
    mesh: DeviceMesh,
    param_dtype: torch.dtype | None,
    reshard_after_forward: bool,
) -> None:
    """Shard `model` in place: each block, then the root (embedding, final norm, head).

    `mesh` is 1-D (fsdp) or 2-D (dp replicate × fsdp shard: HSDP). reshard_after_forward=True
    frees each block's gathered parameters after its forward (ZeRO-3); False keeps them until
    backward (ZeRO-2: more memory, one all-gather fewer).
    """
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in model.layers:
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    # The root's parameters are needed again at once by backward: never reshard them.
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)


@contextlib.contextmanager
def gradient_sync(module: nn.Module, sync: bool) -> Iterator[None]:
    """Reduce gradients in this backward only when `sync` (the last micro-batch)."""
    if isinstance(module, DistributedDataParallel) and not sync:
        with module.no_sync():
            yield
    elif isinstance(module, FSDPModule):
        module.set_requires_gradient_sync(sync)
        yield
    else:
        yield


class Zero1(ZeroRedundancyOptimizer):
    """ZeroRedundancyOptimizer that honours `found_inf` (skip the step on the device) like
    lmforge's other optimizers, by handing it to the local optimizer it wraps."""

    def step(self, closure=None):
        self.optim.found_inf = getattr(self, "found_inf", None)
        return super().step(closure)


def build_zero1(
    model: nn.Module,
    mesh: DeviceMesh,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
    fused: bool,
) -> Zero1:
    return Zero1(
        param_groups(model, weight_decay),
        optimizer_class=torch.optim.AdamW,
        process_group=mesh.get_group(),
        lr=lr,
        betas=betas,
        fused=fused,
    )
