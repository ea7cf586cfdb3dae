"""The Triton tiled matmul under the interpreter (fp32) against torch.matmul: odd shapes in
every dim, leading dims, a transposed (strided) operand, values and both gradients; and its
autotuning: several block sizes on a GPU, one small config under the interpreter."""

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.kernels.triton import interpreted, load
from lmforge.kernels.triton.interpreted import forward_backward, run_interpreted

interpreted.start()


@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [((37, 51), (51, 29)), ((2, 5, 33), (33, 17)), ((45,), (45, 7)), ((3, 5), (5, 40))],
)
def test_values_and_gradients_equal_torch_matmul(a_shape, b_shape):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(*a_shape, generator=g), torch.randn(*b_shape, generator=g)
    grad = torch.randn(*a_shape[:-1], b_shape[1], generator=g)
    out, (da, db) = forward_backward(
        "matmul", "matmul", a.clone().requires_grad_(), b.clone().requires_grad_(), grad=grad
    )
    a_ref, b_ref = a.clone().requires_grad_(), b.clone().requires_grad_()
    want = torch.matmul(a_ref, b_ref)
    want.backward(grad)
    torch.testing.assert_close(out, want.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(da, a_ref.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(db, b_ref.grad, rtol=1e-5, atol=1e-5)


def linear(x, weight):
    """(in the child) x @ weight.T with the weight's transpose read through its strides."""
    return load("matmul").matmul(x, weight.t()).detach()


def test_a_transposed_weight_is_read_in_place():
    g = torch.Generator().manual_seed(1)
    x, weight = torch.randn(19, 50, generator=g), torch.randn(23, 50, generator=g)
    got = run_interpreted(__file__, "linear", x=x, weight=weight)
    torch.testing.assert_close(got, x @ weight.T, rtol=1e-5, atol=1e-5)


def block_sizes():
    """(in the child or here) The autotuner's candidate (BLOCK_M, BLOCK_N, BLOCK_K)."""
    return sorted(
        (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"])
        for c in load("matmul")._matmul.configs
    )


def test_the_gpu_autotunes_over_block_sizes_and_the_interpreter_runs_one_small_config():
    gpu = block_sizes()  # this process imported the kernels compiled, as on a GPU
    assert len(set(gpu)) >= 5 and min(gpu) >= (64, 64, 32)
    assert run_interpreted(__file__, "block_sizes") == [(16, 16, 16)]


def test_mismatched_operands_are_a_clear_error():
    matmul = load("matmul").matmul
    with pytest.raises(LmforgeError, match="a \\(..., K\\) and b \\(K, N\\)"):
        matmul(torch.randn(3, 4), torch.randn(5, 6))
    with pytest.raises(LmforgeError, match="one float dtype"):
        matmul(torch.randn(3, 4), torch.randn(4, 6, dtype=torch.float64))
