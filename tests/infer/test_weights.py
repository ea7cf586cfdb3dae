import dataclasses

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from lmforge.device.capability import detect, profile_capability
from lmforge.infer.weight_layouts import (
    PackedLinear,
    StreamedLinear,
    decode_layout,
    lay_out_for_decode,
)
from lmforge.model import ModelConfig, Transformer
from lmforge.model.layers import Linear


def without_decode_kernels():
    """This CPU as one where lmforge's decode kernels do not run (ARM, no compiler)."""
    return dataclasses.replace(detect(), decode_isa=None)


def needs_packing(dtype: torch.dtype) -> None:
    if not detect().can_pack(dtype):
        pytest.skip(
            f"oneDNN cannot pack {dtype} weights on this CPU (bf16 needs AVX512-BW/VL/DQ or "
            "AVX-NE-CONVERT); the plain-layout fallback is tested by tests/device/"
            "test_capability.py::test_on_an_avx2_only_cpu_bf16_engines_fall_back_to_the_plain_layout"
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_linear_matches_linear_eager_and_compiled(dtype):
    needs_packing(dtype)
    torch.manual_seed(0)
    linear = Linear(48, 80).to(dtype)
    packed = PackedLinear(linear, batch_size=8)
    x = torch.randn(3, 5, 48, dtype=dtype)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    with torch.inference_mode():
        want = linear(x)
        torch.testing.assert_close(packed(x), want, **tol)
        compiled = torch.compile(packed, fullgraph=True, dynamic=False)
        torch.testing.assert_close(compiled(x), want, **tol)
        assert packed(x[:1, :1]).shape == (1, 1, 80)  # any number of rows, not just the hint


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_streamed_linear_matches_linear_eager_and_compiled(dtype):
    torch.manual_seed(0)
    linear = Linear(48, 80).to(dtype)
    streamed = StreamedLinear(linear)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    compiled = torch.compile(streamed, fullgraph=True, dynamic=False)
    with torch.inference_mode():
        for shape, streams in [((1, 1, 48), True), ((2, 1, 48), True), ((3, 5, 48), False)]:
            x = torch.randn(shape, dtype=dtype)
            want = linear(x)
            assert torch.equal(streamed(x), want)  # eager is F.linear itself
            got, code = run_and_get_code(compiled, x)
            torch.testing.assert_close(got, want, **tol)
            assert ("extern_kernels.mm" in "".join(code)) != streams  # Inductor's own loop
    assert streamed.weight is linear.weight  # shared, so the model saves as before


def test_decode_layout_by_batch_dtype_device_and_compile():
    """On a CPU that packs both dtypes; tests/device/test_capability.py covers the others."""
    fp32, bf16 = torch.empty(4, 4), torch.empty(4, 4, dtype=torch.bfloat16)
    meta = torch.empty(4, 4, device="meta")

    def layout(weight, batch, compiled=False):
        return decode_layout(weight, batch, compiled, profile_capability("avx512-bf16"))

    assert layout(fp32, 1) == "column-major"
    assert layout(fp32, 8) == "packed"
    assert layout(bf16, 1) == "packed"
    assert layout(fp32, 1, compiled=True) == "streamed"
    assert layout(bf16, 2, compiled=True) == "streamed"
    assert layout(fp32, 4, compiled=True) == "packed"
    assert layout(meta, 1, compiled=True) == "row-major"
    assert layout(torch.empty(4, 4, dtype=torch.float16), 8) == "row-major"
    assert layout(meta, 1) == "row-major"


def test_lay_out_for_decode_replaces_every_linear_and_keeps_the_logits():
    needs_packing(torch.float32)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4)).eval()
    ids = torch.randint(0, 64, (2, 9))
    with torch.inference_mode():
        want = model(ids)
        n_linear = sum(isinstance(m, Linear) for m in model.modules())
        assert lay_out_for_decode(model, 8, capability=without_decode_kernels()) == "packed"
        assert sum(isinstance(m, PackedLinear) for m in model.modules()) == n_linear
        assert not any(isinstance(m, Linear) for m in model.modules())
        torch.testing.assert_close(model(ids), want, atol=1e-5, rtol=1e-5)


def test_streamed_layout_keeps_the_state_dict():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4)).eval()
    want = {k: v.clone() for k, v in model.state_dict().items()}
    plain = without_decode_kernels()
    assert lay_out_for_decode(model, 1, compiled=True, capability=plain) == "streamed"
    assert not any(isinstance(m, Linear) for m in model.modules())
    got = model.state_dict()
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize(
    ("saved", "device", "bf16_fast", "want"),
    [
        (torch.float32, "cpu", True, torch.float32),
        (torch.bfloat16, "cpu", True, torch.bfloat16),
        (torch.bfloat16, "cpu", False, torch.float32),  # AVX2: bf16 would be emulated
        (torch.float16, "cpu", True, torch.float32),  # no fast fp16 matmul on CPUs
        (torch.bfloat16, "cuda", False, torch.bfloat16),
        (torch.float16, "mps", False, torch.float16),
    ],
)
def test_decode_dtype_keeps_a_half_checkpoint_only_where_it_is_fast(
    monkeypatch, saved, device, bf16_fast, want
):
    import lmforge.device.capability as capability
    from lmforge.infer.weight_layouts import decode_dtype

    monkeypatch.delenv("LMFORGE_CPU_PROFILE", raising=False)  # the measurement alone decides
    monkeypatch.setattr(capability, "bf16_speedup", lambda: 2.5 if bf16_fast else 0.04)
    assert decode_dtype(saved, device) == want
