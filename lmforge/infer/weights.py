"""Weight layouts for CPU decoding: the engine re-lays a model it owns for the kernel that reads
it fastest at the batch size it serves.

Decode multiplies a few rows of activations by every weight matrix, so its speed is the speed of
the matrix kernel on that matrix's layout, and nn.Linear's row-major (out, in) layout is rarely
the best one on a CPU (one thread, measured in benchmarks/bench_infer.py):

- batch 1 in fp32 is a chain of matrix-vector products bound by memory bandwidth; MKL streams
  a weight stored column-major (as the transpose of a contiguous (in, out) matrix) up to 2x
  faster than a row-major one (a whole decode step: 1.2-1.3x), and faster than oneDNN's
  packed format;
- batched decode, and bf16 at any batch, are bound by the kernel rather than by memory; oneDNN's
  matmul over a weight prepacked into its blocked format for the expected batch makes a decode
  step 1.2-1.5x faster than MKL over the plain layout.

`lay_out_for_decode` picks one of these per model; GPUs keep the plain layout. Values are
unchanged in both, so tokens are the same as before up to float summation order.
"""

from __future__ import annotations

import torch
from torch import nn

from lmforge.model.layers import Linear

PACKABLE = (torch.float32, torch.bfloat16)


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


def decode_layout(weight: torch.Tensor, batch_size: int) -> str:
    """The fastest layout for decoding `batch_size` rows against weights like `weight`."""
    if weight.device.type != "cpu":
        return "row-major"
    if batch_size == 1 and weight.dtype == torch.float32:
        return "column-major"
    if weight.dtype in PACKABLE and torch.backends.mkldnn.is_available():
        return "packed"
    return "row-major"


def lay_out_for_decode(model: nn.Module, batch_size: int) -> str:
    """Re-lay every Linear of `model` in place for decoding `batch_size` rows; returns the layout.

    The model then serves inference only: packed weights cannot be trained or saved, and
    column-major ones are non-contiguous.
    """
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    if not linears:
        return "row-major"
    layout = decode_layout(linears[0].weight, batch_size)
    with torch.no_grad():
        if layout == "column-major":
            for linear in linears:
                linear.weight.data = linear.weight.data.t().contiguous().t()
        elif layout == "packed":
            for parent in list(model.modules()):
                for name, child in list(parent.named_children()):
                    if isinstance(child, Linear):
                        setattr(parent, name, PackedLinear(child, batch_size))
    return layout
