"""The Triton RMSNorm under the interpreter (fp32) against lmforge.model.layers.RMSNorm: values,
input and weight gradients, for rows that do not fill the backward's programs evenly."""

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.kernels.triton import interpreted, load
from lmforge.kernels.triton.interpreted import forward_backward
from lmforge.model.layers import RMSNorm

interpreted.start()


def reference(x, weight, eps, grad):
    norm = RMSNorm(x.shape[-1], eps=eps)
    with torch.no_grad():
        norm.weight.copy_(weight)
    x = x.clone().requires_grad_()
    out = norm(x)
    out.backward(grad)
    return out.detach(), x.grad, norm.weight.grad


# the backward splits rows over 4 programs: 37 rows leave the last one short, 3 rows use 3
@pytest.mark.parametrize(("shape", "eps"), [((37, 100), 1e-5), ((2, 5, 7), 1e-6), ((3, 16), 0.1)])
def test_values_and_gradients_equal_the_model_layer(shape, eps):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g) * 3
    weight = torch.randn(shape[-1], generator=g)
    grad = torch.randn(*shape, generator=g)
    out, (dx, dw) = forward_backward(
        "rmsnorm", "rms_norm", x.clone().requires_grad_(), weight.clone().requires_grad_(), eps,
        grad=grad,
    )  # fmt: skip
    want = reference(x, weight, eps, grad)
    for name, a, b in zip(("out", "dx", "dweight"), (out, dx, dw), want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"{name} differs")


def test_a_weight_of_another_size_is_a_clear_error():
    rmsnorm = load("rmsnorm")  # checked before any kernel runs
    with pytest.raises(LmforgeError, match="weight of x's last dim"):
        rmsnorm.rms_norm(torch.randn(4, 8), torch.ones(7))
