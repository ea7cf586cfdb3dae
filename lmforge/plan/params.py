"""Parameter counts by component, total and active (what one token's forward touches).

Counts are exact for the model each family builds: lmforge's Transformer for `llama` (tested
against `numel` of every preset built on the meta device) and Hugging Face's GPT2LMHeadModel
for `gpt2`.
"""

from __future__ import annotations

from lmforge.plan.explain import Line
from lmforge.plan.shapes import ModelShape


def attention_params(s: ModelShape) -> int:
    """Per block: q and o are d×d, k and v are d×kv_dim (GPT-2 adds 4·d biases)."""
    weights = 2 * s.d_model * s.d_model + 2 * s.d_model * s.kv_dim
    return weights + (4 * s.d_model if s.family == "gpt2" else 0)


def expert_params(s: ModelShape) -> int:
    """One MLP: SwiGLU's gate, up, down (3·d·d_ff), or GPT-2's fc and proj with biases."""
    if s.family == "gpt2":
        return 2 * s.d_model * s.d_ff + s.d_ff + s.d_model
    return 3 * s.d_model * s.d_ff


def router_params(s: ModelShape) -> int:
    return s.d_model * s.n_experts


def norm_params(s: ModelShape) -> int:
    """Two norms per block and a final one; LayerNorm has a bias beside its gain."""
    per_norm = 2 * s.d_model if s.family == "gpt2" else s.d_model
    return (2 * s.n_layers + 1) * per_norm


def param_counts(s: ModelShape) -> dict[str, int]:
    """Parameters by component, plus `total` and `active` (per token)."""
    counts = {
        "embeddings": s.vocab_size * s.d_model,
        "positions": s.max_seq_len * s.d_model if s.family == "gpt2" else 0,
        "attention": s.n_layers * attention_params(s),
        "mlp": s.n_layers * s.block_experts * expert_params(s),
        "router": s.n_layers * router_params(s),
        "norms": norm_params(s),
        "head": 0 if s.tie_embeddings else s.vocab_size * s.d_model,
    }
    total = sum(counts.values())
    idle = s.n_layers * (s.block_experts - s.active_experts) * expert_params(s)
    return {**counts, "total": total, "active": total - idle}


def matmul_params(s: ModelShape) -> int:
    """Weights one token multiplies through in the forward: 2 FLOPs each.

    Everything but the embedding lookup, biases and norm gains; the head counts even when tied.
    """
    per_block = 2 * s.d_model * s.d_model + 2 * s.d_model * s.kv_dim
    mlp = 3 * s.d_model * s.d_ff if s.family == "llama" else 2 * s.d_model * s.d_ff
    per_block += s.active_experts * mlp + router_params(s)
    return s.n_layers * per_block + s.vocab_size * s.d_model


def lines(s: ModelShape) -> list[Line]:
    c = param_counts(s)
    d, f, n_layers, kv = s.d_model, s.d_ff, s.n_layers, s.kv_dim
    gpt2 = s.family == "gpt2"
    mlp_formula = (
        f"L·(2·d·d_ff + d_ff + d) = {n_layers}·(2·{d}·{f} + {f} + {d})"
        if gpt2
        else f"L·E·3·d·d_ff = {n_layers}·{s.block_experts}·3·{d}·{f}"
    )
    out = [
        Line("embeddings", "embeddings", c["embeddings"], "params", f"V·d = {s.vocab_size}·{d}"),
        Line(
            "attention",
            "attention",
            c["attention"],
            "params",
            f"L·(2·d² + 2·d·kv_dim{' + 4·d' if gpt2 else ''}) = {n_layers}·(2·{d}² + 2·{d}·{kv}"
            f"{f' + 4·{d}' if gpt2 else ''})",
        ),
        Line("mlp", "MoE experts (all)" if s.n_experts else "MLP", c["mlp"], "params", mlp_formula),
        Line("norms", "norms", c["norms"], "params", f"(2·L + 1)·{'2·' if gpt2 else ''}d"),
        Line(
            "head",
            "output head",
            c["head"],
            "params",
            "0: tied to the embeddings" if s.tie_embeddings else f"V·d = {s.vocab_size}·{d}",
        ),
        Line("total", "total", c["total"], "params", "sum of the above"),
    ]
    if gpt2:
        out.insert(1, Line("positions", "positions", c["positions"], "params", "max_seq_len·d"))
    if s.n_experts:
        router = Line("router", "MoE router", c["router"], "params", f"L·d·E = {n_layers}·{d}·E")
        out.insert(3, router)
        out.append(
            Line(
                "active",
                "active per token",
                c["active"],
                "params",
                f"total − L·(E − k)·3·d·d_ff, k = {s.experts_per_token} of E = {s.n_experts}",
            )
        )
    return out
