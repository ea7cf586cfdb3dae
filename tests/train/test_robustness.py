"""Runs that survive: non-finite steps skipped, divergence stopped, SIGTERM and SIGKILL resumed."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import lmforge.train.compose as compose_module
from lmforge.errors import LmforgeError
from lmforge.model import ModelConfig
from lmforge.train import list_checkpoints, train
from lmforge.train.config import train_config
from lmforge.train.metrics import read_metrics

MODEL = ModelConfig(vocab_size=320, d_model=32, n_layers=2, n_heads=2, max_seq_len=32)


def _cfg(**kw):
    base = dict(
        batch_size=4,
        seq_len=32,
        lr=1e-2,
        warmup_steps=3,
        max_steps=12,
        eval_every=0,
        eval_batches=2,
        log_every=2,
        seed=3,
        device="cpu",
    )
    return train_config({**base, **kw})


def _nan_loss_on(monkeypatch, bad_calls):
    """Make the loss of the listed forward calls (1-based) NaN, as an overflow would."""
    real_loss, calls = compose_module.Composed.loss, {"n": 0}

    def loss(self, x, y):
        calls["n"] += 1
        out = real_loss(self, x, y)
        return out * float("nan") if calls["n"] in bad_calls else out

    monkeypatch.setattr(compose_module.Composed, "loss", loss)


def test_a_non_finite_step_is_skipped_and_counted(prepared, tmp_path, monkeypatch):
    _nan_loss_on(monkeypatch, {3})
    result = train(MODEL, _cfg(), prepared.shard_dir, tmp_path)
    logs = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "loss" in r]
    assert [r["skipped_steps"] for r in logs] == [0, 1, 1, 1, 1, 1]
    assert result.skipped_steps == 1 and result.step == 12
    import safetensors.torch

    weights = safetensors.torch.load_file(result.checkpoint / "model.safetensors")
    assert all(torch.isfinite(w).all() for w in weights.values())
    assert logs[-1]["loss"] < logs[0]["loss"]


def test_consecutive_bad_steps_stop_the_run_naming_the_last_good_checkpoint(
    prepared, tmp_path, monkeypatch
):
    _nan_loss_on(monkeypatch, set(range(6, 100)))
    cfg = _cfg(checkpoint_every=4, max_bad_steps=3, max_steps=20)
    with pytest.raises(LmforgeError) as info:
        train(MODEL, cfg, prepared.shard_dir, tmp_path)
    message = str(info.value)
    assert "3 steps in a row had a non-finite loss" in message
    assert f"the last good checkpoint is {tmp_path / 'checkpoints' / 'step_4'}" in message
    assert "\n" not in message


def test_sigterm_checkpoints_and_returns_like_ctrl_c(prepared, tmp_path, monkeypatch):
    real_loss, calls = compose_module.Composed.loss, {"n": 0}

    def loss(self, x, y):
        calls["n"] += 1
        if calls["n"] == 5:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_loss(self, x, y)

    monkeypatch.setattr(compose_module.Composed, "loss", loss)
    before = signal.getsignal(signal.SIGTERM)
    result = train(MODEL, _cfg(), prepared.shard_dir, tmp_path)
    assert result.interrupted and result.step == 5  # the step in flight completes
    assert [p.name for p in list_checkpoints(tmp_path / "checkpoints")] == ["step_5"]
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is removed again


def test_sequential_loader_resumes_exactly(prepared, tmp_path, monkeypatch):
    straight, split = tmp_path / "straight", tmp_path / "split"
    cfg = _cfg(loader="sequential", checkpoint_every=4)
    train(MODEL, cfg, prepared.shard_dir, straight)
    with monkeypatch.context() as m:
        real_loss = compose_module.Composed.loss
        calls = {"n": 0}

        def interrupt(self, x, y):
            calls["n"] += 1
            if calls["n"] == 7:
                raise KeyboardInterrupt
            return real_loss(self, x, y)

        m.setattr(compose_module.Composed, "loss", interrupt)
        assert train(MODEL, cfg, prepared.shard_dir, split).step == 6
    state = json.loads((split / "checkpoints" / "step_6" / "loader_state.json").read_text())
    assert state["kind"] == "sequential" and state["batches"] == 6
    train(MODEL, cfg, prepared.shard_dir, split)

    def losses(run):  # the interrupted run also evaluated at step 6
        return [(r["step"], r["loss"]) for r in read_metrics(run / "metrics.jsonl") if "loss" in r]

    assert losses(straight) == losses(split)


def _lmforge(shard_dir, out):
    return [
        sys.executable,
        "-m",
        "lmforge",
        "train",
        "--preset",
        "tiny",
        "--data",
        str(shard_dir),
        "--out",
        str(out),
        "--device",
        "cpu",
        "--max-steps",
        "100",
        "--set",
        "train.checkpoint.every=20",
        "--set",
        "train.eval.every=50",
        "--set",
        "train.loader.kind=sequential",
    ]


def test_sigkill_mid_run_then_resume_matches_an_uninterrupted_run(prepared, tmp_path):
    env = {**os.environ, "LMFORGE_PROGRESS": "0", "OMP_NUM_THREADS": "1"}
    killed, straight = tmp_path / "killed", tmp_path / "straight"
    proc = subprocess.Popen(
        _lmforge(prepared.shard_dir, killed),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 240
    while not (killed / "checkpoints" / "step_20").exists():
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "no periodic checkpoint within 4 minutes"
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    assert not (killed / "checkpoints" / "step_100").exists()

    resumed = subprocess.run(_lmforge(prepared.shard_dir, killed), env=env, capture_output=True)
    assert resumed.returncode == 0, resumed.stderr.decode()
    assert b"resuming from" in resumed.stdout
    whole = subprocess.run(_lmforge(prepared.shard_dir, straight), env=env, capture_output=True)
    assert whole.returncode == 0, whole.stderr.decode()

    def trajectory(run):
        return [
            (r["step"], r.get("loss"), r.get("grad_norm"), r.get("val_loss"))
            for r in read_metrics(run / "metrics.jsonl")
        ]

    assert len(trajectory(straight)) == 100 // 10 + 2  # log lines, evaluations at 50 and 100
    assert trajectory(killed) == trajectory(straight)
