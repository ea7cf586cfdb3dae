import json

import pytest
import torch
from safetensors.torch import load_file

import lmforge.train.step as step_module
from lmforge.budget_clock import BudgetClock
from lmforge.errors import LmforgeError
from lmforge.model import ModelConfig, Transformer
from lmforge.train import list_checkpoints, load_model_weights, train
from lmforge.train.budget import CALIBRATION_STEPS
from lmforge.train.config import train_config

MODEL = ModelConfig(vocab_size=320, d_model=32, n_layers=2, n_heads=2, max_seq_len=32)


def _cfg(**kw):
    base = dict(
        batch_size=4,
        seq_len=32,
        lr=1e-2,
        warmup_steps=3,
        max_steps=12,
        eval_every=6,
        eval_batches=2,
        log_every=2,
        seed=3,
        device="cpu",
    )
    return train_config({**base, **kw})


def _metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _interrupt_at_step(monkeypatch, n):
    """Make the n-th gradient clip raise KeyboardInterrupt, as Ctrl-C during step n would."""
    real_clip, calls = step_module.clip_grad_norm, {"n": 0}

    def clip(params, max_norm):
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt
        return real_clip(params, max_norm)

    monkeypatch.setattr(step_module, "clip_grad_norm", clip)


def test_training_lowers_loss_and_writes_metrics_and_checkpoint(prepared, tmp_path):
    result = train(MODEL, _cfg(max_steps=40, eval_every=20), prepared.shard_dir, tmp_path)
    records = _metrics(tmp_path)
    logs = [r for r in records if "loss" in r]
    evals = [r for r in records if "val_loss" in r]
    assert {"step", "loss", "lr", "tokens_per_s", "step_time_s"} <= set(logs[0])
    assert {"step", "val_loss", "val_bpb"} <= set(evals[0])
    assert [r["step"] for r in logs] == list(range(2, 41, 2))
    assert logs[-1]["loss"] < logs[0]["loss"] - 0.5
    assert evals[-1]["val_loss"] < evals[0]["val_loss"]
    assert result.step == 40 and result.checkpoint.name == "step_40"
    assert result.final_eval.bpb > 0 and result.tokens_per_s > 0
    files = {p.name for p in result.checkpoint.iterdir()}
    assert {"model.safetensors", "config.json", "optimizer.pt", "trainer_state.pt"} <= files
    assert {"loader_state.json", "tokenizer"} <= files


def test_resume_is_exact(prepared, tmp_path, monkeypatch):
    straight, split = tmp_path / "straight", tmp_path / "split"
    train(MODEL, _cfg(), prepared.shard_dir, straight)
    with monkeypatch.context() as m:
        _interrupt_at_step(m, 7)
        assert train(MODEL, _cfg(), prepared.shard_dir, split).step == 6
    train(MODEL, _cfg(), prepared.shard_dir, split)  # resumes from step_6
    a = load_file(straight / "checkpoints" / "step_12" / "model.safetensors")
    b = load_file(split / "checkpoints" / "step_12" / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key

    def losses(run):
        return [r["loss"] for r in _metrics(run) if "loss" in r]

    assert losses(straight) == losses(split)


def test_time_budget_fixes_a_step_count(prepared, tmp_path, monkeypatch):
    class FakeClock:  # every reading advances 10 ms: the run is independent of machine speed
        now = 0.0

        def perf_counter(self):
            self.now += 0.01
            return self.now

    clock = BudgetClock(FakeClock().perf_counter)
    result = train(
        MODEL, _cfg(max_steps=0, minutes=0.05), prepared.shard_dir, tmp_path, clock=clock
    )
    state = torch.load(result.checkpoint / "trainer_state.pt", weights_only=True)
    assert state["total_steps"] is not None
    assert CALIBRATION_STEPS + 1 < result.step <= state["total_steps"]
    assert state["seconds"] == pytest.approx(3.0, abs=0.5)


def test_ctrl_c_saves_a_checkpoint_and_keeps_earlier_ones(prepared, tmp_path, monkeypatch):
    _interrupt_at_step(monkeypatch, 8)
    result = train(MODEL, _cfg(checkpoint_every=4), prepared.shard_dir, tmp_path)
    assert result.interrupted and result.step == 7
    names = [p.name for p in list_checkpoints(tmp_path / "checkpoints")]
    assert names == ["step_4", "step_7"]
    assert not list((tmp_path / "checkpoints").glob(".*tmp"))


def test_interrupted_save_leaves_the_last_complete_checkpoint(prepared, tmp_path, monkeypatch):
    import lmforge.train.checkpoint as ckpt

    train(MODEL, _cfg(max_steps=4), prepared.shard_dir, tmp_path)

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt, "save_module", crash)
    with pytest.raises(KeyboardInterrupt):
        train(MODEL, _cfg(max_steps=8), prepared.shard_dir, tmp_path)
    assert [p.name for p in list_checkpoints(tmp_path / "checkpoints")] == ["step_4"]
    load_model_weights(Transformer(MODEL), tmp_path / "checkpoints" / "step_4")


def test_checkpoint_of_another_shape_is_refused(prepared, tmp_path):
    result = train(MODEL, _cfg(max_steps=2), prepared.shard_dir, tmp_path)
    wider = ModelConfig(vocab_size=320, d_model=64, n_layers=2, n_heads=2, max_seq_len=32)
    with pytest.raises(LmforgeError, match="another model shape.*d_model: saved 32 vs now 64"):
        load_model_weights(Transformer(wider), result.checkpoint)
    with pytest.raises(LmforgeError, match="another model shape"):
        train(wider, _cfg(max_steps=4), prepared.shard_dir, tmp_path)


def test_bad_train_settings_are_clear_errors(prepared, tmp_path):
    with pytest.raises(LmforgeError, match="max_steps and train.minutes are both 0"):
        train(MODEL, _cfg(max_steps=0), prepared.shard_dir, tmp_path)
    with pytest.raises(LmforgeError, match="exceeds model.max_seq_len"):
        train(MODEL, _cfg(seq_len=64), prepared.shard_dir, tmp_path)
