"""Count the bytes of every collective this process issues, by op, inside one `with` block.

    with count_collectives() as counter:
        train_step()
    counter.total_bytes, counter.by_op  # {"all_reduce": (calls, bytes), ...}

One TorchDispatchMode sees them all, because every path ends in a dispatcher op with tensor
arguments: torch.distributed calls and FSDP2 (`fully_shard`) dispatch `c10d::*` ops, DTensor
tensor parallelism dispatches the functional `_c10d_functional::*` ops, and DDP's C++ reducer
calls ProcessGroup::allreduce, which dispatches `c10d::allreduce_` too, so no comm hook is
needed. An op on DTensors is handed back to DTensor first (as torch's CommDebugMode does), so
the collectives DTensor issues inside its own dispatch (redistributions, loss_parallel's
reductions) reach the mode as ops on local tensors. The mode costs one Python call per tensor
op while it is active: count one step and log that, rather than wrapping a whole run.

Byte convention (lmforge.plan predicts with the same one): the logical payload of each call on
this rank, independent of the algorithm that moves it,
  all-reduce     = the tensor's bytes
  all-gather     = the full gathered output's bytes
  reduce-scatter = the full (unscattered) input's bytes
  broadcast      = the tensor's bytes
  all-to-all     = the input's bytes
which is also the "size" of nccl-tests, so bus bandwidth factors apply to it unchanged.
Point-to-point and rooted ops (send/recv, reduce, gather, scatter) and barriers are not counted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

Payload = Callable[[tuple, Any], Any]  # (op args, op result) -> the tensors that count


def _arg(i: int) -> Payload:
    return lambda args, result: args[i]


def _result(args: tuple, result: Any) -> Any:
    return result


# Dispatcher op name -> (collective, its payload). c10d ops take (outputs, inputs, ...) or, when
# in place, (tensors, ...); functional ops take the input first and return the output.
_COLLECTIVES: dict[str, tuple[str, Payload]] = {
    "c10d::allreduce_": ("all_reduce", _arg(0)),
    "c10d::allreduce_coalesced_": ("all_reduce", _arg(0)),
    "c10d::broadcast_": ("broadcast", _arg(0)),
    "c10d::_allgather_base_": ("all_gather", _arg(0)),
    "c10d::allgather_": ("all_gather", _arg(0)),
    "c10d::allgather_coalesced_": ("all_gather", _arg(0)),
    "c10d::allgather_into_tensor_coalesced_": ("all_gather", _arg(0)),
    "c10d::_reduce_scatter_base_": ("reduce_scatter", _arg(1)),
    "c10d::reduce_scatter_": ("reduce_scatter", _arg(1)),
    "c10d::reduce_scatter_tensor_coalesced_": ("reduce_scatter", _arg(1)),
    "c10d::alltoall_base_": ("all_to_all", _arg(1)),
    "c10d::alltoall_": ("all_to_all", _arg(1)),
    "_c10d_functional::all_reduce": ("all_reduce", _arg(0)),
    "_c10d_functional::all_reduce_": ("all_reduce", _arg(0)),
    "_c10d_functional::all_reduce_coalesced": ("all_reduce", _arg(0)),
    "_c10d_functional::all_reduce_coalesced_": ("all_reduce", _arg(0)),
    "_c10d_functional::broadcast": ("broadcast", _arg(0)),
    "_c10d_functional::broadcast_": ("broadcast", _arg(0)),
    "_c10d_functional::all_gather_into_tensor": ("all_gather", _result),
    "_c10d_functional::all_gather_into_tensor_out": ("all_gather", _result),
    "_c10d_functional::all_gather_into_tensor_coalesced": ("all_gather", _result),
    "_c10d_functional::reduce_scatter_tensor": ("reduce_scatter", _arg(0)),
    "_c10d_functional::reduce_scatter_tensor_out": ("reduce_scatter", _arg(0)),
    "_c10d_functional::reduce_scatter_tensor_coalesced": ("reduce_scatter", _arg(0)),
    "_c10d_functional::all_to_all_single": ("all_to_all", _arg(0)),
    "_c10d_functional_autograd::all_gather_into_tensor": ("all_gather", _result),
    "_c10d_functional_autograd::reduce_scatter_tensor": ("reduce_scatter", _arg(0)),
    "_c10d_functional_autograd::all_to_all_single": ("all_to_all", _arg(0)),
}


@dataclass
class CollectiveCounter:
    """Calls and payload bytes per collective, in the module's byte convention."""

    by_op: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(nbytes for _, nbytes in self.by_op.values())

    @property
    def calls(self) -> int:
        return sum(calls for calls, _ in self.by_op.values())

    def record(self, op: str, nbytes: int) -> None:
        calls, total = self.by_op.get(op, (0, 0))
        self.by_op[op] = (calls + 1, total + nbytes)

    def reset(self) -> None:
        self.by_op.clear()


class _CountingMode(TorchDispatchMode):
    def __init__(self, counter: CollectiveCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented
        result = func(*args, **(kwargs or {}))
        collective = _COLLECTIVES.get(func.name())
        if collective is not None:
            op, payload = collective
            self.counter.record(op, _nbytes(payload(args, result)))
        return result


def _nbytes(tensors: Any) -> int:
    return sum(
        t.numel() * t.element_size() for t in tree_leaves(tensors) if isinstance(t, torch.Tensor)
    )


@contextlib.contextmanager
def count_collectives() -> Iterator[CollectiveCounter]:
    """Count every collective this process issues inside the block (see the module docstring)."""
    counter = CollectiveCounter()
    with _CountingMode(counter):
        yield counter
