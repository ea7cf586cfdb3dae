"""Rotary position embeddings in the Hugging Face Llama "rotate_half" layout.

Channel i of a head is paired with channel i + head_dim/2 and the pair is rotated by
position · theta^(-2i/head_dim), so weights export to Hugging Face without permutation.
"""

from __future__ import annotations

import torch
from torch import nn


def rope_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every (position, channel) angle, each of shape (max_seq_len, head_dim)."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x of shape (..., T, head_dim) by the angles cos, sin of shape (T, head_dim).

    x·cos + rotate_half(x)·sin. Run eagerly, it is computed without building rotate_half(x),
    and its backward is the rotation by the opposite angles rather than autograd's trace
    through slices, negation and concatenation; torch.compile gets the formula itself, which
    it fuses into one kernel each way.
    """
    if torch.compiler.is_compiling():
        return (x * cos + rotate_half(x) * sin).to(x.dtype)
    if torch.is_grad_enabled() and x.requires_grad:
        return _Rotate.apply(x, cos, sin)
    return _rotate(x, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x·cos + rotate_half(x)·sin, bit for bit, without building rotate_half(x): each half of
    x·cos takes the other half of x times sin, in place."""
    half = x.shape[-1] // 2
    y = x * cos
    y[..., :half] -= x[..., half:] * sin[..., :half]
    y[..., half:] += x[..., :half] * sin[..., half:]
    return y.to(x.dtype)


class _Rotate(torch.autograd.Function):
    """A rotation's gradient is the inverse rotation: the same products with sin negated (the
    tables repeat each angle in both halves, so rotate_half commutes with the product by sin)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        return _rotate(x, cos, sin)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        cos, sin = ctx.saved_tensors
        return _rotate(grad, cos, -sin), None, None


class RotaryEmbedding(nn.Module):
    """Holds the cos/sin tables for max_seq_len positions and slices them by position."""

    def __init__(self, head_dim: int, max_seq_len: int, theta: float = 10000.0) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.max_seq_len = max_seq_len
        self.theta = theta
        self.register_buffer("cos", torch.empty(max_seq_len, head_dim), persistent=False)
        self.register_buffer("sin", torch.empty(max_seq_len, head_dim), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        cos, sin = rope_tables(self.head_dim, self.max_seq_len, self.theta)
        with torch.no_grad():
            self.cos.copy_(cos)
            self.sin.copy_(sin)

    def forward(self, start: int | torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for positions start .. start+length-1, each of shape (length, head_dim).

        A LongTensor start (B,) gives each row its own positions: shapes (B, 1, length, head_dim).
        """
        if isinstance(start, int):
            return self.cos[start : start + length], self.sin[start : start + length]
        positions = start[:, None] + torch.arange(length, device=start.device)
        return self.at(positions)

    def at(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for positions (B, T), each of shape (B, 1, T, head_dim)."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)
