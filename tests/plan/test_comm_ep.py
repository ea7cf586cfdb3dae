"""The planner's communication for expert parallelism: the all-to-alls per MoE block, the
experts left out of data parallelism's collectives, and the edp all-reduce."""

import pytest

from lmforge.errors import LmforgeError
from lmforge.plan.comm import comm_bytes_per_step, ep_all_to_all_bytes
from lmforge.plan.layout import Layout
from lmforge.plan.params import expert_params, param_counts
from lmforge.plan.shapes import ModelShape

MOE = ModelShape("moe", 1000, 64, 2, 4, 4, 128, n_experts=8, experts_per_token=2)


def test_ep_adds_the_all_to_alls_and_takes_the_experts_out_of_dp():
    plain = comm_bytes_per_step(MOE, Layout(dp=4), 2, 32, "fp32")
    ep = comm_bytes_per_step(MOE, Layout(dp=4, ep=2), 2, 32, "fp32")
    experts = MOE.n_layers * MOE.n_experts * expert_params(MOE)
    assert plain["dp.all_reduce"] == param_counts(MOE)["total"] * 4
    assert ep["dp.all_reduce"] == plain["dp.all_reduce"] - experts * 4
    assert ep["ep.all_to_all"] == ep_all_to_all_bytes(64, 2, 64, 8, 2, 4)
    assert ep["edp.all_reduce"] == experts // 2 * 4  # 2 replicas of each half of the experts


def test_ep_over_every_data_rank_has_no_edp_and_a_dense_model_no_ep():
    assert "edp.all_reduce" not in comm_bytes_per_step(MOE, Layout(fsdp=2, ep=2), 2, 32)
    dense = ModelShape("dense", 1000, 64, 2, 4, 4, 128)
    assert "ep.all_to_all" not in comm_bytes_per_step(dense, Layout(dp=2, ep=2), 2, 32)


def test_ep_dims_and_their_spans():
    assert Layout(dp=2, fsdp=2, ep=2).dims() == [
        ("fsdp", 2, 2), ("dp", 2, 4), ("ep", 2, 2), ("edp", 2, 4),
    ]  # fmt: skip
    with pytest.raises(LmforgeError, match="pick ep dividing dp·fsdp"):
        Layout(fsdp=2, ep=4)


def test_ep_splits_the_experts_state_and_fsdp_the_rest():
    from lmforge.plan.memory import state_bytes
    from lmforge.plan.precision import precision_bytes

    fp32 = precision_bytes("fp32")
    experts = MOE.n_layers * MOE.n_experts * expert_params(MOE)
    rest = param_counts(MOE)["total"] - experts
    state = state_bytes(MOE, Layout(fsdp=4, ep=2), fp32)
    assert state.params == (-(-rest * fp32.param // 4)) + experts // 2 * fp32.param
