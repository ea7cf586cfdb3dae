"""lmforge's CPU decode kernels equal the dequantized weight's product (integer weights: up to
rounding the activations to int16), in every instruction set this CPU runs (AVX-512 VNNI where it
has it, AVX2 forced on any x86-64 host), and every caller falls back to torch's ops where no
kernel runs (the plain path ARM and Apple Silicon take)."""

import concurrent.futures
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from lmforge.device.capability import DECODE_ISAS, cpu_capability, narrower, profile_capability
from lmforge.infer.weight_layouts import KernelLinear, decode_layout, lay_out_for_decode
from lmforge.kernels import cpu_decode
from lmforge.model import ModelConfig, Transformer
from lmforge.quant.linear import QuantizedLinear, kernel_for
from lmforge.quant.quantize import quantize_model
from lmforge.quant.schemes import quantize

HOST_ISA = cpu_capability().decode_isa
RUNNABLE = [isa for isa in DECODE_ISAS if HOST_ISA and narrower(isa, HOST_ISA) == isa]
if not RUNNABLE or cpu_decode.load() is not None:  # an ARM or compiler-less machine
    pytest.skip(f"no decode kernel runs here: {cpu_decode.load()}", allow_module_level=True)

OUT, IN = 67, 256  # an odd number of rows: every register block's tail runs


def weight(seed: int = 0) -> torch.Tensor:
    return torch.randn(OUT, IN, generator=torch.Generator().manual_seed(seed))


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


@pytest.mark.parametrize("isa", RUNNABLE)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 11])
def test_every_weight_format_equals_its_float_product(isa: str, rows: int) -> None:
    x = torch.randn(rows, IN)
    w = weight()
    close(cpu_decode.dense_mm(x, w, isa), F.linear(x, w))
    bf16 = w.bfloat16()
    close(cpu_decode.dense_mm(x, bf16, isa), F.linear(x, bf16.float()))
    q8 = quantize(w, "int8")
    close(
        cpu_decode.int8_mm(x, q8.qweight, q8.scales, isa),
        F.linear(cpu_decode.integer_activations(x), q8.dequantize()),
    )
    for group in (32, 64, 128):
        q4 = quantize(w, "int4", group)
        got = cpu_decode.int4_mm(x, q4.qweight, q4.scales, q4.zeros, group, isa)
        close(got, F.linear(cpu_decode.integer_activations(x), q4.dequantize()))


@pytest.mark.parametrize("isa", RUNNABLE)
def test_threads_calling_the_integer_kernels_at_once_keep_their_own_rounded_x(isa: str) -> None:
    """x is rounded into buffers each calling thread reuses: calls of different shapes from
    several threads at once must each read their own."""
    w = weight()
    q8, q4 = quantize(w, "int8"), quantize(w, "int4", 64)
    want = {}
    for rows in (1, 3, 8, 11):
        x = torch.randn(rows, IN, generator=torch.Generator().manual_seed(rows))
        ref = cpu_decode.integer_activations(x)
        want[rows] = x, F.linear(ref, q8.dequantize()), F.linear(ref, q4.dequantize())

    def products(rows: int) -> None:
        x, int8, int4 = want[rows]
        for _ in range(50):
            close(cpu_decode.int8_mm(x, q8.qweight, q8.scales, isa), int8)
            close(cpu_decode.int4_mm(x, q4.qweight, q4.scales, q4.zeros, 64, isa), int4)

    with concurrent.futures.ThreadPoolExecutor(len(want)) as pool:
        for done in [pool.submit(products, rows) for rows in want]:
            done.result()


@pytest.mark.parametrize("isa", RUNNABLE)
@pytest.mark.parametrize("rows", [1, 2, 3, 8])
def test_every_kernel_reads_a_tiled_weight_as_its_row_major_one(isa: str, rows: int) -> None:
    """Tiled (8 rows' 16-element pieces interleaved) or not, the same sums in the same order."""
    x = torch.randn(rows, IN)
    w = torch.randn(64, IN)  # 8 tiles: blocks of 8, 4, 2 and 1 rows each stay within one
    assert torch.equal(cpu_decode.untile(cpu_decode.tile(w)), w)
    assert cpu_decode.tile(w).shape == (8, IN // 16, 8, 16)
    assert cpu_decode.out_features(cpu_decode.tile(w)) == 64
    for dense in (w, w.bfloat16()):
        want = cpu_decode.dense_mm(x, dense, isa)
        assert torch.equal(cpu_decode.dense_mm(x, cpu_decode.tile(dense), isa), want)
    q8 = quantize(w, "int8")
    want = cpu_decode.int8_mm(x, q8.qweight, q8.scales, isa)
    assert torch.equal(cpu_decode.int8_mm(x, cpu_decode.tile(q8.qweight), q8.scales, isa), want)
    q4 = quantize(w, "int4", 64)
    want = cpu_decode.int4_mm(x, q4.qweight, q4.scales, q4.zeros, 64, isa)
    tiled = cpu_decode.tile(q4.qweight)
    assert torch.equal(cpu_decode.int4_mm(x, tiled, q4.scales, q4.zeros, 64, isa), want)


WIDER = [isa for isa in RUNNABLE if isa != "avx2"]


@pytest.mark.parametrize("isa", WIDER)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8])
def test_wider_integer_kernels_sum_as_avx2_does(isa: str, rows: int) -> None:
    """The same products in the same lanes, added in the same order: equal bit for bit, tiled
    (where int8 pairs rows in 512-bit vectors) or not, whole blocks and the rows after them.
    int4's zero points' term, a scalar loop that each instruction set's build compiles its own
    way, is left out: its last bits may differ."""
    x = torch.randn(rows, IN)
    w = torch.randn(72, IN)  # 9 tiles; row ranges of 1 to 8 rows
    q8, q4 = quantize(w, "int8"), quantize(w, "int4", 64)
    no_zeros = torch.zeros_like(q4.zeros)
    for codes in (q8.qweight, cpu_decode.tile(q8.qweight)):
        want = cpu_decode.int8_mm(x, codes, q8.scales, "avx2")
        assert torch.equal(cpu_decode.int8_mm(x, codes, q8.scales, isa), want)
    for codes in (q4.qweight, cpu_decode.tile(q4.qweight)):
        want = cpu_decode.int4_mm(x, codes, q4.scales, no_zeros, 64, "avx2")
        assert torch.equal(cpu_decode.int4_mm(x, codes, q4.scales, no_zeros, 64, isa), want)


