"""A run stopped by Ctrl-C or SIGTERM checkpoints, says how to resume and exits 130 or 143,
so `lmforge train && lmforge export` stops there."""

import os
import signal

import pytest

import lmforge.stages as stages_module
import lmforge.train.compose as compose_module
from lmforge.cli import main
from lmforge.train import list_checkpoints
from lmforge.train.signals import exit_status


def _signal_during_forward(monkeypatch, signum, call):
    """Send `signum` to this process during the `call`-th forward, as a user or a scheduler
    would mid-step: the handler of lmforge/train/signals.py only sets the stop request."""
    real_loss, calls = compose_module.Composed.loss, {"n": 0}

    def loss(self, x, y):
        calls["n"] += 1
        if calls["n"] == call:
            os.kill(os.getpid(), signum)
        return real_loss(self, x, y)

    monkeypatch.setattr(compose_module.Composed, "loss", loss)


def _tiny(command, out, *extra):
    return [command, "--preset", "tiny", "--out", str(out), "--threads", "1",
            "--set", "train.device=cpu", "--set", "train.max_steps=20", *extra]  # fmt: skip


def test_exit_status_is_128_plus_the_signal():
    assert exit_status("SIGINT") == 130 and exit_status("SIGTERM") == 143
    assert exit_status(None) == 130  # a KeyboardInterrupt without a signal: Ctrl-C
    assert exit_status("another rank's stop request") == 130


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_train_stopped_by_a_signal_exits_128_plus_it(
    signum, code, prepared, tmp_path, monkeypatch, capsys
):
    _signal_during_forward(monkeypatch, signum, call=3)
    assert main(_tiny("train", tmp_path, "--data", str(prepared.shard_dir))) == code
    checkpoint = tmp_path / "checkpoints" / "step_3"
    assert list_checkpoints(tmp_path / "checkpoints") == [checkpoint]
    err = capsys.readouterr().err
    assert f"stopped ({signal.Signals(signum).name} received) at step 3" in err
    assert f"checkpoint {checkpoint}" in err and "run the same command again to resume" in err
    assert "done:" not in capsys.readouterr().out


def test_speedrun_stopped_by_sigterm_exits_143_before_evaluating(
    prepared, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(stages_module, "prepare_corpus", lambda *args: prepared)
    _signal_during_forward(monkeypatch, signal.SIGTERM, call=2)
    assert main(_tiny("speedrun", tmp_path)) == 143
    assert list_checkpoints(tmp_path / "checkpoints") == [tmp_path / "checkpoints" / "step_2"]
    assert not (tmp_path / "report.md").exists()
    assert "stopped (SIGTERM received) at step 2" in capsys.readouterr().err
