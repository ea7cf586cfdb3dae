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
