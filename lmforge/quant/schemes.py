"""The weight-only quantization schemes: how a float matrix becomes integers and back.

- int8: per-output-channel symmetric. Each row r has one scale s_r = max|w_r| / 127 and codes
  q = clamp(round(w / s_r), -127, 127), stored as int8 (out, in).
- int4: group-wise asymmetric along the input dimension, as AWQ and GPTQ store it. Each group of
  `group_size` consecutive inputs of a row has a scale and an integer zero point in [0, 15]:
  w ≈ (q − zero) · scale with codes q in [0, 15]. Two codes share a byte, both of one group:
  column j of the group's first half in the low nibble, column j + group/2 in the high one,
  uint8 (out, in / 2). Split by half-groups rather than even/odd, the decode kernel unpacks each
  nibble into contiguous runs with no interleaving, which Inductor streams about as fast as the
  fp32 weight's loop (an interleaved unpack measured 6x slower).

RTN (round to nearest) is `quantize`; AWQ (awq.py) rescales weights before it and GPTQ (gptq.py)
chooses codes with error feedback, both through `int4_params`, `int4_codes` and `fake_quantize`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lmforge.errors import LmforgeError

SCHEMES = ("int8", "int4")
GROUP_SIZES = (32, 64, 128)
INT8_MAX = 127
INT4_MAX = 15


@dataclass
class QuantizedWeight:
    """One quantized (out, in) matrix: codes, per-row or per-group scales and zero points."""

    scheme: str
    qweight: torch.Tensor  # int8 (out, in) | uint8 (out, in / 2), two int4 codes per byte
    scales: torch.Tensor  # float32 (out,) | (out, in / group_size)
    zeros: torch.Tensor | None  # int4: float32 (out, in / group_size), integers in [0, 15]
    group_size: int | None
    shape: tuple[int, int]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if self.scheme == "int8":
            return (self.qweight.float() * self.scales[:, None]).to(dtype)
        codes = unpack_int4(self.qweight, self.group_size).float()
        return _per_group(codes, self.group_size, self.scales, self.zeros).to(dtype)

    @property
    def nbytes(self) -> int:
        tensors = [self.qweight, self.scales] + ([self.zeros] if self.zeros is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)


def check_shape(shape: tuple[int, ...], scheme: str, group_size: int | None) -> None:
    """One-line errors for a scheme, group size or matrix shape the scheme cannot store."""
    if scheme not in SCHEMES:
        raise LmforgeError(f"unknown quantization scheme {scheme!r}: use one of {SCHEMES}")
    if len(shape) != 2:
        raise LmforgeError(f"can only quantize matrices, got a tensor of shape {tuple(shape)}")
    if scheme == "int4":
        if group_size not in GROUP_SIZES:
            raise LmforgeError(f"int4 group size {group_size}: use one of {GROUP_SIZES}")
        if shape[1] % group_size:
            raise LmforgeError(
                f"a ({shape[0]}, {shape[1]}) matrix has {shape[1]} inputs, not a multiple of the "
                f"int4 group size {group_size}: pick a group size dividing {shape[1]}"
            )


def int8_scales(w: torch.Tensor) -> torch.Tensor:
    """Per-row scales max|w_r| / 127 (1 for all-zero rows, whose codes are then 0)."""
    amax = w.detach().float().abs().amax(dim=1)
    return torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))


def int8_codes(w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return (w.float() / scales[:, None]).round().clamp(-INT8_MAX, INT8_MAX).to(torch.int8)


def int4_params(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(scales, zeros), each float32 (out, in / group_size), from each group's min and max.

    The range always includes 0, so a zero weight is exact, and constant groups get scale 1."""
    groups = w.detach().float().reshape(w.shape[0], -1, group_size)
    low = groups.amin(dim=-1).clamp(max=0)
    high = groups.amax(dim=-1).clamp(min=0)
    scales = (high - low) / INT4_MAX
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    zeros = (-low / scales).round().clamp(0, INT4_MAX)
    return scales, zeros


def int4_codes(
    w: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int
) -> torch.Tensor:
    """uint8 codes (out, in) in [0, 15]: round(w / scale) + zero, clamped."""
    groups = w.float().reshape(w.shape[0], -1, group_size)
    codes = (groups / scales[..., None]).round() + zeros[..., None]
    return codes.clamp(0, INT4_MAX).reshape(w.shape).to(torch.uint8)


def pack_int4(codes: torch.Tensor, group_size: int) -> torch.Tensor:
    """(out, in) codes in [0, 15] → uint8 (out, in / 2): in each group, column j in the low
    nibble and column j + group_size/2 in the high one."""
    out, inputs = codes.shape
    halves = codes.to(torch.uint8).view(out, inputs // group_size, 2, group_size // 2)
    return (halves[:, :, 0] | (halves[:, :, 1] << 4)).view(out, inputs // 2)


def unpack_int4(packed: torch.Tensor, group_size: int) -> torch.Tensor:
    """The exact inverse of `pack_int4`: uint8 (out, in / 2) → codes (out, in)."""
    out, half = packed.shape
    pairs = packed.view(out, -1, 1, group_size // 2)
    return torch.cat((pairs & 0xF, pairs >> 4), dim=2).view(out, 2 * half)


def int4_weight(
    codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int
) -> QuantizedWeight:
    return QuantizedWeight(
        "int4",
        pack_int4(codes, group_size),
        scales.float(),
        zeros.float(),
        group_size,
        tuple(codes.shape),
    )


def quantize(w: torch.Tensor, scheme: str, group_size: int | None = 128) -> QuantizedWeight:
    """Round-to-nearest quantization of the (out, in) matrix `w` under `scheme`."""
    check_shape(tuple(w.shape), scheme, group_size)
    w = w.detach()
    if scheme == "int8":
        scales = int8_scales(w)
        return QuantizedWeight("int8", int8_codes(w, scales), scales, None, None, tuple(w.shape))
    scales, zeros = int4_params(w, group_size)
    return int4_weight(int4_codes(w, scales, zeros, group_size), scales, zeros, group_size)


def fake_quantize(w: torch.Tensor, scheme: str, group_size: int | None = 128) -> torch.Tensor:
    """`w` quantized and dequantized again, in w's dtype: what a search over scales measures."""
    return quantize(w, scheme, group_size).dequantize(w.dtype)


def _per_group(
    codes: torch.Tensor, group_size: int, scales: torch.Tensor, zeros: torch.Tensor
) -> torch.Tensor:
    groups = codes.reshape(codes.shape[0], -1, group_size)
    return ((groups - zeros[..., None]) * scales[..., None]).reshape(codes.shape)
