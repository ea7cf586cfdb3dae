"""train.compute.fused_loss: the head fused into the cross-entropy gives the plain path's loss and
gradients, with and without packed documents, and trains from the CLI."""

import math

import pytest
import torch

from lmforge.cli import main
from lmforge.model import ModelConfig, Transformer
from lmforge.train.compose import Objective, compose
from lmforge.train.metrics import read_metrics
from lmforge.train.precision import make_precision

MODEL = ModelConfig(vocab_size=96, d_model=32, n_layers=2, n_heads=4, max_seq_len=32)


@pytest.mark.parametrize("packed", [False, True])
def test_fused_loss_equals_the_plain_loss_and_gradients(packed):
    torch.manual_seed(0)
    x = torch.randint(0, 96, (3, 20))
    y = torch.randint(0, 96, (3, 20))
    y[0, :4] = -100  # ignored targets carry no loss
    segments = torch.tensor([[0] * 7 + [1] * 13] * 3) if packed else None
    losses, grads = [], []
    for fused in (False, True):
        torch.manual_seed(1)
        model = Transformer(MODEL)
        cpu = torch.device("cpu")
        composed = compose(model, make_precision("fp32", cpu), cpu, objective=Objective(fused))
        loss = composed.loss(x, y, segments)
        loss.backward()
        losses.append(loss.detach())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=1e-6)
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, rtol=1e-5, atol=1e-6, msg=name)


def test_training_with_the_fused_loss_from_the_cli(prepared, tmp_path):
    args = ["train", "--preset", "tiny", "--data", str(prepared.shard_dir), "--out",
            str(tmp_path), "--device", "cpu", "--threads", "1", "--max-steps", "4",
            "--set", "train.eval.every=0", "--set", "train.log_every=2",
            "--set", "train.batch_size=4", "--set", "train.eval.batches=1",
            "--set", "train.compute.fused_loss=true"]  # fmt: skip
    assert main(args) == 0
    logs = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in logs] == [2, 4]
    assert all(math.isfinite(r["loss"]) for r in logs)
    assert "fused_loss = true" in (tmp_path / "config.toml").read_text()
