"""The Triton RoPE under the interpreter (fp32) against lmforge.model.rope.apply_rope: shared
and per-row tables, a half head_dim that is not a power of 2, values and gradients."""

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.kernels.triton import interpreted, load
from lmforge.kernels.triton.interpreted import forward_backward
from lmforge.model.rope import RotaryEmbedding, apply_rope

interpreted.start()


def compare(x, cos, sin):
    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    out, (dx,) = forward_backward("rope", "apply_rope", x.clone().requires_grad_(), cos, sin,
                                  grad=grad)  # fmt: skip
    x_ref = x.clone().requires_grad_()
    want = apply_rope(x_ref, cos, sin)
    want.backward(grad)
    torch.testing.assert_close(out, want.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dx, x_ref.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("head_dim", "start"), [(24, 0), (16, 5)])
def test_shared_tables_equal_the_model_rotation(head_dim, start):
    rope = RotaryEmbedding(head_dim, 64)
    x = torch.randn(2, 3, 13, head_dim, generator=torch.Generator().manual_seed(0))
    compare(x, *rope(start, 13))


def test_per_row_tables_give_each_row_its_positions():
    rope = RotaryEmbedding(24, 64)
    x = torch.randn(3, 2, 11, 24, generator=torch.Generator().manual_seed(0))
    compare(x, *rope(torch.tensor([0, 7, 30]), 11))  # tables (3, 1, 11, 24)


def test_tables_that_do_not_fit_are_a_clear_error():
    rope = load("rope")  # checked before any kernel runs
    cos, sin = RotaryEmbedding(24, 64)(0, 13)
    with pytest.raises(LmforgeError, match="even head_dim"):
        rope.apply_rope(torch.randn(2, 13, 23), cos[:, :23], sin[:, :23])
    with pytest.raises(LmforgeError, match="slice the tables"):
        rope.apply_rope(torch.randn(2, 12, 24), cos, sin)
    per_row = RotaryEmbedding(24, 64)(torch.tensor([0, 1]), 13)
    with pytest.raises(LmforgeError, match="do not broadcast"):
        rope.apply_rope(torch.randn(3, 2, 13, 24), *per_row)
