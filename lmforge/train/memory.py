"""Activation memory: checkpointing per block, and measuring what training holds in memory.

`apply_activation_checkpointing(model, mode)` wraps every transformer block from outside the
model (its parameters and checkpoint keys do not change):
- `full`: keep only each block's input and recompute the block during backward;
- `selective`: keep the outputs of matmuls and attention, recompute the cheap pointwise ops
  (norms, RoPE, SiLU, products) that hold most of the bytes;
- `none`: keep everything.

`saved_activation_bytes` runs a forward and counts the bytes autograd keeps for backward, seen
through `torch.autograd.graph.saved_tensors_hooks`, plus what checkpointing keeps itself
(block inputs, selectively saved outputs), which those hooks cannot see. Parameters do not count.
`MemoryStats` adds parameters, gradients and optimizer state to it for the CPU's peak; on CUDA
the peak comes from the allocator.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from lmforge.errors import LmforgeError
from lmforge.train.config import CHECKPOINTING_MODES

_aten = torch.ops.aten
SAVED_OPS = {  # kept by selective checkpointing: expensive to recompute
    _aten.mm.default,
    _aten.addmm.default,
    _aten.bmm.default,
    _aten._grouped_mm.default,
    _aten._scaled_mm.default,
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_cudnn_attention.default,
}


def apply_activation_checkpointing(model: nn.Module, mode: str) -> None:
    """Checkpoint every block of `model.layers` in `mode` (none, full or selective)."""
    if mode not in CHECKPOINTING_MODES:
        raise LmforgeError(
            f"unknown activation checkpointing mode {mode!r}: choose one of "
            f"{', '.join(CHECKPOINTING_MODES)}"
        )
    if mode == "none":
        return
    context_fn = _selective_contexts if mode == "selective" else _no_contexts
    for block in model.layers:
        block.forward = functools.partial(_checkpointed, block.forward, context_fn)


def _checkpointed(forward: Callable, context_fn: Callable, *args, **kwargs) -> torch.Tensor:
    if _counter is not None:
        for a in args:
            if isinstance(a, torch.Tensor):
                _counter.add(a)
    return checkpoint(forward, *args, use_reentrant=False, context_fn=context_fn, **kwargs)


def _no_contexts():
    return contextlib.nullcontext(), contextlib.nullcontext()


def _save_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_contexts():
    forward_ctx, recompute_ctx = create_selective_checkpoint_contexts(_save_matmuls)
    if _counter is None:
        return forward_ctx, recompute_ctx
    stack = contextlib.ExitStack()
    stack.enter_context(forward_ctx)
    stack.enter_context(_CountSavedOutputs(_counter))
    return stack, recompute_ctx


class _ByteCounter:
    """Bytes of distinct storages, leaving out the ones in `exclude` (parameters)."""

    def __init__(self, exclude: set[int]) -> None:
        self.seen = set(exclude)
        self.bytes = 0

    def add(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        if storage.data_ptr() not in self.seen:
            self.seen.add(storage.data_ptr())
            self.bytes += storage.nbytes()


_counter: _ByteCounter | None = None


class _CountSavedOutputs(TorchDispatchMode):
    def __init__(self, counter: _ByteCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in SAVED_OPS:
            for t in out if isinstance(out, tuple) else (out,):
                if isinstance(t, torch.Tensor):
                    self.counter.add(t)
        return out


@contextlib.contextmanager
def count_saved_bytes(params: list[torch.Tensor]) -> Iterator[_ByteCounter]:
    """Count the bytes of tensors saved for backward by autograd code run inside the block."""
    global _counter
    counter = _ByteCounter({p.untyped_storage().data_ptr() for p in params})

    def pack(t: torch.Tensor) -> torch.Tensor:
        counter.add(t)
        return t

    _counter = counter
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield counter
    finally:
        _counter = None


def saved_activation_bytes(model: nn.Module, forward: Callable[[], torch.Tensor]) -> int:
    """Bytes held for backward after `forward()` (which runs `model`); backward is not run."""
    with count_saved_bytes(list(model.parameters())) as counter:
        out = forward()
    del out
    return counter.bytes


def tensor_bytes(tensors: Iterator[torch.Tensor] | list[torch.Tensor]) -> int:
    return sum(_local(t).numel() * t.element_size() for t in tensors)


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a sharded (DTensor) tensor; a plain tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """This rank's optimizer state; ZeRO-1 keeps its shard in the local optimizer it wraps."""
    if torch.distributed.is_available():  # a build without it has no ZeRO either
        from torch.distributed.optim import ZeroRedundancyOptimizer

        if isinstance(optimizer, ZeroRedundancyOptimizer):
            optimizer = optimizer.optim
    return tensor_bytes(
        v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)
    )


def peak_memory_bytes(
    device: torch.device,
    models: list[nn.Module],
    optimizer: torch.optim.Optimizer,
    activation_bytes: int,
) -> int:
    """The CUDA allocator's peak; elsewhere parameters + gradients + optimizer state + saved
    activations (measured once)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    params = [_local(p) for m in models for p in m.parameters()]
    unique = {p.untyped_storage().data_ptr(): p for p in params}.values()
    weights = tensor_bytes(unique)
    return 2 * weights + optimizer_state_bytes(optimizer) + activation_bytes
