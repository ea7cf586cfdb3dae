"""Long stages show a bar: the validation after training (the speedrun's final evaluation,
samples and report bars are checked on its rerun in tests/test_cli.py)."""

import torch

from lmforge.model import ModelConfig
from lmforge.progress import bar_per_call
from lmforge.train import TrainConfig, train
from lmforge.train.config import EvalConfig

MODEL = ModelConfig(vocab_size=320, d_model=32, n_layers=2, n_heads=2, max_seq_len=32)


def test_the_validation_after_training_shows_a_bar_of_its_batches(
    prepared, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("LMFORGE_PROGRESS", "1")
    cfg = TrainConfig(
        batch_size=4,
        seq_len=32,
        max_steps=2,
        log_every=1,
        device="cpu",
        eval=EvalConfig(every=0, batches=3),
    )
    train(MODEL, cfg, prepared.shard_dir, tmp_path, threads=1)
    err = capsys.readouterr().err
    assert "validation: 100%" in err and "3/3" in err


def test_a_bar_per_call_counts_forwards_and_leaves_their_outputs(monkeypatch, capsys):
    monkeypatch.setenv("LMFORGE_PROGRESS", "1")
    layer, x = torch.nn.Linear(2, 2), torch.ones(1, 2)
    with bar_per_call(layer, total=3, desc="calls", mininterval=0) as shown:
        outputs = [layer(x) for _ in range(3)]
    assert shown.n == 3 and all(torch.equal(out, layer(x)) for out in outputs)
    assert not layer._forward_hooks  # removed again
    assert "calls: 100%" in capsys.readouterr().err
