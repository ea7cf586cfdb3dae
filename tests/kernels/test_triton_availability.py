"""Where the Triton kernels may run: never on a CPU without the interpreter (so training on a
CPU never tries), under the interpreter in fp32 but not with bf16 tl.dot, and never when the
interpreter was asked for only after triton was imported."""

import sys

import pytest
import torch

import lmforge.kernels.triton as kernels
from lmforge.errors import LmforgeError
from lmforge.kernels.triton import KERNELS, interpreted, load, unavailable
from lmforge.kernels.triton.interpreted import run_interpreted

interpreted.start()


@pytest.mark.parametrize("name", KERNELS)
def test_a_cpu_without_the_interpreter_gets_a_reason_for_every_kernel(name, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for dtype in (torch.float32, torch.bfloat16):
        reason = unavailable(name, "cpu", dtype)
        assert reason is not None and "GPU" in reason
    assert not kernels.available("cpu")


def reasons():
    """(in the child) unavailable() for every kernel on the CPU, fp32 and bf16."""
    return {
        (name, str(dtype)): unavailable(name, "cpu", dtype)
        for name in KERNELS
        for dtype in (torch.float32, torch.bfloat16)
    }


def test_the_interpreter_runs_fp32_and_refuses_bf16_dot_kernels():
    got = run_interpreted(__file__, "reasons")
    for name in KERNELS:
        assert got[(name, "torch.float32")] is None
        bf16 = got[(name, "torch.bfloat16")]
        if name in ("flash_attention", "matmul"):
            assert "tl.dot is wrong" in bf16
        else:
            assert bf16 is None


def test_interpreter_asked_for_after_triton_was_imported_is_refused(monkeypatch):
    load("swiglu")  # imports triton here, compiled, as torch._dynamo does in any test run
    assert not interpreted.triton_interpreted()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delitem(sys.modules, "lmforge.kernels.triton.swiglu")
    monkeypatch.delattr(kernels, "swiglu")
    assert "after triton was imported" in unavailable("swiglu", "cpu")
    with pytest.raises(LmforgeError, match="after triton was imported"):
        load("swiglu")


def test_unknown_kernels_and_dtypes():
    with pytest.raises(LmforgeError, match="unknown Triton kernel 'softmax'"):
        unavailable("softmax")
    with pytest.raises(LmforgeError, match="unknown Triton kernel"):
        load("softmax")
    assert "fp32, bf16 or fp16" in unavailable("rmsnorm", "cuda", torch.float64)
