"""Communication per training step: bytes per collective and mesh dimension, and their time.

Byte convention (the one the distributed tests count real collectives with): the logical payload
per rank of each call. An all-reduce moves its tensor's bytes, an all-gather the bytes of the full
gathered output, a reduce-scatter the bytes of the full input. What each layout calls, per step
of `grad_accum` micro-batches of `micro_batch` × `seq_len` tokens (P: parameters held per TP
rank, parameters in the param dtype, gradients in the grad dtype):
- dp, ZeRO 0 (DDP): one all-reduce of all gradients per step (accumulation skips the sync).
- dp, ZeRO 1/2: a reduce-scatter of the gradients and an all-gather of the updated parameters.
- fsdp (ZeRO-3, FSDP2 with one unit per block and the root): per micro-batch, an all-gather of
  every parameter in forward, again of the blocks' parameters in backward when
  `reshard_after_forward` (FSDP2 never reshards the root, which backward needs first), and a
  reduce-scatter of every gradient. With dp > 1 too (HSDP), the dp dimension all-reduces the
  sharded gradients once per step.
- tp (Megatron): per block and micro-batch, 2 all-reduces of the (micro_batch, seq, d_model)
  activations in forward and 2 in backward (the forward ones again when full activation
  checkpointing recomputes the block); with sequence parallelism each all-reduce becomes an
  all-gather plus a reduce-scatter of the same full tensor. The output head is vocabulary-parallel
  (the loss runs on the logits' shards): its input gradient costs one more all-reduce of the
  activations per micro-batch in backward (sequence parallel: an all-gather in forward and a
  reduce-scatter in backward, plus an all-gather of the gradient of the replicated embedding's
  sequence-sharded output). The loss's own per-token statistics, a few floats per token, are
  left out.
- ep (expert parallel, within the data ranks): the all-to-alls of `ep_all_to_all_bytes` per MoE
  block and micro-batch; dp and fsdp then move every parameter but the experts, and with more
  data ranks than ep the edp ranks holding the same experts all-reduce their gradients once per
  step (the experts' share of an ep rank, E/ep of them).

Time uses ring costs: an all-reduce sends 2(n−1)/n of its bytes over each rank's link, an
all-gather or reduce-scatter (n−1)/n, at the link's bandwidth times its efficiency.
"""

from __future__ import annotations

from lmforge.plan.layout import Layout
from lmforge.plan.params import expert_params, norm_params, param_counts
from lmforge.plan.precision import precision_bytes
from lmforge.plan.shapes import ModelShape

RING_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n}
RING_FACTOR["all_gather"] = RING_FACTOR["reduce_scatter"] = lambda n: (n - 1) / n
RING_FACTOR["all_to_all"] = lambda n: (n - 1) / n  # the share of rows leaving the rank


def tp_local_params(shape: ModelShape, tp: int) -> int:
    """Parameters one TP rank holds: every matrix split tp ways, the norm gains replicated."""
    norms = norm_params(shape)
    return (param_counts(shape)["total"] - norms) // tp + norms


def root_params(shape: ModelShape) -> int:
    """Parameters outside the blocks (embeddings, positions, final norm, head)."""
    c = param_counts(shape)
    per_norm = c["norms"] // (2 * shape.n_layers + 1)
    return c["embeddings"] + c["positions"] + c["head"] + per_norm


def comm_bytes_per_step(
    shape: ModelShape,
    layout: Layout,
    micro_batch: int,
    seq_len: int,
    precision: str = "bf16",
    grad_accum: int = 1,
    activation_checkpointing: str = "none",
    reshard_after_forward: bool = True,
    param_bytes: int | None = None,
    grad_bytes: int | None = None,
    activation_bytes: int | None = None,
) -> dict[str, int]:
    """Bytes per rank per step, keyed `dim.op` (e.g. `fsdp.all_gather`); dims of size 1 omitted.

    The byte widths default to the precision's (bf16: 2-byte params, grads and activations) and
    can be overridden to match a run that, say, reduces fp32 gradients.
    """
    pb = precision_bytes(precision)
    p_bytes, g_bytes = param_bytes or pb.param, grad_bytes or pb.grad
    a_bytes = activation_bytes or pb.activation
    lay = layout.normalized()
    local = tp_local_params(shape, lay.tp)
    out: dict[str, int] = {}
    if lay.ep > 1 and shape.n_experts:
        experts = shape.n_layers * shape.n_experts * expert_params(shape)
        local -= experts
        out["ep.all_to_all"] = ep_all_to_all_bytes(
            micro_batch * seq_len, shape.experts_per_token, shape.d_model, shape.n_experts,
            shape.n_layers, a_bytes, grad_accum, activation_checkpointing,
        )  # fmt: skip
        if lay.expert_data_parallel > 1:
            out["edp.all_reduce"] = experts // lay.ep * g_bytes
    if lay.fsdp > 1:
        blocks = local - root_params(shape) // lay.tp
        regathered = blocks if reshard_after_forward else 0
        out["fsdp.all_gather"] = grad_accum * (local + regathered) * p_bytes
        out["fsdp.reduce_scatter"] = grad_accum * local * g_bytes
    if lay.dp > 1:
        grads = local // lay.fsdp * g_bytes
        if lay.zero == 0 or lay.fsdp > 1:
            out["dp.all_reduce"] = grads
        else:
            out["dp.reduce_scatter"] = grads
            out["dp.all_gather"] = local * p_bytes
    if lay.tp > 1:
        activations = micro_batch * seq_len * shape.d_model * a_bytes
        forwards = 2 if activation_checkpointing == "full" else 1
        per_direction = 2 * shape.n_layers * activations * grad_accum
        total = per_direction * (forwards + 1) + activations * grad_accum  # + the head's
        if lay.sp:
            out["tp.all_gather"] = total + activations * grad_accum  # + the embedding's gradient
            out["tp.reduce_scatter"] = total
        else:
            out["tp.all_reduce"] = total
    return out


def ep_all_to_all_bytes(
    tokens: int,
    top_k: int,
    d_model: int,
    n_experts: int,
    n_moe_layers: int,
    activation_bytes: int,
    grad_accum: int = 1,
    activation_checkpointing: str = "none",
) -> int:
    """Expert-parallel all-to-all bytes per rank per step (parallel/expert_parallel.py's calls).

    Routing assumption: uniform, so every rank receives as many rows as it sends. Per MoE layer
    and micro-batch of `tokens` tokens on the rank: the per-expert counts (n_experts int64), then
    the dispatch of tokens·top_k rows of d_model and the combine of as many back, each again in
    backward (the forward ones again when full activation checkpointing recomputes the block).
    Rows a rank keeps for its own experts count too: the counter counts each call's input.
    """
    rows = tokens * top_k * d_model * activation_bytes
    forwards = 2 if activation_checkpointing == "full" else 1
    per_layer = forwards * (n_experts * 8 + 2 * rows) + 2 * rows
    return grad_accum * n_moe_layers * per_layer


def collective_time(op: str, nbytes: float, ranks: int, bandwidth: float) -> float:
    """Seconds for one ring collective of `nbytes` over `ranks` at `bandwidth` bytes/s."""
    return RING_FACTOR[op](ranks) * nbytes / bandwidth if ranks > 1 else 0.0
