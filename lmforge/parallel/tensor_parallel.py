"""Megatron-style tensor parallelism on DTensor, with optional sequence parallelism.

Per block: q/k/v and the MLP's gate/up projections are column-parallel (each rank holds a slice
of the heads and of the MLP width), the attention output and MLP down projections row-parallel,
so a block's forward needs one all-reduce after attention and one after the MLP (and the same
two in backward). Sequence parallelism replaces each all-reduce with a reduce-scatter onto a
sequence-sharded residual stream and an all-gather after the next norm, so norms run on 1/tp
of the tokens. The output head is column-parallel over the vocabulary and the loss is computed
on the vocabulary shards (`loss_parallel`), never gathering the logits. The token embedding
stays replicated.

lmforge's Linear is its own module, so the column/row styles here are small `distribute_module`
plans rather than torch's ColwiseParallel/RowwiseParallel, which accept only nn.Linear.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard, distribute_module
from torch.distributed.tensor import distribute_tensor as _distribute
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
        if sequence_parallel:
            sequence_parallel_norm(block.attn_norm, mesh)
            sequence_parallel_norm(block.mlp_norm, mesh)
    if sequence_parallel:
        model.tok_embeddings.register_forward_hook(_scatter_sequence(mesh))
        sequence_parallel_norm(model.norm, mesh)
    column_parallel(model.output, mesh, local_output=False)  # vocab-sharded logits


def column_parallel(linear: nn.Module, mesh: DeviceMesh, local_output: bool = True) -> None:
    """Weight (out, in) sharded over `out`: replicated input in, feature-sharded output out."""

    def inputs(module, args, mesh):
        x = args[0]
        if not isinstance(x, DTensor):
            x = DTensor.from_local(x, mesh, [Replicate()], run_check=False)
        return x.redistribute(mesh, [Replicate()])

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


def sequence_parallel_norm(norm: nn.Module, mesh: DeviceMesh) -> None:
    """Normalise the local tokens of a sequence-sharded input, then all-gather the sequence.

    The gather sits after the norm so that the next layer's column-parallel projections (or the
    output head) all read one full sequence; in backward it becomes a reduce-scatter.
    """
    parallelize_module(norm, mesh, SequenceParallel())
    norm.register_forward_hook(lambda module, args, y: y.redistribute(y.device_mesh, [Replicate()]))


def _shard_weight(dim: int):
    def partition(name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        weight = _distribute(module.weight, mesh, [Shard(dim)])
        module.register_parameter("weight", nn.Parameter(weight, module.weight.requires_grad))

    return partition


def _scatter_sequence(mesh: DeviceMesh):
    """Forward hook: keep this rank's chunk of the (replicated) embedding output's sequence."""

    def hook(module, args, y):
        full = DTensor.from_local(y, mesh, [Replicate()], run_check=False)
        return full.redistribute(mesh, [Shard(1)]).to_local()

    return hook
