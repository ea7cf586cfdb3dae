"""`train.compute.kernels`: whether the model computes with PyTorch ("torch") or Triton ("triton").

For "triton", `apply_kernels` asks lmforge.kernels.triton's `unavailable(name, device, dtype)`
once per kernel the model uses, before any kernel module is loaded, and fails with the first
reason: so on a CPU (without TRITON_INTERPRET=1) nothing loads a kernel and the run stops at
once with one line. Otherwise it turns each RMSNorm, SwiGLU and Attention, in place, into a
subclass that calls the Triton kernel, held on the module. Only the class changes, never the
parameters or their names, so a checkpoint of either choice loads under the other.

Attention rotates with the Triton RoPE, and attends with the Triton FlashAttention-2 whenever
its queries start at position 0 (training and scoring, with or without packed documents); a
KV cache's later positions keep the PyTorch attention. The fused head + cross-entropy of
train.compute.fused_loss becomes the Triton one (the model's `head_loss`). Left on PyTorch: the
experts of a MoE (grouped matmuls).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.kernels.triton import load, unavailable
from lmforge.model.attention import Attention, causal_attention
from lmforge.model.layers import RMSNorm, SwiGLU
from lmforge.model.transformer import Transformer
from lmforge.train.config import KERNEL_CHOICES


class TritonRMSNorm(RMSNorm):
    """RMSNorm by `rms_norm` (lmforge.kernels.triton.rmsnorm), set on the module."""

    rms_norm: Callable[..., torch.Tensor]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rms_norm(x, self.weight, self.eps)


class TritonSwiGLU(SwiGLU):
    """SwiGLU whose silu(gate) · up is `swiglu` (lmforge.kernels.triton.swiglu), set on it."""

    swiglu: Callable[..., torch.Tensor]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.swiglu(self.gate_proj(x), self.up_proj(x)))


class TritonAttention(Attention):
    """Attention whose `rotate` and `attend` are set on the module to Triton kernels."""


# what each kernel replaces: (kernel name, the module class that uses it)
_USES = (
    ("rmsnorm", RMSNorm),
    ("swiglu", SwiGLU),
    ("rope", Attention),
    ("flash_attention", Attention),
    ("linear_cross_entropy", Transformer),
)


def apply_kernels(
    model: nn.Module, choice: str, device: torch.device, dtype: torch.dtype
) -> list[str]:
    """Make `model` compute with `choice`'s kernels on `device` in `dtype`: the names of the
    Triton kernels swapped in ([] for "torch"), or a LmforgeError saying why they cannot run."""
    if choice == "torch":
        return []
    if choice not in KERNEL_CHOICES:
        raise LmforgeError(
            f"train.compute.kernels is {choice!r}: choose one of {', '.join(KERNEL_CHOICES)}"
        )
    present = {type(m) for m in model.modules()}
    names = [name for name, cls in _USES if any(issubclass(t, cls) for t in present)]
    for name in names:
        reason = unavailable(name, device, dtype)
        if reason is not None:
            raise LmforgeError(
                f"train.compute.kernels=triton cannot run the {name} kernel: {reason}; "
                "train.compute.kernels=torch runs anywhere"
            )
    kernels = {name: load(name) for name in names}
    attend = None
    if "flash_attention" in kernels:
        attend = functools.partial(_flash_attention, kernels["flash_attention"].flash_attention)
    for module in model.modules():
        if type(module) is RMSNorm:
            _swap(module, TritonRMSNorm, rms_norm=kernels["rmsnorm"].rms_norm)
        elif type(module) is SwiGLU:
            _swap(module, TritonSwiGLU, swiglu=kernels["swiglu"].swiglu)
        elif type(module) is Attention:
            _swap(module, TritonAttention, rotate=kernels["rope"].apply_rope, attend=attend)
        elif isinstance(module, Transformer):
            module.head_loss = kernels["linear_cross_entropy"].linear_cross_entropy
    return names


def _swap(module: nn.Module, cls: type[nn.Module], **functions: Callable) -> None:
    module.__class__ = cls
    for name, function in functions.items():
        setattr(module, name, function)


def _flash_attention(
    flash_attention: Callable[..., torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    start: int | torch.Tensor = 0,
    segments: torch.Tensor | None = None,
    branches: torch.Tensor | None = None,
) -> torch.Tensor:
    """causal_attention by the Triton FlashAttention-2 when the queries start at position 0
    (its causal mask is aligned to the top-left corner); a KV cache's later ones, and branched
    rows (scoring), by PyTorch."""
    if isinstance(start, torch.Tensor) or start != 0 or branches is not None:
        return causal_attention(q, k, v, start, segments, branches)
    return flash_attention(q, k, v, is_causal=True, segment_ids=segments)