def test_only_whole_tiles_tile_and_a_malformed_tiling_is_refused() -> None:
    assert cpu_decode.can_tile(torch.empty(64, 32))
    assert not cpu_decode.can_tile(torch.empty(OUT, IN))  # 67 rows: not whole tiles of 8
    assert not cpu_decode.can_tile(torch.empty(64, 24))
    with pytest.raises(RuntimeError, match="tiled"):
        cpu_decode.dense_mm(torch.randn(1, 32), torch.randn(4, 2, 4, 16), RUNNABLE[0])


@pytest.mark.parametrize("isa", RUNNABLE)
def test_integer_kernels_round_finely_and_keep_nan_and_zero_rows(isa: str) -> None:
    x = torch.randn(4, IN) * torch.tensor([[1.0], [1e-30], [1e30], [1.0]])
    x[2, 7], x[3] = float("nan"), 0.0
    w = weight()
    q8, q4 = quantize(w, "int8"), quantize(w, "int4", 64)
    for got, exact in (
        (cpu_decode.int8_mm(x, q8.qweight, q8.scales, isa), F.linear(x, q8.dequantize())),
        (
            cpu_decode.int4_mm(x, q4.qweight, q4.scales, q4.zeros, 64, isa),
            F.linear(x, q4.dequantize()),
        ),
    ):
        assert got[2].isnan().all() and got[3].eq(0).all()
        for row in (0, 1):  # within half an int16 step of each row's largest value, at any scale
            step = x[row].abs().max() / 32767
            bound = 0.5 * step * w.abs().sum(-1) + 1e-6 * exact[row].abs().max()
            assert ((got[row] - exact[row]).abs() <= bound).all()


@pytest.mark.parametrize("isa", RUNNABLE)
def test_leading_dimensions_and_bf16_activations_pass_through(isa: str) -> None:
    x = torch.randn(2, 3, IN).bfloat16()
    w = weight()
    got = cpu_decode.dense_mm(x, w, isa)
    assert got.shape == (2, 3, OUT) and got.dtype == torch.bfloat16
    want = F.linear(x.float(), w)
    assert (got.float() - want).abs().max() <= 1e-2 * want.abs().max()


def test_a_matrix_the_kernels_cannot_take_is_refused_clearly() -> None:
    assert not cpu_decode.fits(IN + 8, 1) and not cpu_decode.fits(IN, cpu_decode.MAX_ROWS + 1)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        cpu_decode.dense_mm(torch.randn(1, 24), torch.randn(4, 24), RUNNABLE[0])
    with pytest.raises(RuntimeError, match="unknown instruction set"):
        cpu_decode.dense_mm(torch.randn(1, 32), torch.randn(4, 32), "sse2")


@pytest.mark.parametrize("profile", ["avx2", "generic"])
def test_quantized_linear_takes_the_forced_kernel_and_agrees(monkeypatch, profile) -> None:
    """LMFORGE_CPU_PROFILE forces the narrower choice: AVX2, or torch's ops (the plain path)."""
    monkeypatch.setenv("LMFORGE_CPU_PROFILE", profile)
    x = torch.randn(3, IN)
    for scheme, group in (("int8", None), ("int4", 64)):
        q = quantize(weight(), scheme, group)
        want = "avx2" if profile == "avx2" else "dequantize"  # eager, 3 rows
        assert kernel_for(scheme, 3, False, x, cpu_decode.isa_for()) == want
        seen = cpu_decode.integer_activations(x) if profile == "avx2" else x
        close(QuantizedLinear.from_weight(q)(x), F.linear(seen, q.dequantize()))


