"""The Triton SwiGLU gate under the interpreter (fp32) against F.silu(gate) * up and inside
lmforge.model.layers.SwiGLU: values and both gradients, sizes not a multiple of the block."""

import pytest
import torch
import torch.nn.functional as F

from lmforge.errors import LmforgeError
from lmforge.kernels.triton import interpreted, load
from lmforge.kernels.triton.interpreted import forward_backward, run_interpreted
from lmforge.model.layers import SwiGLU

interpreted.start()


@pytest.mark.parametrize("shape", [(5, 333), (2, 3, 7), (256,)])
def test_values_and_gradients_equal_silu_times_up(shape):
    g = torch.Generator().manual_seed(0)
    gate, up, grad = (torch.randn(*shape, generator=g) * 4 for _ in range(3))
    out, (d_gate, d_up) = forward_backward(
        "swiglu", "swiglu", gate.clone().requires_grad_(), up.clone().requires_grad_(), grad=grad
    )
    gate_ref, up_ref = gate.clone().requires_grad_(), up.clone().requires_grad_()
    want = F.silu(gate_ref) * up_ref
    want.backward(grad)
    torch.testing.assert_close(out, want.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(d_gate, gate_ref.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(d_up, up_ref.grad, rtol=1e-5, atol=1e-5)


def mlp_with_kernel(mlp, x):
    """(in the child) lmforge's SwiGLU MLP with its gate computed by the kernel."""
    swiglu = load("swiglu").swiglu
    return mlp.down_proj(swiglu(mlp.gate_proj(x), mlp.up_proj(x))).detach()


def test_the_model_mlp_is_unchanged_with_the_kernel_as_its_gate():
    torch.manual_seed(0)
    mlp, x = SwiGLU(24, 40), torch.randn(3, 5, 24)
    got = run_interpreted(__file__, "mlp_with_kernel", mlp=mlp, x=x)
    torch.testing.assert_close(got, mlp(x).detach(), rtol=1e-5, atol=1e-5)


def test_gate_and_up_of_different_shapes_are_a_clear_error():
    with pytest.raises(LmforgeError, match="one shape and dtype"):
        load("swiglu").swiglu(torch.randn(4, 8), torch.randn(4, 7))
