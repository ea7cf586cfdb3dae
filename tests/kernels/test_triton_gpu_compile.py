"""Every Triton kernel compiles for a GPU (sm_90, to PTX and a cubin) on this CPU machine.

The interpreter runs the kernels' Python, not Triton's compiler, so it cannot catch what only
compiling finds (a loop-carried value changing type, a constexpr misused, an op the GPU lacks).
triton.compile needs no GPU for that: these tests compile each kernel the way a launch would,
with every optional feature on and bf16 operands.
"""

import pytest
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from triton.runtime.autotuner import Autotuner

from lmforge.kernels.triton import load

H100 = GPUTarget("cuda", 90, 32)
SCALARS = {"scale": "fp32", "eps": "fp32"}  # every other non-pointer argument is an i32


def compile_for_gpu(kernel, pointers: dict, constexprs: dict, num_warps: int = 4):
    """The kernel compiled for H100; pointers name each pointer argument's element type."""
    fn = kernel.fn if isinstance(kernel, Autotuner) else kernel
    signature, constants = {}, {}
    for p in fn.params:
        if p.is_constexpr or pointers.get(p.name, "") is None:
            signature[p.name] = "constexpr"
            constants[p.name] = constexprs.get(p.name)
        elif p.name in pointers:
            signature[p.name] = "*" + pointers[p.name]
        else:
            signature[p.name] = SCALARS.get(p.name, "i32")
    source = ASTSource(fn, signature, constexprs=constants)
    return compile(source, target=H100, options={"num_warps": num_warps, "num_stages": 2})


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))


ATTENTION_FLAGS = {
    "IS_CAUSAL": True, "HAS_SEG": True, "HAS_MASK": True, "MASK_BOOL": True,
    "PRECISION": "tf32", "BLOCK_D": 64, "BLOCK_DV": 64, "BLOCK_M": 64, "BLOCK_N": 32,
}  # fmt: skip
ATTENTION_POINTERS = {
    "Q": "bf16", "K": "bf16", "V": "bf16", "DO": "bf16", "OUT": "bf16", "LSE": "fp32",
    "DELTA": "fp32", "DQ": "bf16", "DK": "bf16", "DV_OUT": "bf16",
    "SEG_Q": "i32", "SEG_K": "i32", "MASK": "u8",
}  # fmt: skip


@pytest.mark.parametrize("kernel", ["_forward", "_backward_dkdv", "_backward_dq"])
def test_flash_attention_compiles_with_causal_segments_and_a_mask(kernel):
    fa = load("flash_attention")
    compiled = compile_for_gpu(getattr(fa, kernel), ATTENTION_POINTERS, ATTENTION_FLAGS)
    assert ".entry " + kernel in compiled.asm["ptx"]
    assert compiled.asm["cubin"]


def test_the_other_kernels_compile():
    bf16 = "bf16"
    cases = [
        ("matmul", "_matmul", dict(A=bf16, B=bf16, C=bf16),
         dict(PRECISION="tf32", BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8)),
        ("flash_attention", "_delta", dict(OUT=bf16, DO=bf16, DELTA="fp32"),
         dict(BLOCK_M=16, BLOCK_DV=64)),
        ("rmsnorm", "_forward", dict(X=bf16, W="fp32", Y=bf16, RSTD="fp32"), dict(BLOCK_N=1024)),
        ("rmsnorm", "_backward", dict(DY=bf16, X=bf16, W="fp32", RSTD="fp32", DX=bf16,
                                      DW_PARTIAL="fp32"), dict(BLOCK_N=1024)),
        ("swiglu", "_forward", dict(GATE=bf16, UP=bf16, OUT=bf16), dict(BLOCK=1024)),
        ("swiglu", "_backward", dict(DOUT=bf16, GATE=bf16, UP=bf16, DGATE=bf16, DUP=bf16),
         dict(BLOCK=1024)),
        ("rope", "_rotate", dict(X=bf16, COS="fp32", SIN="fp32", Y=bf16),
         dict(BACKWARD=True, BLOCK=64)),
        ("linear_cross_entropy", "_loss_and_grad", dict(LOGITS=bf16, TARGETS="i64", LOSS="fp32"),
         dict(BLOCK=4096)),
    ]  # fmt: skip
    for module, kernel, pointers, constexprs in cases:
        compiled = compile_for_gpu(getattr(load(module), kernel), pointers, constexprs)
        assert compiled.asm["cubin"], (module, kernel)
