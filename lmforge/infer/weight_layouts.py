"""Weight layouts for CPU decoding: the engine re-lays a model it owns for the kernel that reads
it fastest at the batch size it serves.

Decode multiplies a few rows of activations by every weight matrix, so its speed is the speed of
the matrix kernel on that matrix's layout, and nn.Linear's row-major (out, in) layout read by
MKL is rarely the fastest on a CPU (one thread, measured in benchmarks/bench_infer.py):

- up to eight rows on an x86-64 CPU with AVX2 or AVX-512: lmforge's decode kernels
  (kernels/cpu_decode.py) stream the plain row-major weight at the memory's bandwidth, eager or
  compiled, reusing each loaded piece of it for every row (fp32 and bf16 weights);
- elsewhere, one or two rows, compiled: matrix-vector products are bound by memory bandwidth.
  Written as a broadcast multiply and a sum over the plain row-major weight, Inductor turns
  each into one vectorised loop that streams the weight at nearly the core's full read
  bandwidth, fused with its neighbours: a decode step runs 1.8-1.9x faster than with MKL, in
  fp32 and bf16;
- one row in fp32, eager: MKL streams a weight stored column-major (as the transpose of a
  contiguous (in, out) matrix) up to 2x faster than a row-major one (a step: 1.2-1.3x);
- more rows, and bf16 eager: bound by the kernel rather than by memory; oneDNN's matmul over a
  weight prepacked into its blocked format for the expected batch makes a decode step 1.2-1.5x
  faster than MKL over the plain layout.

Quantized weights keep their row-major codes, which the decode kernels read, except int8 at one
row: its kernel's block is then a whole tile of the kernels' tiled layout (cpu_decode.tile), read
as one stream instead of eight rows a few hundred bytes long, and an 85M-parameter model's int8
matrices stream 1.3-1.4x faster so (one Zen 3 thread). With more rows a block is part of a tile
and the row-major codes are faster, as they are for int4 (four rows a block) and float weights.

`lay_out_for_decode` picks one of these per model; GPUs keep the plain layout. Packing is
used only where the CPU capability module found oneDNN packing that dtype (bf16 needs
AVX512-BW/VL/DQ or AVX-NE-CONVERT; on AVX2-only CPUs it raises), and falls back to the plain
layout elsewhere. Values are unchanged in all of them, so tokens are the same as before up to
float summation order.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.device.capability import CpuCapability, cpu_capability
from lmforge.errors import LmforgeError
from lmforge.kernels import cpu_decode
from lmforge.model.layers import Linear
from lmforge.quant.linear import QuantizedLinear

STREAMED_MAX_ROWS = 2  # from 4 rows on, oneDNN's packed kernel is faster
KERNEL_DTYPES = (torch.float32, torch.bfloat16)  # what lmforge's decode kernels read


@torch.library.custom_op("lmforge::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, packed_weight: torch.Tensor, out_features: int) -> torch.Tensor:
    """x Wᵀ with W prepacked by oneDNN; an opaque op, so torch.compile calls the kernel as is."""
    return torch.ops.mkldnn._linear_pointwise(x, packed_weight, None, "none", [], "")


@packed_linear.register_fake
def _(x: torch.Tensor, packed_weight: torch.Tensor, out_features: int) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], out_features)


class PackedLinear(nn.Module):
    """A Linear whose weight oneDNN has reordered into its blocked layout for `batch_size` rows.

    The packed weight is an opaque MKLDNN tensor: this module serves inference only (no
    gradients, no state dict worth saving, no moving between devices).
    """

    def __init__(self, linear: Linear, batch_size: int) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        weight = linear.weight.detach()
        self.register_buffer(
            "packed_weight", torch.ops.mkldnn._reorder_linear_weight(weight, batch_size)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return packed_linear(x, self.packed_weight, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed"


class KernelLinear(nn.Module):
    """A Linear whose products with up to cpu_decode.MAX_ROWS rows run in lmforge's decode
    kernels in instruction set `isa`, eager or compiled; more rows (a prefill) stay F.linear,
    bound by the matrix kernel rather than by memory. The weight is the Linear's own."""

    def __init__(self, linear: Linear, isa: str) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight
        self.isa = isa

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if cpu_decode.fits(self.in_features, x.shape[:-1].numel()):
            return cpu_decode.dense_mm(x, self.weight, self.isa)
        return F.linear(x, self.weight)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.isa}"


