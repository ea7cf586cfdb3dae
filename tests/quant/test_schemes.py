"""The schemes' round trips: errors within half a quantization step, exact int4 packing, and
one-line errors for shapes a scheme cannot store."""

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.quant.schemes import (
    fake_quantize,
    int4_codes,
    int4_params,
    pack_int4,
    quantize,
    unpack_int4,
)


def weights(out: int, inputs: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, inputs, generator=g)
    w[0] = 0.0  # an all-zero row must survive too
    w[1, :5] *= 40.0  # and an outlier
    return w


@pytest.mark.parametrize("out", [3, 17, 64])
def test_int8_error_is_within_half_a_step(out: int) -> None:
    w = weights(out, 96)
    q = quantize(w, "int8")
    assert q.qweight.dtype == torch.int8 and q.qweight.shape == w.shape
    step = q.scales[:, None]
    assert ((q.dequantize() - w).abs() <= step / 2 + 1e-6).all()
    assert q.dequantize()[0].abs().max() == 0
    assert q.qweight.abs().max() == 127  # each non-zero row uses the whole range


@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("out", [5, 33])
def test_int4_error_is_within_half_a_step(group_size: int, out: int) -> None:
    w = weights(out, 256, seed=group_size)
    q = quantize(w, "int4", group_size)
    assert q.qweight.dtype == torch.uint8 and q.qweight.shape == (out, 128)
    assert q.scales.shape == q.zeros.shape == (out, 256 // group_size)
    assert ((q.zeros >= 0) & (q.zeros <= 15) & (q.zeros == q.zeros.round())).all()
    step = q.scales.repeat_interleave(group_size, dim=1)
    assert ((q.dequantize() - w).abs() <= step / 2 + 1e-5).all()
    assert torch.equal(fake_quantize(w, "int4", group_size), q.dequantize())


def test_int4_codes_and_packing_round_trip_exactly() -> None:
    codes = torch.randint(0, 16, (7, 64), dtype=torch.uint8)
    packed = pack_int4(codes, 32)
    assert packed.shape == (7, 32)
    assert torch.equal(unpack_int4(packed, 32), codes)
    assert torch.equal(packed[:, 0], codes[:, 0] | (codes[:, 16] << 4))
    assert torch.equal(packed[:, 16], codes[:, 32] | (codes[:, 48] << 4))
    w = weights(7, 64)
    scales, zeros = int4_params(w, 32)
    q = quantize(w, "int4", 32)
    assert torch.equal(unpack_int4(q.qweight, 32), int4_codes(w, scales, zeros, 32))


def test_quantized_bytes_are_a_quarter_and_an_eighth_plus_scales() -> None:
    w = weights(64, 256)
    assert quantize(w, "int8").nbytes == 64 * 256 + 64 * 4
    assert quantize(w, "int4", 128).nbytes == 64 * 128 + 2 * 64 * 2 * 4


@pytest.mark.parametrize(
    ("scheme", "group_size", "shape", "message"),
    [
        ("int3", 128, (4, 128), "unknown quantization scheme"),
        ("int4", 48, (4, 128), "group size 48"),
        ("int4", 64, (4, 96), "not a multiple of the int4 group size 64"),
        ("int8", None, (4, 2, 2), "can only quantize matrices"),
    ],
)
def test_bad_input_gets_one_line_errors(scheme, group_size, shape, message) -> None:
    with pytest.raises(LmforgeError, match=message) as err:
        quantize(torch.ones(shape), scheme, group_size)
    assert "\n" not in str(err.value)
