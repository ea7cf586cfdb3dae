"""QuantizedLinear's kernels equal dequantize-then-matmul: lmforge's decode kernels where they run
(up to 8 rows on x86-64, x rounded to int16 first), else the streamed one compiled (the decode
path, one and two rows), torch's int8 packed kernel and the dequantizing fallback eagerly."""

import pytest
import torch
import torch.nn.functional as F

from lmforge.device.capability import DECODE_ISAS
from lmforge.kernels import cpu_decode
from lmforge.quant.linear import QuantizedLinear, kernel_for
from lmforge.quant.schemes import quantize

CASES = [("int8", None), ("int4", 32), ("int4", 64), ("int4", 128)]


def linear(scheme: str, group_size: int | None, out: int = 67, inputs: int = 256):
    w = torch.randn(out, inputs, generator=torch.Generator().manual_seed(out))
    module = QuantizedLinear.from_weight(quantize(w, scheme, group_size))
    return module, module.quantized_weight().dequantize()


def reference(module: QuantizedLinear, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The product the module computes on this host: the decode kernels round x to int16."""
    kernel = kernel_for(module.scheme, x.shape[:-1].numel(), False, x, cpu_decode.isa_for())
    return F.linear(cpu_decode.integer_activations(x) if kernel in DECODE_ISAS else x, w)


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


@pytest.mark.parametrize(("scheme", "group_size"), CASES)
@pytest.mark.parametrize("rows", [1, 5])
def test_eager_kernels_equal_dequantize_then_matmul(scheme, group_size, rows) -> None:
    module, w = linear(scheme, group_size)
    x = torch.randn(rows, 3, 256)
    close(module(x), reference(module, x, w))


def test_the_kernel_is_chosen_by_rows_compilation_and_scheme() -> None:
    x = torch.zeros(1, 8)
    assert kernel_for("int4", 2, True, x) == kernel_for("int8", 1, True, x) == "streamed"
    assert kernel_for("int8", 3, True, x.bfloat16()) == "int8pack"
    assert kernel_for("int8", 1, False, x.bfloat16()) == "int8pack"
    assert kernel_for("int8", 4, False, x) == "dequantize"
    assert kernel_for("int8", 8, True, x) == "streamed"  # fp32 int8 streams up to 8 rows
    assert kernel_for("int8", 9, True, x) == kernel_for("int4", 3, True, x) == "dequantize"


def test_int8_packed_kernel_with_bf16_activations() -> None:
    module, w = linear("int8", None)
    x = torch.randn(8, 256).bfloat16()
    got, want = module(x).float(), F.linear(x.float(), w)
    assert (got - want).abs().max() <= 2e-2 * want.abs().max()
    assert kernel_for("int4", 8, False, x) == "dequantize"


def test_compiled_decode_streams_the_codes_and_equals_the_reference() -> None:
    torch._dynamo.reset()
    for (scheme, group_size), rows in ((("int8", None), 2), (("int8", None), 8), (("int4", 64), 1)):
        module, w = linear(scheme, group_size, out=33)
        x = torch.randn(rows, 1, 256)
        close(torch.compile(module, fullgraph=True)(x), reference(module, x, w))


def test_buffers_save_and_load_in_a_state_dict() -> None:
    module, w = linear("int4", 32)
    copy = QuantizedLinear(256, 67, "int4", 32)
    copy.load_state_dict(module.state_dict())
    assert torch.equal(copy.quantized_weight().dequantize(), w)
    assert copy.qweight.dtype == torch.uint8 and copy.qweight.shape == (67, 128)
