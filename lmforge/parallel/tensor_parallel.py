"""Megatron-style tensor parallelism on DTensor, with optional sequence parallelism.

Per block: q/k/v and the MLP's gate/up projections are column-parallel (each rank holds a slice
of the heads and of the MLP width), the attention output and MLP down projections row-parallel,
so a block's forward needs one all-reduce after attention and one after the MLP (and the same
two in backward). Sequence parallelism replaces each all-reduce with a reduce-scatter onto a
sequence-sharded residual stream and an all-gather after the next norm, so norms run on 1/tp
of the tokens. The output head is column-parallel over the vocabulary and the loss is computed
on the vocabulary shards (`loss_parallel`), never gathering the logits. The token embedding
(and, without sequence parallelism, the norms) stay whole on every rank, as replicated DTensors:
every parameter is then a DTensor, so optimizer groups and checkpoints look the same whatever
the layout.

lmforge's Linear is its own module, so the column/row styles here are small `distribute_module`
plans rather than torch's ColwiseParallel/RowwiseParallel, which accept only nn.Linear.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import (
    DTensor,
    Placement,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
)
from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module

from lmforge.model import Transformer


def apply_tensor_parallel(model: Transformer, mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Shard `model`'s blocks and output head over the 1-D `mesh`, in place."""
    residual: Placement = Shard(1) if sequence_parallel else Replicate()
    for block in model.layers:
        for linear in (block.attn.q_proj, block.attn.k_proj, block.attn.v_proj):
            column_parallel(linear, mesh)
        for linear in (block.mlp.gate_proj, block.mlp.up_proj):
            column_parallel(linear, mesh)
        row_parallel(block.attn.o_proj, mesh, residual)
        row_parallel(block.mlp.down_proj, mesh, residual)
        for norm in (block.attn_norm, block.mlp_norm):
            norm_parallel(norm, mesh, sequence_parallel)
    replicated(model.tok_embeddings, mesh, output=residual)
    norm_parallel(model.norm, mesh, sequence_parallel)
    column_parallel(model.output, mesh, local_output=False)  # vocab-sharded logits


def column_parallel(linear: nn.Module, mesh: DeviceMesh, local_output: bool = True) -> None:
    """Weight (out, in) sharded over `out`: replicated input in, feature-sharded output out."""

    def inputs(module, args, mesh):
        # The norm before q/k/v (or gate/up) hands them one replicated DTensor; using it as is
        # lets their input gradients add up as partial sums, reduced once for all of them.
        x = args[0]
        if not isinstance(x, DTensor):
            return DTensor.from_local(x, mesh, [Replicate()], run_check=False)
        return x if x.placements == (Replicate(),) else x.redistribute(mesh, [Replicate()])

    def outputs(module, y, mesh):
        return y.to_local() if local_output else y

    distribute_module(linear, mesh, _shard_weight(0), inputs, outputs)


def row_parallel(linear: nn.Module, mesh: DeviceMesh, output: Placement) -> None:
    """Weight sharded over `in`: feature-sharded input, partial sums reduced to `output`."""

    def inputs(module, args, mesh):
        return DTensor.from_local(args[0], mesh, [Shard(-1)], run_check=False)

    def outputs(module, y, mesh):
        return y.redistribute(mesh, [output]).to_local()

    distribute_module(linear, mesh, _shard_weight(1), inputs, outputs)


def norm_parallel(norm: nn.Module, mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """With sequence parallelism: normalise the local tokens of a sequence-sharded input, then
    all-gather the sequence, so that the next column-parallel projections (or the output head)
    read it whole; in backward the gather becomes a reduce-scatter. Without: a replicated norm.
    """
    if not sequence_parallel:
        replicated(norm, mesh)
        return
    parallelize_module(norm, mesh, SequenceParallel())
    norm.register_forward_hook(lambda module, args, y: y.redistribute(y.device_mesh, [Replicate()]))
    _reduce_partial_grads(norm)


def replicated(module: nn.Module, mesh: DeviceMesh, output: Placement | None = None) -> None:
    """Whole parameters on every rank. The output stays a replicated DTensor, or is laid out
    as `output` and handed on as a local tensor."""

    def inputs(module, args, mesh):
        return DTensor.from_local(args[0], mesh, [Replicate()], run_check=False)

    def outputs(module, y, mesh):
        return y if output is None else y.redistribute(mesh, [output]).to_local()

    distribute_module(module, mesh, input_fn=inputs, output_fn=outputs)
    _reduce_partial_grads(module)


def _reduce_partial_grads(module: nn.Module) -> None:
    """A replicated parameter used on a shard of the tokens gets a partial-sum gradient on each
    rank: reduce it once it is complete, so clipping and the optimizer see the whole one."""
    for param in module.parameters():
        param.register_post_accumulate_grad_hook(_reduce_partial_grad)


def _reduce_partial_grad(param: DTensor) -> None:
    if any(p.is_partial() for p in param.grad.placements):
        param.grad = param.grad.redistribute(param.device_mesh, param.placements)


def _shard_weight(dim: int):
    def partition(name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        weight = distribute_tensor(module.weight, mesh, [Shard(dim)])
        module.register_parameter("weight", nn.Parameter(weight, module.weight.requires_grad))

    return partition
