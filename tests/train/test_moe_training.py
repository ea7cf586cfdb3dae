"""The trainer on a mixture of experts: the balance losses reach backward but not the reported
loss, the balance biases move after each step (on the master behind a compute copy too), and
the routing metrics reach metrics.jsonl."""

import dataclasses

import torch

from lmforge.model import ModelConfig, Transformer
from lmforge.model.moe import moe_layers
from lmforge.train import TrainConfig, train
from lmforge.train.compose import compose
from lmforge.train.config import EvalConfig
from lmforge.train.guard import NonFiniteGuard
from lmforge.train.metrics import read_metrics
from lmforge.train.precision import make_precision
from lmforge.train.step import train_step

CPU = torch.device("cpu")
MOE = ModelConfig(
    vocab_size=64, d_model=32, n_layers=2, n_heads=4, max_seq_len=16, n_experts=4,
    experts_per_token=2,
)  # fmt: skip


class FixedBatches:
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(3)
        self.x = torch.randint(0, 64, (4, 16), generator=g)
        self.y = torch.randint(0, 64, (4, 16), generator=g)

    def next(self, step: int, micro: int, device: torch.device):
        return self.x, self.y


def one_step(config: ModelConfig, precision: str = "fp32", cast_module: bool = False):
    torch.manual_seed(0)
    model = Transformer(config)
    composed = compose(model, make_precision(precision, CPU, cast_module), CPU)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = NonFiniteGuard(CPU, 3)
    result = train_step(composed, optimizer, guard, FixedBatches(), 0, 0.1, 2, 0.0, CPU)
    return composed, result


def test_the_balance_losses_train_the_router_but_are_not_the_reported_loss():
    plain, plain_result = one_step(MOE)
    balanced, balanced_result = one_step(
        dataclasses.replace(MOE, moe_aux_loss_coef=1.0, moe_z_loss_coef=0.1)
    )
    torch.testing.assert_close(balanced_result.loss, plain_result.loss)
    router = "layers.0.mlp.router.weight"
    before = dict(Transformer(MOE).named_parameters())[router]
    moved = dict(balanced.master.named_parameters())[router]
    assert not torch.allclose(moved, dict(plain.master.named_parameters())[router])
    assert before.shape == moved.shape


def test_the_balance_bias_moves_after_the_step_on_the_compute_copy_and_its_master():
    config = dataclasses.replace(MOE, moe_bias_update_rate=0.01)
    composed, _ = one_step(config, "bf16", cast_module=True)
    assert composed.copy is not None  # bf16 compute copy, fp32 master
    for copy_layer, master_layer in zip(
        moe_layers(composed.compute), moe_layers(composed.master), strict=True
    ):
        assert copy_layer.expert_bias.abs().max() > 0  # imbalanced routing moved it
        torch.testing.assert_close(master_layer.expert_bias, copy_layer.expert_bias.float())
        assert int(copy_layer.pending_counts.sum()) == 0  # consumed by the update


def test_routing_metrics_are_logged(prepared, tmp_path):
    model = ModelConfig(
        vocab_size=320, d_model=32, n_layers=2, n_heads=4, max_seq_len=32, n_experts=4,
        experts_per_token=2, moe_aux_loss_coef=0.01, moe_bias_update_rate=0.001,
    )  # fmt: skip
    cfg = TrainConfig(
        batch_size=4,
        seq_len=32,
        max_steps=4,
        log_every=2,
        device="cpu",
        eval=EvalConfig(every=0, batches=1),
    )
    train(model, cfg, prepared.shard_dir, tmp_path)
    logs = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "loss" in r]
    last = logs[-1]
    assert len(last["moe/counts"]) == 4
    assert sum(last["moe/counts"]) == 2 * 2 * 4 * 32  # layers · top-k · tokens of a micro-batch
    assert last["moe/aux_loss"] > 0 and last["moe/dropped"] == 0.0
    assert 0 < last["moe/bias_drift"] <= 0.001 * 4 + 1e-9
