"""Runs that survive: non-finite steps skipped, divergence stopped, SIGTERM and SIGKILL resumed,
a full disk during a checkpoint."""

import errno
import json
import os
import signal
import sys

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

import lmforge.train.compose as compose_module
from lmforge.cli import main
from lmforge.errors import LmforgeError
from lmforge.model import ModelConfig
from lmforge.train import list_checkpoints, train
from lmforge.train.checkpoint import load_checkpoint
from lmforge.train.config import train_config
from lmforge.train.metrics import read_metrics
from tests.full_disk import fill_disk
from tests.kills import (
    assert_checkpoints_whole,
    kill_training_run,
    newest_checkpoint,
    timed_run,
)

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
        "train.checkpoint.every=10",
        "--set",
        "train.eval.every=50",
        "--set",
        "train.loader.kind=sequential",
    ]


def test_killed_at_random_moments_then_resumed_matches_an_uninterrupted_run(prepared, tmp_path):
    """SIGKILL (no chance to save) at random moments (tests/kills.py), each after a new
    checkpoint: the same command resumes each time, never finds a half-written file, and ends
    with the metrics and weights of an uninterrupted run."""
    killed, straight = tmp_path / "killed", tmp_path / "straight"
    spread = timed_run(  # a checkpoint interval's seconds
        _lmforge(prepared.shard_dir, straight), straight, lambda: newest_checkpoint(straight)
    )
    log = kill_training_run(_lmforge(prepared.shard_dir, killed), killed, spread, "pretraining")
    assert "resuming from" in log.attempts[-1].stdout

    def trajectory(run):
        return [
            (r["step"], r.get("loss"), r.get("grad_norm"), r.get("val_loss"))
            for r in read_metrics(run / "metrics.jsonl")
        ]

    assert len(trajectory(straight)) == 100 // 10 + 2  # log lines, evaluations at 50 and 100
    weights = [load_file(run / "checkpoints" / "step_100" / "model.safetensors") for run in
               (straight, killed)]  # fmt: skip
    identical = trajectory(killed) == trajectory(straight) and all(
        torch.equal(w, weights[1][name]) for name, w in weights[0].items()
    )
    log.summary("pretraining", identical)
    assert log.kills >= 1 and identical


def _fill_disk_at(monkeypatch, victim: str, call: int) -> None:
    """The `call`-th write of a checkpoint's `victim` file finds the disk full part way: raised
    as each writer raises it on a real full disk (safetensors' message; torch.save into a file
    object, a RuntimeError in the middle of the OSError)."""
    import lmforge.train.checkpoint as checkpoint_module

    calls = {"n": 0}

    def disk_full(f) -> None:
        f.write(b"\0" * 100)  # a part written, then no more room
        if victim == "model.safetensors":
            message = "Error while serializing: I/O error: No space left on device (os error 28)"
            raise SafetensorError(message)
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] unexpected pos") from None

    def full_now() -> bool:
        calls["n"] += 1
        return calls["n"] == call

    if victim == "model.safetensors":
        real_save_module = checkpoint_module.save_module

        def save_module(model, path):
            if not full_now():
                return real_save_module(model, path)
            with open(path, "wb") as f:
                disk_full(f)

        monkeypatch.setattr(checkpoint_module, "save_module", save_module)
        return
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if getattr(f, "name", "").endswith(victim) and full_now():
            disk_full(f)
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)


@pytest.mark.parametrize("victim", ["model.safetensors", "optimizer.pt"])
def test_a_full_disk_during_a_checkpoint_is_one_line_and_the_run_resumes_from_the_last(
    prepared, tmp_path, monkeypatch, capsys, victim
):
    """The second checkpoint (step 8) finds the disk full: the command exits 2 with one line
    naming the problem, the path and the fix; step 4 stays whole and nothing is left of step 8.
    With space back, the same command resumes from step 4 and finishes."""
    out = tmp_path / "run"
    args = [
        "train", "--preset", "tiny", "--data", str(prepared.shard_dir), "--out", str(out),
        "--device", "cpu", "--max-steps", "12", "--set", "train.checkpoint.every=4",
        "--set", "train.eval.every=0", "--set", "train.loader.kind=sequential",
    ]  # fmt: skip
    checkpoints = out / "checkpoints"
    with monkeypatch.context() as m:
        _fill_disk_at(m, victim, call=2)
        assert main(args) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: no space left on the device writing checkpoint {checkpoints / 'step_8'} "
        "(disk full): free space on that disk (or move the run folder to a larger one), then "
        f"run the same command again: it resumes from {checkpoints / 'step_4'}, which is "
        "intact\n"
    )
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_4"]  # no .step_8.tmp
    assert_checkpoints_whole(out)
    load_checkpoint(checkpoints / "step_4")
    assert main(args) == 0
    assert f"resuming from {checkpoints / 'step_4'} (step 4)" in capsys.readouterr().out
    assert [p.name for p in list_checkpoints(checkpoints)] == ["step_8", "step_12"]


def test_a_full_disk_while_logging_metrics_is_one_line(tmp_path, monkeypatch):
    import lmforge.train.metrics as metrics_module
    from lmforge.train.metrics import MetricsLog

    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write(step=1, loss=2.0)
    fill_disk(monkeypatch, metrics_module, lambda path: path.name == "metrics.jsonl", room=5)
    with pytest.raises(LmforgeError, match=r"^no space left on the device writing the metrics"):
        log.write(step=2, loss=1.5)
    assert read_metrics(tmp_path / "metrics.jsonl") == [
        {"step": 1, "loss": 2.0}
    ]  # cut line dropped
