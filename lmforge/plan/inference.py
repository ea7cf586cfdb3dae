"""Inference roofline: KV cache, prefill (compute-bound) and decode (memory-bound) speed.

A decode step reads every weight it uses once (shared by the whole batch) and each sequence's
KV cache, and does 2 FLOPs per active weight plus attention per sequence. Its time is the larger
of bytes / bandwidth and FLOPs / peak; the batch at which the two are equal is where decoding
turns compute-bound (the hardware's ridge point, peak / bandwidth FLOPs per byte, against the
step's arithmetic intensity). Weights and bandwidth are those of the `gpus` devices a
tensor-parallel group holds the model on.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmforge.plan.flops import attention_flops_per_token
from lmforge.plan.params import expert_params, matmul_params, param_counts
from lmforge.plan.shapes import ModelShape

WEIGHT_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}


def quantized_bytes_read(
    shape: ModelShape, scheme: str, group_size: int = 128, quantized_head: bool = False
) -> float:
    """Weights one batch-1 decode step streams from lmforge's quantized layout (lmforge
    quantize): int8 codes with one fp32 scale per output row, or int4 codes two to a byte with
    an fp32 scale and zero per group of `group_size`; routers in fp32, and the head in fp32 or,
    with `quantized_head` (--quantize-head), in the same layout. Dense blocks only: every matrix
    is read."""

    def matrix(rows: int, cols: int) -> float:
        if scheme == "int8":
            return rows * cols + 4 * rows
        return rows * cols / 2 + 8 * rows * cols / group_size

    d, kv, ff = shape.d_model, shape.kv_dim, shape.d_ff
    block = 2 * matrix(d, d) + 2 * matrix(kv, d) + 2 * matrix(ff, d) + matrix(d, ff)
    head = matrix(shape.vocab_size, d) if quantized_head else shape.vocab_size * d * 4.0
    return shape.n_layers * block + head


def kv_bytes_per_token(shape: ModelShape, kv_bytes: float = 2) -> float:
    """K and V of every layer: 2·L·kv_heads·head_dim values."""
    return 2 * shape.n_layers * shape.kv_dim * kv_bytes


def experts_read(shape: ModelShape, batch: int) -> float:
    """Expected distinct experts a batch touches per block: E·(1 − (1 − k/E)^batch), plus the
    shared ones."""
    if not shape.n_experts:
        return 1.0
    e, k = shape.n_experts, shape.experts_per_token
    return e * (1 - (1 - k / e) ** batch) + shape.shared_experts


def weight_bytes_read(shape: ModelShape, batch: int, weight_bytes: float) -> float:
    """Weights one decode step streams: all matmul weights it uses (not the embedding table,
    of which it reads one row per sequence)."""
    idle = shape.n_layers * (shape.active_experts - experts_read(shape, batch))
    return (matmul_params(shape) - idle * expert_params(shape)) * weight_bytes


@dataclass(frozen=True)
class DecodeStep:
    memory_s: float
    compute_s: float

    @property
    def seconds(self) -> float:
        return max(self.memory_s, self.compute_s)

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"


def decode_step(
    shape: ModelShape,
    batch: int,
    context: int,
    peak_flops: float,
    bandwidth: float,
    weight_bytes: float = 2,
    kv_bytes: float = 2,
) -> DecodeStep:
    """One new token for each of `batch` sequences that already hold `context` tokens."""
    read = weight_bytes_read(shape, batch, weight_bytes)
    read += batch * context * kv_bytes_per_token(shape, kv_bytes)
    flops = batch * (2 * matmul_params(shape) + attention_flops_per_token(shape, context))
    return DecodeStep(read / bandwidth, flops / peak_flops)


def ridge_batch(
    shape: ModelShape,
    context: int,
    peak_flops: float,
    bandwidth: float,
    weight_bytes: float = 2,
    kv_bytes: float = 2,
) -> float | None:
    """The batch at which decode turns compute-bound; None if the KV reads keep it memory-bound.

    Solves b·F/peak = (W + b·KV)/bandwidth for b, with F the FLOPs and KV the cache bytes per
    sequence and W the weights read (dense: all of them; a MoE's grow with the batch, taken
    at the full set here, which the large batch of a ridge point reads).
    """
    flops = 2 * matmul_params(shape) + attention_flops_per_token(shape, context)
    kv = context * kv_bytes_per_token(shape, kv_bytes)
    weights = weight_bytes_read(shape, 10**6, weight_bytes)
    slack = flops / peak_flops - kv / bandwidth
    return weights / bandwidth / slack if slack > 0 else None


def prefill_seconds(
    shape: ModelShape, prompt: int, batch: int, peak_flops: float, mfu: float
) -> float:
    """Compute-bound: 2 FLOPs per active weight per token plus causal attention (half of s²)."""
    flops = (
        batch * prompt * (2 * matmul_params(shape) + attention_flops_per_token(shape, prompt) / 2)
    )
    return flops / (peak_flops * mfu)


def max_batch(
    shape: ModelShape,
    context: int,
    memory_bytes: float,
    weight_bytes: float = 2,
    kv_bytes: float = 2,
) -> int:
    """Sequences of `context` tokens whose KV cache fits beside the weights (0: weights alone
    do not fit)."""
    free = memory_bytes - param_counts(shape)["total"] * weight_bytes
    return max(0, int(free // (context * kv_bytes_per_token(shape, kv_bytes))))
