"""QuantizedLinear: a Linear whose weight is int8 or packed int4, and the kernel that reads it.

Decode is bound by the bytes of weight read per token. Up to eight rows on an x86-64 CPU with
AVX2 or AVX-512 VNNI, lmforge's decode kernels (kernels/cpu_decode.py) read the codes once and
multiply them as integers against x rounded to int16 per row, eager or compiled. Elsewhere
(ARM, or no compiler), the one- and two-row path (up to eight rows for int8 with fp32
activations) is the streamed layout of infer/weight_layouts.py with dequantization inside it:
compiled, the product `(x[..., None, :] * codes).sum(-1) * scales` (int4: per half-group, with
the zero point) becomes one Inductor loop that reads the integer codes, converts them in
registers and accumulates, never writing a float copy of W. Larger batches are bound by the
matrix kernel instead: with bf16 activations int8 uses torch's `_weight_int8pack_mm` (2.4x
faster than an fp32 matmul at 8 rows here, but 20x slower with fp32 activations); otherwise the
weight is dequantized for the float matmul, which compiled costs about what the fp32 matmul
does. `kernel_for` is the one place that choice is made.

An engine that decodes one row at a time may `tile` the codes into the decode kernels' tiled
layout (cpu_decode.tile), which they stream faster; every other path reads them through
`codes()`, row-major as saved.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.device.capability import DECODE_ISAS
from lmforge.kernels import cpu_decode
from lmforge.quant.schemes import QuantizedWeight, check_shape

STREAMED_MAX_ROWS = 2
# int8 with fp32 activations streams up to 8 rows: a 3072x768 matrix at 8 rows took 510 us
# streamed, against 557 us for the fp32 matmul and 750 us dequantized (one Zen 4 thread).
INT8_STREAMED_MAX_ROWS = 8


def kernel_for(
    scheme: str, rows: int, compiling: bool, x: torch.Tensor, isa: str | None = None
) -> str:
    """Which kernel multiplies `rows` rows of `x` by a `scheme` weight, where lmforge's decode
    kernels run in instruction set `isa` (None: they do not run here)."""
    if isa is not None and x.device.type == "cpu" and cpu_decode.fits(x.shape[-1], rows):
        return isa
    int8_bf16 = scheme == "int8" and x.device.type == "cpu" and x.dtype == torch.bfloat16
    limit = STREAMED_MAX_ROWS if scheme == "int4" or int8_bf16 else INT8_STREAMED_MAX_ROWS
    if compiling and rows <= limit:
        return "streamed"
    return "int8pack" if int8_bf16 else "dequantize"


class QuantizedLinear(nn.Module):
    """y = x Wᵀ for W stored as a QuantizedWeight; buffers, so it saves in a state dict."""

    def __init__(
        self, in_features: int, out_features: int, scheme: str, group_size: int | None
    ) -> None:
        super().__init__()
        check_shape((out_features, in_features), scheme, group_size)
        self.in_features, self.out_features = in_features, out_features
        self.scheme, self.group_size = scheme, group_size
        if scheme == "int8":
            codes = torch.zeros(out_features, in_features, dtype=torch.int8)
            self.register_buffer("qweight", codes)
            self.register_buffer("scales", torch.ones(out_features))
        else:
            groups = in_features // group_size
            packed = torch.zeros(out_features, in_features // 2, dtype=torch.uint8)
            self.register_buffer("qweight", packed)
            self.register_buffer("scales", torch.ones(out_features, groups))
            self.register_buffer("zeros", torch.zeros(out_features, groups))

    @classmethod
    def from_weight(cls, q: QuantizedWeight) -> QuantizedLinear:
        out_features, in_features = q.shape
        module = cls(in_features, out_features, q.scheme, q.group_size)
        module.qweight.copy_(q.qweight)
        module.scales.copy_(q.scales)
        if q.zeros is not None:
            module.zeros.copy_(q.zeros)
        return module

    def quantized_weight(self) -> QuantizedWeight:
        zeros = self.zeros if self.scheme == "int4" else None
        shape = (self.out_features, self.in_features)
        codes, group = self.codes(), self.group_size
        return QuantizedWeight(self.scheme, codes, self.scales, zeros, group, shape)

    def codes(self) -> torch.Tensor:
        """The codes row-major (out, in) for int8, (out, in / 2) packed int4, tiled or not."""
        return cpu_decode.untile(self.qweight)

    def tile(self) -> None:
        """Lay the codes out in the decode kernels' tiled layout, in place; for an inference
        model (its state dict then holds the tiled codes)."""
        if not cpu_decode.can_tile(self.qweight):
            raise ValueError(f"codes of shape {tuple(self.qweight.shape)} do not tile")
        self.qweight = cpu_decode.tile(self.qweight)

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """W in `dtype`, written as elementwise ops on the codes so that Inductor can fuse them
        into the loop that consumes W."""
        if self.scheme == "int8":
            return self.codes().to(dtype) * self.scales[:, None].to(dtype)
        low, high = self._half_groups(dtype)
        return torch.stack((low, high), dim=2).view(self.out_features, self.in_features)

    def _half_groups(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """W's groups dequantized as two (out, groups, group/2) halves: low and high nibbles."""
        groups = self.scales.shape[1]
        scales, zeros = self.scales[..., None].to(dtype), self.zeros[..., None].to(dtype)
        codes = self.codes().view(self.out_features, groups, -1)
        return ((codes & 0xF).to(dtype) - zeros) * scales, ((codes >> 4).to(dtype) - zeros) * scales

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[:-1].numel()
        compiling = torch.compiler.is_compiling()
        kernel = kernel_for(self.scheme, rows, compiling, x, cpu_decode.isa_for())
        if kernel in DECODE_ISAS and self.scheme == "int8":
            return cpu_decode.int8_mm(x, self.qweight, self.scales, kernel)
        if kernel in DECODE_ISAS:
            scales, zeros = self.scales, self.zeros
            return cpu_decode.int4_mm(x, self.qweight, scales, zeros, self.group_size, kernel)
        if kernel == "streamed" and self.scheme == "int4":
            low, high = self._half_groups(x.dtype)
            halves = x.view(*x.shape[:-1], 1, low.shape[1], 2, -1)
            return (halves[..., 0, :] * low).sum((-1, -2)) + (halves[..., 1, :] * high).sum(
                (-1, -2)
            )
        if kernel == "streamed":  # the row's scale applied once, after the sum
            return (x.unsqueeze(-2) * self.codes().to(x.dtype)).sum(-1) * self.scales.to(x.dtype)
        if kernel == "int8pack":
            rows = x.reshape(-1, self.in_features)
            y = torch._weight_int8pack_mm(rows, self.codes(), self.scales.to(x.dtype))
            return y.view(*x.shape[:-1], self.out_features)
        return F.linear(x, self.dequantized(x.dtype))

    def extra_repr(self) -> str:
        group = f", group_size={self.group_size}" if self.group_size else ""
        shape = f"in_features={self.in_features}, out_features={self.out_features}"
        return f"{shape}, {self.scheme}{group}"
