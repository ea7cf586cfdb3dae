"""Training memory per device: weights, gradients, optimizer state, activations, buffers.

Weights (P), gradients (G) and optimizer state (OS: fp32 master copy under mixed precision and
Adam's two fp32 moments) are split by tensor parallelism (matrices only; norm gains are
replicated) and then by the data-parallel shards of their ZeRO stage.

Saved activations are itemized from what lmforge's block keeps for backward, per token (e: the
activation dtype's bytes, d model width, f = d_ff / d, r = kv_heads / heads, h heads, k experts
a token runs, E experts):
- each RMSNorm: its fp32 input copy, its fp32 normalized value and its output in e (8 + e)·d;
- attention: q, k, v after RoPE and the attention output, e·(2 + 2r)·d, and the fp32
  log-sum-exp of every head, 4·h;
- the MLP: gate, up, SiLU and product outputs, e·4f·d; a MoE keeps them for each of the k
  experts a token visits, with the gathered input, the expert's output and its weighted output,
  e·k·(3 + 4f)·d, and the router's logits, e·E;
- full checkpointing keeps only the block input (residual dtype ρ); selective keeps the block
  input and the outputs of matmuls and attention, ρ·d + e·(3 + 2r)·d + e·k·(2f + 1)·d + e·E.
Tensor parallelism splits all but the norm terms by tp; sequence parallelism splits those too.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmforge.plan.comm import root_params, tp_local_params
from lmforge.plan.layout import Layout
from lmforge.plan.params import expert_params
from lmforge.plan.precision import PrecisionBytes
from lmforge.plan.shapes import ModelShape

DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's bucket_cap_mb; two buckets are in flight at once


@dataclass(frozen=True)
class StateBytes:
    params: int
    grads: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer


def state_bytes(shape: ModelShape, layout: Layout, precision: PrecisionBytes) -> StateBytes:
    """P, G and OS bytes on one device. Under expert parallelism the routed experts are split
    ep ways (and replicated over the edp ranks) while the rest is sharded as the layout says."""
    local = tp_local_params(shape, layout.tp)
    experts = 0
    if layout.ep > 1 and shape.n_experts:
        experts = shape.n_layers * shape.n_experts * expert_params(shape) // layout.ep
        local -= experts * layout.ep
    shard_p, shard_g, shard_os = layout.shards()
    return StateBytes(
        params=-(-local * precision.param // shard_p) + experts * precision.param,
        grads=-(-local * precision.grad // shard_g) + experts * precision.grad,
        optimizer=-(-local * precision.optimizer // shard_os) + experts * precision.optimizer,
    )


def activation_bytes_per_layer(
    shape: ModelShape,
    micro_batch: int,
    seq_len: int,
    mode: str = "none",
    activation: int = 2,
    residual: int | None = None,
    tp: int = 1,
    sp: bool = False,
) -> float:
    """Bytes one block keeps for backward for a (micro_batch, seq_len) input; see the module doc.

    `residual` is the residual stream's dtype bytes (fp32 under autocast with fp32 weights);
    it defaults to `activation`.
    """
    e, rho, d = activation, residual or activation, shape.d_model
    f, r, k = shape.d_ff / d, shape.n_kv_heads / shape.n_heads, shape.active_experts
    router = e * shape.n_experts
    seq_split = tp if sp else 1
    if mode == "full":
        per_token = rho * d / seq_split
    elif mode == "selective":
        split = e * (3 + 2 * r) * d + e * k * (2 * f + 1) * d + router + 4 * shape.n_heads
        per_token = rho * d / seq_split + split / tp
    else:
        mlp = e * k * (3 + 4 * f) * d + router if shape.n_experts else e * 4 * f * d
        split = e * (2 + 2 * r) * d + mlp + 4 * shape.n_heads
        per_token = (2 * (8 + e) * d + 8) / seq_split + split / tp
    return micro_batch * seq_len * per_token


def head_activation_bytes(
    shape: ModelShape, micro_batch: int, seq_len: int, activation: int = 2
) -> float:
    """The final norm (8 + e)·d, the fp32 log-softmax of the loss 4·V, the ids and targets."""
    per_token = (8 + activation) * shape.d_model + 4 * shape.vocab_size + 16
    return micro_batch * seq_len * per_token


def buffer_bytes(shape: ModelShape, layout: Layout, precision: PrecisionBytes) -> int:
    """Communication buffers: FSDP's gathered parameters of two blocks (the current one and the
    prefetched next) and one block's unsharded gradients; DDP's buckets in flight."""
    lay = layout.normalized()
    if lay.fsdp > 1:
        block = (tp_local_params(shape, lay.tp) - root_params(shape) // lay.tp) // shape.n_layers
        return block * (2 * precision.param + precision.grad)
    if lay.dp > 1:
        return 2 * DDP_BUCKET_BYTES
    return 0
