"""`--parallel` parsing and validation: pure functions, no processes."""

import pytest

from lmforge.errors import LmforgeError
from lmforge.parallel.layout import Layout, check_batch, check_model, parse_layout, resolve_layout
from lmforge.train import TrainConfig
from lmforge.train.config import ParallelConfig


def test_parse_names_degrees():
    assert parse_layout("") == {}
    assert parse_layout("dp=2, tp=2") == {"dp": 2, "tp": 2}
    assert parse_layout("fsdp=4") == {"fsdp": 4}


@pytest.mark.parametrize(
    "text, message",
    [
        ("pp=2", "not of the form DIM=N"),
        ("dp2", "not of the form DIM=N"),
        ("tp=two", "not of the form DIM=N"),
        ("dp=2,dp=2", "names dp twice"),
        ("tp=0", "at least 1"),
    ],
)
def test_parse_rejects_malformed(text, message):
    with pytest.raises(LmforgeError, match=message):
        parse_layout(text)


def test_train_config_validates_the_format():
    with pytest.raises(LmforgeError, match="not of the form"):
        TrainConfig(max_steps=1, parallel=ParallelConfig(layout="tensor=2")).validate()


def test_rest_of_the_world_goes_to_dp():
    assert resolve_layout("", 8) == Layout(dp=8)
    assert resolve_layout("tp=2", 8) == Layout(dp=4, tp=2)
    assert resolve_layout("fsdp=2,tp=2", 4) == Layout(fsdp=2, tp=2)
    assert resolve_layout("fsdp=2,tp=2", 8) == Layout(dp=2, fsdp=2, tp=2)
    assert resolve_layout("dp=2,tp=2", 4).data_parallel == 2
    assert str(resolve_layout("", 1)) == "single process"


def test_degree_not_dividing_the_world_is_refused():
    with pytest.raises(LmforgeError, match="tp=3 does not divide world size 4"):
        resolve_layout("tp=3", 4)


def test_layout_larger_than_the_world_names_the_launch():
    with pytest.raises(LmforgeError, match="needs 4 processes but the world size is 1"):
        resolve_layout("fsdp=2,tp=2", 1)
    with pytest.raises(LmforgeError, match="needs 2 processes but the world size is 4"):
        resolve_layout("dp=2", 4)


def test_tp_must_divide_the_heads():
    with pytest.raises(LmforgeError, match="tp=4 does not divide 6 heads"):
        check_model(Layout(tp=4), n_heads=6, n_kv_heads=6, ffn_dim=256, n_experts=0)
    with pytest.raises(LmforgeError, match="does not divide 2 kv heads"):
        check_model(Layout(tp=4), n_heads=8, n_kv_heads=2, ffn_dim=256, n_experts=0)
    with pytest.raises(LmforgeError, match="mixture of experts"):
        check_model(Layout(tp=2), n_heads=8, n_kv_heads=8, ffn_dim=256, n_experts=4)
    check_model(Layout(dp=4), n_heads=6, n_kv_heads=6, ffn_dim=250, n_experts=4)


def test_global_batch_and_sequence_must_split():
    with pytest.raises(LmforgeError, match="batch_size 6 .* does not split over 4"):
        check_batch(Layout(dp=2, fsdp=2), batch_size=6, seq_len=32, sequence_parallel=False)
    with pytest.raises(LmforgeError, match="seq_len 30 does not split over tp=4"):
        check_batch(Layout(tp=4), batch_size=8, seq_len=30, sequence_parallel=True)
    check_batch(Layout(tp=4), batch_size=8, seq_len=30, sequence_parallel=False)
