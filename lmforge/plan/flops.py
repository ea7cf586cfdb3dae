"""FLOPs per token and per run: 2 per active weight in forward, backward twice that, plus attention.

Forward, per token: 2·N for the matmuls (N: the weights a token multiplies through, head
included) and 4·L·d·s for attention's two s-long products (QKᵀ and PV over the full s × s
square, as `FlopCounterMode` counts them; a causal kernel can skip half). Backward costs twice
the forward, so training is 3× forward: the 6N + 12·L·d·s rule.
"""

from __future__ import annotations

from lmforge.plan.explain import Line
from lmforge.plan.params import matmul_params
from lmforge.plan.shapes import ModelShape


def attention_flops_per_token(shape: ModelShape, seq_len: int) -> float:
    """Forward FLOPs of QKᵀ and PV for one token attending over seq_len positions."""
    return 4.0 * shape.n_layers * shape.n_heads * shape.head_dim * seq_len


def forward_flops_per_token(shape: ModelShape, seq_len: int) -> float:
    return 2.0 * matmul_params(shape) + attention_flops_per_token(shape, seq_len)


def training_flops_per_token(shape: ModelShape, seq_len: int) -> float:
    """Forward + backward: 6·N + 12·L·d·s."""
    return 3.0 * forward_flops_per_token(shape, seq_len)


def lines(
    shape: ModelShape, seq_len: int, tokens: float, cluster_flops: float, mfu: float
) -> list[Line]:
    n = matmul_params(shape)
    attn = attention_flops_per_token(shape, seq_len)
    train = training_flops_per_token(shape, seq_len)
    total = train * tokens
    d_attn = shape.n_heads * shape.head_dim
    return [
        Line("matmul_params", "N (matmul weights per token)", n, "params", "active weights + head"),
        Line("forward_per_token", "forward per token", 2 * n + attn, "FLOP",
             f"2·N + 4·L·d·s = 2·{n:,} + 4·{shape.n_layers}·{d_attn}·{seq_len}"),
        Line("training_per_token", "forward + backward per token", train, "FLOP",
             f"6·N + 12·L·d·s = 6·{n:,} + 12·{shape.n_layers}·{d_attn}·{seq_len}"),
        Line("attention_share", "attention share", 3 * attn / train, "%", "12·L·d·s / total"),
        Line("run_total", "run total", total, "FLOP", f"per token × {tokens:,.0f} tokens"),
        Line("compute_time", f"compute time at {mfu:.0%} MFU", total / (cluster_flops * mfu), "s",
             f"{total:.3e} / ({cluster_flops:.3e} FLOP/s peak · {mfu})"),
    ]  # fmt: skip