def test_the_kernel_is_chosen_only_where_one_runs() -> None:
    x = torch.zeros(1, IN)
    assert kernel_for("int4", 1, True, x, "avx2") == "avx2"
    assert kernel_for("int4", 9, True, x, "avx2") == "dequantize"  # a prefill: a matrix kernel
    assert kernel_for("int4", 1, True, x, None) == "streamed"
    assert cpu_decode.isa_for(profile_capability("neon")) is None
    assert cpu_decode.isa_for(profile_capability("generic")) is None
    plain = dataclasses.replace(cpu_capability(), decode_isa=None)
    w = torch.empty(64, 64)
    assert decode_layout(w, 1, compiled=True, capability=plain) == "streamed"
    assert decode_layout(w, 1, compiled=True, capability=cpu_capability("avx2")) == "avx2"
    assert decode_layout(w, 9, capability=cpu_capability("avx2")) != "avx2"


@pytest.mark.parametrize("isa", RUNNABLE)
def test_a_model_laid_out_for_the_kernels_keeps_its_logits_and_state(isa: str) -> None:
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4)).eval()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, 64, (2, 9))
    with torch.inference_mode():
        want = model(ids[:, :1]), model(ids)
        capability = cpu_capability(None if isa == HOST_ISA else isa)
        assert lay_out_for_decode(model, 2, capability=capability) == isa
        assert all(m.isa == isa for m in model.modules() if isinstance(m, KernelLinear))
        torch.testing.assert_close(model(ids[:, :1]), want[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(model(ids), want[1], atol=1e-5, rtol=1e-5)  # F.linear rows
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())


def test_int8_codes_are_tiled_for_one_row_only_and_every_path_still_reads_them() -> None:
    """At one row the int8 kernel's block is a whole tile; the prefill's dequantized product
    and the saved weight read the codes row-major as before."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4)
    ids = torch.randint(0, 64, (1, 9))
    for scheme, group in (("int8", None), ("int4", 32)):
        model = Transformer(config).eval()
        quantize_model(model, scheme, group, quantize_head=True)
        quantized = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
        saved = [m.quantized_weight().qweight.clone() for m in quantized]
        with torch.inference_mode():
            want = model(ids[:, :1]), model(ids)
            assert lay_out_for_decode(model, 2) == "row-major"  # two rows: codes as they were
            layout = lay_out_for_decode(model, 1)
            assert (layout == "int8 tiled") == (scheme == "int8")
            assert all(m.qweight.dim() == (4 if scheme == "int8" else 2) for m in quantized)
            assert torch.equal(model(ids[:, :1]), want[0])
            torch.testing.assert_close(model(ids), want[1], atol=1e-5, rtol=1e-5)
        for module, codes in zip(quantized, saved, strict=True):
            assert torch.equal(module.quantized_weight().qweight, codes)
            assert torch.equal(module.codes(), codes)


@pytest.mark.parametrize("profile", ["generic", "neon"])
def test_where_no_kernel_runs_int8_codes_stay_row_major(profile: str) -> None:
    """The plain path (ARM, Apple Silicon, no compiler) reads codes as saved: nothing tiles."""
    model = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=4)).eval()
    quantize_model(model, "int8", None, quantize_head=True)
    assert lay_out_for_decode(model, 1, capability=profile_capability(profile)) == "row-major"
    assert all(m.qweight.dim() == 2 for m in model.modules() if isinstance(m, QuantizedLinear))


def test_compiled_decode_calls_the_kernel_and_agrees() -> None:
    torch._dynamo.reset()
    q = quantize(weight(), "int4", 128)
    module = QuantizedLinear.from_weight(q)
    x = torch.randn(1, 1, IN)
    close(
        torch.compile(module, fullgraph=True)(x),
        F.linear(cpu_decode.integer_activations(x), q.dequantize()),
    )


def test_an_eager_decode_never_imports_torch_compile() -> None:
    """Importing torch._dynamo takes over a second of a process's start: one that loads the
    kernels, decodes eagerly (paged attention, sampling) must not pay it."""
    import subprocess
    import sys

    code = """
import sys
from lmforge.infer.engine import Engine, SamplingParams
from lmforge.kernels import cpu_decode
from lmforge.model import ModelConfig, Transformer

class Bytes:
    special_tokens = {"<|endoftext|>": 256}
    def token_bytes(self, token):
        return bytes([token % 256])

cpu_decode.isa_for()
config = ModelConfig(vocab_size=257, d_model=64, n_layers=1, n_heads=2, max_seq_len=32)
with Engine(Transformer(config), Bytes()) as engine:
    engine.generate([[1, 2, 3], [4, 5]], SamplingParams(max_tokens=4, temperature=1.0, seed=0))
print("torch._dynamo" in sys.modules)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "False"


def test_a_failed_compile_among_those_run_together_is_raised() -> None:
    import subprocess
    import sys

    ok, fails = [sys.executable, "-c", "pass"], [sys.executable, "-c", "raise SystemExit(3)"]
    cpu_decode._run_together([ok, ok])
    with pytest.raises(subprocess.CalledProcessError) as failure:
        cpu_decode._run_together([ok, fails, ok])
    assert failure.value.returncode == 3 and failure.value.cmd == fails
