"""FP8 linear layers: E4M3 activations and weights, E5M2 gradients, delayed per-tensor scaling.

`convert_to_float8(model)` swaps the Linear layers of the transformer blocks for `Float8Linear`,
which shares their weights (so checkpoints do not change). Each layer scales its input, weight
and output gradient by a power of two chosen from the largest |value| seen over the last
`history` steps (delayed scaling; the first step uses the tensor's own amax), so values fit the
fp8 range. On CUDA with compute capability ≥ 8.9 the matmuls are real fp8 (`torch._scaled_mm`);
elsewhere the same quantized values are multiplied in bf16, which represents every fp8 value
exactly, so the numerics can be tested on a CPU. `update_scales` closes a step: it pushes the
step's amax into the history and fixes the scales the next step uses (so a recomputed forward
under activation checkpointing quantizes exactly as the first one did).
"""

from __future__ import annotations

import torch
from torch import nn

from lmforge.model import Linear, Transformer

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
INPUT, WEIGHT, GRAD = 0, 1, 2


def real_fp8_supported(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


class Float8Linear(nn.Module):
    """y = x Wᵀ with x and W in E4M3 and the output gradient in E5M2."""

    def __init__(self, linear: Linear, history: int = 16, real: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.real = real
        device = linear.weight.device
        self.register_buffer("amax_history", torch.zeros(3, history, device=device), False)
        self.register_buffer("pending_amax", torch.zeros(3, device=device), False)
        self.register_buffer("scales", torch.ones(3, device=device), False)
        limits = [_max(INPUT), _max(WEIGHT), _max(GRAD)]
        self.register_buffer("limits", torch.tensor(limits, device=device), False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kind = x.device.type
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype
        return _Float8Matmul.apply(x, self.weight, self, dtype)

    def scale_for(self, which: int, t: torch.Tensor) -> torch.Tensor:
        """The scale for tensor `which` this step; records its amax for the next steps."""
        amax = t.detach().abs().amax().float()
        with torch.no_grad():
            self.pending_amax[which] = torch.maximum(self.pending_amax[which], amax)
        seen = self.amax_history[which].amax() > 0
        return torch.where(seen, self.scales[which], _pow2_scale(amax, _max(which)))

    @torch.no_grad()
    def update_scales(self, skipped: torch.Tensor | None = None) -> None:
        """Push this step's amax into the history (unless the step was skipped as non-finite)
        and fix the scales of the next step."""
        history = torch.roll(self.amax_history, 1, dims=1)
        history[:, 0] = self.pending_amax
        if skipped is not None:
            history = torch.where(skipped, self.amax_history, history)
        self.amax_history.copy_(history)
        self.pending_amax.zero_()
        self.scales.copy_(_pow2_scale(self.amax_history.amax(dim=1), self.limits))

    def extra_repr(self) -> str:
        mode = "real" if self.real else "simulated"
        return f"in_features={self.in_features}, out_features={self.out_features}, {mode}"


def convert_to_float8(
    model: Transformer, history: int = 16, real: bool = False
) -> list[Float8Linear]:
    """Swap the blocks' Linear layers (both sides divisible by 16) for Float8Linear, in place.

    The embedding and the output head keep the surrounding precision, as is usual for fp8.
    """
    converted = []
    for block in model.layers:
        for parent in list(block.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is Linear and child.in_features % 16 == child.out_features % 16 == 0:
                    fp8 = Float8Linear(child, history, real)
                    setattr(parent, name, fp8)
                    converted.append(fp8)
    return converted


class _Float8Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, layer: Float8Linear, out_dtype: torch.dtype):
        x2 = x.reshape(-1, x.shape[-1])
        sx, sw = layer.scale_for(INPUT, x2), layer.scale_for(WEIGHT, weight)
        xq, wq = _quantize(x2, sx, E4M3), _quantize(weight, sw, E4M3)
        ctx.save_for_backward(xq, wq, sx, sw)
        ctx.layer, ctx.x_dtype = layer, x.dtype
        out = _scaled_matmul(xq, wq.t(), sx, sw, out_dtype, layer.real)
        return out.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad_out):
        xq, wq, sx, sw = ctx.saved_tensors
        layer = ctx.layer
        g = grad_out.reshape(-1, grad_out.shape[-1])
        sg = layer.scale_for(GRAD, g)
        gq = _quantize(g, sg, E5M2)
        grad_x = _scaled_matmul(gq, wq, sg, sw, ctx.x_dtype, layer.real)
        grad_w = _scaled_matmul(gq.t(), xq, sg, sx, torch.float32, layer.real)
        grad_x = grad_x.reshape(*grad_out.shape[:-1], wq.shape[1])
        return grad_x, grad_w.to(layer.weight.dtype), None, None


def _scaled_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    out_dtype: torch.dtype,
    real: bool,
) -> torch.Tensor:
    """(a / scale_a) @ (b / scale_b) for fp8 a (M, K) and b (K, N), in `out_dtype`."""
    if real:
        return torch._scaled_mm(
            a.contiguous(),
            b.t().contiguous().t(),  # column-major, as the fp8 kernels require
            scale_a=scale_a.reciprocal(),
            scale_b=scale_b.reciprocal(),
            out_dtype=out_dtype,
        )
    out = torch.mm(a.to(torch.bfloat16), b.to(torch.bfloat16))
    return (out.float() / (scale_a * scale_b)).to(out_dtype)


def _quantize(t: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    limit = torch.finfo(dtype).max
    return (t.float() * scale).clamp(-limit, limit).to(dtype)


def _pow2_scale(amax: torch.Tensor, limit: float | torch.Tensor) -> torch.Tensor:
    """The largest power of two that keeps amax · scale within the fp8 range (1 if amax is 0)."""
    scale = torch.exp2(torch.floor(torch.log2(limit / amax.clamp(min=1e-30))))
    return torch.where(amax > 0, scale, torch.ones_like(scale))


def _max(which: int) -> float:
    return torch.finfo(E5M2 if which == GRAD else E4M3).max
