"""The communication byte convention, checked by hand on a small shape."""

import pytest

from lmforge.config import PRESETS
from lmforge.plan.comm import collective_time, comm_bytes_per_step, root_params, tp_local_params
from lmforge.plan.layout import Layout
from lmforge.plan.params import param_counts
from lmforge.plan.shapes import from_model_config

SHAPE = from_model_config("tiny", PRESETS["tiny"]().model)
N = param_counts(SHAPE)["total"]


def test_ddp_all_reduces_every_gradient_once_per_step():
    out = comm_bytes_per_step(SHAPE, Layout(dp=4), 8, 64, "fp32", grad_accum=3)
    assert out == {"dp.all_reduce": 4 * N}


def test_fsdp_gathers_twice_but_the_root_once_and_reduce_scatters():
    out = comm_bytes_per_step(SHAPE, Layout(fsdp=2), 8, 64, "bf16")
    blocks = N - root_params(SHAPE)
    assert out == {"fsdp.all_gather": 2 * (N + blocks), "fsdp.reduce_scatter": 2 * N}
    kept = comm_bytes_per_step(SHAPE, Layout(fsdp=2), 8, 64, "bf16", reshard_after_forward=False)
    assert kept["fsdp.all_gather"] == 2 * N


def test_tensor_parallel_all_reduces_four_activations_per_block_and_one_for_the_head():
    out = comm_bytes_per_step(SHAPE, Layout(tp=2), 8, 64, "fp32")
    activations = 8 * 64 * SHAPE.d_model * 4
    assert out == {"tp.all_reduce": (4 * SHAPE.n_layers + 1) * activations}
    sp = comm_bytes_per_step(SHAPE, Layout(tp=2, sp=True), 8, 64, "fp32")
    assert sp["tp.reduce_scatter"] == out["tp.all_reduce"]
    assert sp["tp.all_gather"] == out["tp.all_reduce"] + activations  # the embedding's gradient
    full = comm_bytes_per_step(SHAPE, Layout(tp=2), 8, 64, "fp32", activation_checkpointing="full")
    assert full["tp.all_reduce"] == (6 * SHAPE.n_layers + 1) * activations


def test_tp_splits_matrices_but_not_norms_and_ring_costs():
    assert tp_local_params(SHAPE, 1) == N
    assert tp_local_params(SHAPE, 2) < N / 2 + 1000
    assert collective_time("all_reduce", 1e9, 8, 1e9) == pytest.approx(2 * 7 / 8)
    assert collective_time("all_gather", 1e9, 8, 1e9) == pytest.approx(7 / 8)
    assert collective_time("all_reduce", 1e9, 1, 1e9) == 0.0


def test_layout_dims_cross_nodes_from_the_inside_out():
    assert Layout(fsdp=8, tp=8).dims() == [("tp", 8, 8), ("fsdp", 8, 64)]
