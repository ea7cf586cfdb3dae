"""The experts of a mixture, stacked, and the one place that chooses how their matmuls run.

`GroupedExperts` holds the experts as STACKED parameters `gate_proj`/`up_proj` (E, d_ff, d_model)
and `down_proj` (E, d_model, d_ff); its forward depends only on those and its two arguments, so
expert parallelism (lmforge/parallel/expert_parallel.py) can shard dim 0 and route rows around
exactly that call. Its matmuls use `torch._grouped_mm` where a one-time probe per device and
dtype shows it works (`grouped_mm_available`), else a per-expert loop.
"""

from __future__ import annotations

import concurrent.futures
import functools
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import flop_registry, register_flop_formula

from lmforge.errors import LmforgeError

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


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