class StreamedLinear(nn.Module):
    """A Linear that, compiled for at most STREAMED_MAX_ROWS rows, is a multiply and a sum.

    Inductor fuses `(x[..., None, :] * W).sum(-1)` into one loop over W's rows, which it reads
    once, in order, with no matrix kernel's setup or packing. Eager calls, and compiled calls
    with more rows, stay F.linear: eagerly the product would be materialised. The weight is the
    Linear's own parameter, so the model still saves as before.
    """

    def __init__(self, linear: Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling() and x.shape[:-1].numel() <= STREAMED_MAX_ROWS:
            return (x.unsqueeze(-2) * self.weight).sum(-1)
        return F.linear(x, self.weight)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, streamed"


def decode_dtype(saved: torch.dtype, device: torch.device | str) -> torch.dtype:
    """The dtype to decode a checkpoint saved in `saved` with on `device`: its own where the
    device computes it fast (a GPU; a CPU only for bf16, and only where capability measured
    bf16 fast), else float32, which every CPU runs at full speed."""
    device = torch.device(device)
    if saved == torch.float32 or device.type not in ("cpu", "cuda", "mps"):
        return torch.float32
    if device.type != "cpu":
        return saved
    return saved if saved == torch.bfloat16 and cpu_capability().fast_bf16() else torch.float32


def load_for_decode(
    checkpoint: str | Path, device: torch.device | str = "cpu", adapter: str | Path | None = None
):
    """`(model, tokenizer)` of a checkpoint through train.checkpoint.load_checkpoint (which
    checks the device and the folder, with one-line errors; a LoRA `adapter` folder is merged
    in), in the dtype `decode_dtype` picks for it on `device`. A quantized checkpoint loads
    through quant.checkpoint; its float parts (embedding, norms, head) decode in float32."""
    from lmforge.quant.checkpoint import load_quantized, read_quantization
    from lmforge.train.checkpoint import load_checkpoint, saved_dtype

    if read_quantization(checkpoint) is not None:
        if adapter is not None:
            raise LmforgeError(
                "a LoRA adapter cannot be merged into a quantized checkpoint: quantize the "
                "float checkpoint with the adapter merged (lmforge export), then serve that"
            )
        return load_quantized(checkpoint, device)
    model, tokenizer = load_checkpoint(checkpoint, device, adapter)
    placed = next(model.parameters()).device  # "auto" resolved
    return model.to(decode_dtype(saved_dtype(checkpoint), placed)), tokenizer


def load_drafter(speculative: str | None, device: torch.device | str = "cpu"):
    """What `--speculative` names for the engine: None, "ngram" (prompt lookup), or the model
    of a smaller checkpoint (a path) that drafts with the same tokenizer."""
    if speculative is None or speculative == "ngram":
        return speculative
    return load_for_decode(speculative, device)[0]


def decode_layout(
    weight: torch.Tensor,
    batch_size: int,
    compiled: bool = False,
    capability: CpuCapability | None = None,
) -> str:
    """The fastest layout for decoding `batch_size` rows against weights like `weight` on a CPU
    with `capability` (default: this one's)."""
    if weight.device.type != "cpu":
        return "row-major"
    kernel_fits = cpu_decode.fits(weight.shape[1], batch_size) and weight.dtype in KERNEL_DTYPES
    if kernel_fits and (isa := cpu_decode.isa_for(capability)):
        return isa
    if compiled and batch_size <= STREAMED_MAX_ROWS:
        return "streamed"
    if batch_size == 1 and weight.dtype == torch.float32:
        return "column-major"
    if (capability or cpu_capability()).can_pack(weight.dtype):
        return "packed"
    return "row-major"


def lay_out_for_decode(
    model: nn.Module,
    batch_size: int,
    compiled: bool = False,
    capability: CpuCapability | None = None,
) -> str:
    """Re-lay every Linear of `model` in place for decoding `batch_size` rows, with a compiled
    decode step or not, on a CPU with `capability` (default: this one's); returns the layout.

    Packed weights cannot be trained or saved, and column-major ones are non-contiguous, so
    the model then serves inference only; streamed ones are the model's own. Tiled int8 codes
    are named in the layout ("..., int8 tiled").
    """
    tiled = _tile_int8(model, batch_size, capability)
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    if not linears:
        return "int8 tiled" if tiled else "row-major"
    layout = decode_layout(linears[0].weight, batch_size, compiled, capability)
    with torch.no_grad():
        if layout == "column-major":
            for linear in linears:
                linear.weight.data = linear.weight.data.t().contiguous().t()
        elif layout != "row-major":
            for parent in list(model.modules()):
                for name, child in list(parent.named_children()):
                    if isinstance(child, Linear):
                        setattr(parent, name, _relaid(child, layout, batch_size))
    return f"{layout}, int8 tiled" if tiled else layout


def _tile_int8(model: nn.Module, batch_size: int, capability: CpuCapability | None) -> bool:
    """Tile the codes of `model`'s int8 matrices where the decode kernels read them one row at a
    time; whether any were."""
    if batch_size != 1 or not cpu_decode.isa_for(capability):
        return False
    tiled = False
    for module in model.modules():
        if (
            isinstance(module, QuantizedLinear)
            and module.scheme == "int8"
            and module.qweight.device.type == "cpu"
            and cpu_decode.fits(module.in_features, batch_size)
            and cpu_decode.can_tile(module.qweight)
        ):
            module.tile()
            tiled = True
    return tiled


def _relaid(linear: Linear, layout: str, batch_size: int) -> nn.Module:
    if layout == "streamed":
        return StreamedLinear(linear)
    if layout == "packed":
        return PackedLinear(linear, batch_size)
    return KernelLinear(linear, isa=layout)
