"""Activation checkpointing: the same gradients for fewer saved bytes, measured."""

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

from lmforge.config import preset
from lmforge.errors import LmforgeError
from lmforge.model import Transformer
from lmforge.train import train
from lmforge.train.memory import apply_activation_checkpointing, saved_activation_bytes


def _model_and_loss(mode):
    cfg = preset("tiny").model
    torch.manual_seed(0)
    model = Transformer(cfg)
    apply_activation_checkpointing(model, mode)
    ids = torch.randint(0, cfg.vocab_size, (8, cfg.max_seq_len), generator=torch.Generator())

    def loss():
        logits = model(ids[:, :-1])
        return F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())

    return model, loss


def test_checkpointing_halves_saved_activations_on_the_tiny_preset():
    saved = {}
    grads = {}
    for mode in ("none", "full", "selective"):
        model, loss = _model_and_loss(mode)
        saved[mode] = saved_activation_bytes(model, loss)
        loss().backward()
        grads[mode] = [p.grad for p in model.parameters()]
    assert saved["none"] >= 2 * saved["full"]
    assert saved["full"] < saved["selective"] < saved["none"]
    for mode in ("full", "selective"):  # recomputation gives the same gradients
        for a, b in zip(grads["none"], grads[mode], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_checkpointed_training_matches_and_reports_less_memory(prepared, tmp_path):
    cfg = preset("tiny")
    runs = {}
    for mode in ("none", "full"):
        tcfg = dataclasses.replace(
            cfg.train,
            max_steps=10,
            log_every=5,
            device="cpu",
            eval=dataclasses.replace(cfg.train.eval, every=0),
            compute=dataclasses.replace(cfg.train.compute, activation_checkpointing=mode),
        )
        train(cfg.model, tcfg, prepared.shard_dir, tmp_path / mode)
        lines = (tmp_path / mode / "metrics.jsonl").read_text().splitlines()
        runs[mode] = [r for r in map(json.loads, lines) if "loss" in r]
    assert [r["loss"] for r in runs["none"]] == [r["loss"] for r in runs["full"]]
    assert runs["full"][-1]["peak_memory_mb"] < runs["none"][-1]["peak_memory_mb"]


def test_unknown_checkpointing_mode_is_a_clear_error():
    with pytest.raises(LmforgeError, match="unknown activation checkpointing mode 'some'"):
        apply_activation_checkpointing(Transformer(preset("tiny").model), "some")


def test_zero1_counts_the_state_of_its_shard(tmp_path):
    """ZeroRedundancyOptimizer leaves its own `state` empty; the shard's moments are counted."""
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from lmforge.train.memory import optimizer_state_bytes

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = torch.nn.Linear(8, 4)
        zero = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW)
        model(torch.randn(2, 8)).sum().backward()
        zero.step()
        moments = 2 * 4 * sum(p.numel() for p in model.parameters())
        assert moments <= optimizer_state_bytes(zero) <= moments + 64
    finally:
        dist.destroy_process_group()
