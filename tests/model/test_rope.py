import torch

from lmforge.model import RotaryEmbedding, apply_rope


def complex_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Reference: pair channel i with i + D/2 as one complex number, multiply by e^{i·m·ω_i}."""
    d = x.shape[-1]
    omega = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    z = torch.complex(x[..., : d // 2].double(), x[..., d // 2 :].double())
    rotated = z * torch.polar(torch.ones_like(omega), positions.double()[:, None] * omega)
    return torch.cat([rotated.real, rotated.imag], dim=-1).to(x.dtype)


def test_rope_matches_complex_reference_at_offset():
    rope = RotaryEmbedding(head_dim=16, max_seq_len=64, theta=500.0)
    x = torch.randn(2, 3, 5, 16)
    cos, sin = rope(start=7, length=5)
    expected = complex_rope(x, torch.arange(7, 12), theta=500.0)
    torch.testing.assert_close(apply_rope(x, cos, sin), expected, atol=1e-5, rtol=1e-5)


def test_rope_preserves_norm():
    rope = RotaryEmbedding(head_dim=32, max_seq_len=128)
    x = torch.randn(4, 128, 32)
    y = apply_rope(x, *rope(0, 128))
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))


def test_rope_dot_product_depends_only_on_relative_position():
    rope = RotaryEmbedding(head_dim=16, max_seq_len=64)
    q, k = torch.randn(16), torch.randn(16)

    def score(m: int, n: int) -> torch.Tensor:
        return apply_rope(q, *rope(m, 1)) @ apply_rope(k, *rope(n, 1)).T

    for m, n in [(5, 2), (40, 37), (3, 0)]:
        torch.testing.assert_close(score(m, n), score(3, 0), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(score(5, 2), score(5, 3))


def test_rope_tables_are_not_saved_in_state_dict():
    assert RotaryEmbedding(8, 16).state_dict() == {}


def rotate_half_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The textbook form apply_rope must equal: x·cos + rotate_half(x)·sin."""
    x1, x2 = x.chunk(2, dim=-1)
    return (x * cos + torch.cat([-x2, x1], dim=-1) * sin).to(x.dtype)


def test_rope_equals_rotate_half_form_bit_for_bit():
    cos, sin = RotaryEmbedding(head_dim=16, max_seq_len=32)(0, 32)
    x = torch.randn(2, 32, 3, 16).transpose(1, 2)  # heads transposed, as attention passes them
    assert torch.equal(apply_rope(x, cos, sin), rotate_half_rope(x, cos, sin))
    xb = x.bfloat16()  # bf16 activations with fp32 tables, as under autocast
    assert torch.equal(apply_rope(xb, cos, sin), rotate_half_rope(xb, cos, sin))


def test_rope_gradient_matches_autograd_of_rotate_half_form():
    cos, sin = (t.double() for t in RotaryEmbedding(head_dim=16, max_seq_len=32)(0, 32))
    x = torch.randn(2, 3, 32, 16, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(2, 3, 32, 16, dtype=torch.float64)
    (ours,) = torch.autograd.grad(apply_rope(x, cos, sin), x, grad)
    (expected,) = torch.autograd.grad(rotate_half_rope(x, cos, sin), x, grad)
    torch.testing.assert_close(ours, expected, atol=1e-12, rtol=0)


def test_compiled_rope_matches_eager_forward_and_backward():
    cos, sin = RotaryEmbedding(head_dim=8, max_seq_len=4)(0, 4)
    x = torch.randn(2, 3, 4, 8, requires_grad=True)
    grad = torch.randn(2, 3, 4, 8)
    eager = apply_rope(x, cos, sin)
    (eager_grad,) = torch.autograd.grad(eager, x, grad)
    compiled = torch.compile(apply_rope, fullgraph=True)(x, cos, sin)
    (compiled_grad,) = torch.autograd.grad(compiled, x, grad)
    torch.testing.assert_close(compiled, eager)
    torch.testing.assert_close(compiled_grad, eager_grad)
