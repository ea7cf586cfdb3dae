"""Data parallelism: DDP (optionally with ZeRO-1) and FSDP2 (`fully_shard`, ZeRO-2/3, HSDP).

DDP keeps a full replica per rank and all-reduces gradients in buckets of `bucket_mb` while
backward is still running; during gradient accumulation only the last micro-batch syncs.
ZeRO-1 adds a sharded optimizer on top: each rank keeps and steps 1/dp of the optimizer state,
then broadcasts its updated parameters. FSDP2 shards parameters, gradients and optimizer state:
one `fully_shard` unit per chosen submodule (a transformer's blocks by default) plus the root,
parameters all-gathered before a unit's forward and backward, gradients reduce-scattered after
its backward. With bf16 the all-gathered compute copy is bf16 while gradients are reduced in
fp32.

Each function takes any `nn.Module` and plain arguments, so a program that started its own
process group can use them as a library (see `World.from_group`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel


def apply_ddp(
    model: nn.Module,
    mesh: DeviceMesh,
    bucket_mb: float = 25.0,
    ignored: Iterable[nn.Parameter] = (),
) -> DistributedDataParallel:
    """`model` replicated over the 1-D `mesh`, gradients all-reduced (averaged) in backward,
    except the `ignored` parameters' (e.g. expert shards, synced by expert parallelism)."""
    ignored = set(ignored)
    if ignored:
        names = [name for name, p in model.named_parameters() if p in ignored]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)
    device_ids = [torch.cuda.current_device()] if mesh.device_type == "cuda" else None
    return DistributedDataParallel(
        model, device_ids=device_ids, process_group=mesh.get_group(), bucket_cap_mb=bucket_mb
    )


def apply_fsdp(
    model: nn.Module,
    mesh: DeviceMesh,
    *,
    units: Iterable[nn.Module] | None = None,
    param_dtype: torch.dtype | None = None,
    reshard_after_forward: bool = True,
    ignored: Iterable[nn.Parameter] = (),
) -> nn.Module:
    """Shard `model` in place and return it: each of `units`, then the root (the rest); the
    `ignored` parameters (e.g. expert shards) stay as they are.

    `units` are the submodules that gather their parameters separately (default: the
    `model.layers` blocks when the model has them, else none: one unit, the root). `mesh` is
    1-D (fsdp) or 2-D (dp replicate × fsdp shard: HSDP). reshard_after_forward=True frees each
    unit's gathered parameters after its forward (ZeRO-3); False keeps them until backward
    (ZeRO-2: more memory, one all-gather fewer). `param_dtype` (e.g. bf16) is the dtype the
    gathered parameters compute in; gradients are always reduced in fp32.
    """
    if units is None:
        units = getattr(model, "layers", ())
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    ignored = set(ignored) or None
    for unit in units:
        fully_shard(
            unit,
            mesh=mesh,
            mp_policy=policy,
            reshard_after_forward=reshard_after_forward,
            ignored_params=ignored,
        )
    # The root's parameters are needed again at once by backward: never reshard them.
    fully_shard(
        model, mesh=mesh, mp_policy=policy, reshard_after_forward=False, ignored_params=ignored
    )
    return model


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


_AMP_ATTRIBUTES = ("found_inf", "grad_scale")


class Zero1(ZeroRedundancyOptimizer):
    """ZeroRedundancyOptimizer that keeps PyTorch's amp protocol: when its local optimizer
    honours `found_inf` and `grad_scale` (skips a bad step on the device), so does this one,
    by handing them on before each step."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._step_supports_amp_scaling = getattr(self.optim, "_step_supports_amp_scaling", False)

    def step(self, closure=None, **kwargs):
        for name in _AMP_ATTRIBUTES:
            if hasattr(self, name):
                setattr(self.optim, name, getattr(self, name))
            elif hasattr(self.optim, name):
                delattr(self.optim, name)
        return super().step(closure, **kwargs)


def build_zero1(
    params: Iterable[torch.Tensor] | Iterable[dict],
    mesh: DeviceMesh | dist.ProcessGroup | None = None,
    optimizer_class: type[torch.optim.Optimizer] = torch.optim.AdamW,
    **defaults: Any,
) -> Zero1:
    """ZeRO-1 of any `torch.optim` optimizer class over a DDP replica's parameters.

    `params` are what `optimizer_class` would take (tensors or parameter groups), `defaults`
    its keyword arguments (lr, betas, fused...). Each rank of `mesh` (a 1-D device mesh or a
    process group; None: every rank) keeps and steps the state of 1/N of the parameters, then
    broadcasts them, so every replica leaves `step()` with the same weights.
    """
    group = mesh.get_group() if isinstance(mesh, DeviceMesh) else mesh
    return Zero1(params, optimizer_class=optimizer_class, process_group=group, **defaults)
