"""A finished run continues when given more steps (or a longer budget), on a new schedule tail."""

import pytest
import torch

import lmforge.train.step as step_module
from lmforge.budget_clock import BudgetClock
from lmforge.cli import main
from lmforge.model import ModelConfig
from lmforge.train import TrainConfig, list_checkpoints, train
from lmforge.train.config import EvalConfig, ScheduleConfig
from lmforge.train.loop import _resumed_total
from lmforge.train.metrics import read_metrics

MODEL = ModelConfig(vocab_size=320, d_model=32, n_layers=2, n_heads=2, max_seq_len=32)


def _logs(run):
    return [r for r in read_metrics(run / "metrics.jsonl") if "loss" in r]


def test_train_with_more_steps_continues_a_finished_run(prepared, tmp_path, capsys):
    args = ["train", "--preset", "tiny", "--data", str(prepared.shard_dir), "--out",
            str(tmp_path), "--device", "cpu", "--threads", "1", "--set", "train.eval.every=0",
            "--set", "train.log_every=4", "--set", "train.schedule.warmup_steps=4",
            "--set", "train.batch_size=4", "--set", "train.eval.batches=1"]  # fmt: skip
    assert main([*args, "--max-steps", "8"]) == 0
    assert main([*args, "--max-steps", "16"]) == 0
    out = capsys.readouterr().out
    assert f"resuming from {tmp_path / 'checkpoints' / 'step_8'} (step 8)" in out
    assert "training to step 16 from step 8: the learning rate re-warms over 1 step to" in out
    assert [p.name for p in list_checkpoints(tmp_path / "checkpoints")] == ["step_8", "step_16"]
    logs = _logs(tmp_path)
    assert [r["step"] for r in logs] == [4, 8, 12, 16]
    lr = 3e-3  # the tiny preset's; WSD decays to a tenth of it
    assert logs[1]["lr"] < lr / 2  # the first run's end: decaying to the floor
    assert logs[2]["lr"] == pytest.approx(lr)  # a 16-step run's plateau
    assert logs[2]["lr"] > logs[1]["lr"]  # re-warmed after the first run decayed
    assert "max_steps = 16" in (tmp_path / "config.toml").read_text()


def test_an_interrupted_extension_resumes_on_the_same_tail(prepared, tmp_path, monkeypatch):
    def cfg(steps):
        return TrainConfig(
            batch_size=4,
            seq_len=32,
            max_steps=steps,
            log_every=1,
            device="cpu",
            schedule=ScheduleConfig(warmup_steps=3),
            eval=EvalConfig(every=0, batches=2),
        )

    straight, split = tmp_path / "straight", tmp_path / "split"
    for run in (straight, split):
        train(MODEL, cfg(6), prepared.shard_dir, run, threads=1)
    train(MODEL, cfg(16), prepared.shard_dir, straight, threads=1)
    with monkeypatch.context() as m:
        real_clip, calls = step_module.clip_grad_norm, {"n": 0}

        def clip(params, max_norm):
            calls["n"] += 1
            if calls["n"] == 4:
                raise KeyboardInterrupt
            return real_clip(params, max_norm)

        m.setattr(step_module, "clip_grad_norm", clip)
        assert train(MODEL, cfg(16), prepared.shard_dir, split, threads=1).step == 9
    train(MODEL, cfg(16), prepared.shard_dir, split, threads=1)
    assert [r["lr"] for r in _logs(split)] == [r["lr"] for r in _logs(straight)]
    assert [r["loss"] for r in _logs(split)] == [r["loss"] for r in _logs(straight)]


def test_a_longer_budget_times_the_first_steps_again_and_adds_a_tail(
    prepared, tmp_path, monkeypatch
):
    def cfg(**kw):
        return TrainConfig(
            batch_size=4, seq_len=32, log_every=1, device="cpu", **kw,
            schedule=ScheduleConfig(warmup_steps=3), eval=EvalConfig(every=0, batches=1),
        )  # fmt: skip

    train(MODEL, cfg(max_steps=8), prepared.shard_dir, tmp_path, threads=1)

    class FakeClock:  # every reading advances 10 ms: the run is independent of machine speed
        now = 0.0

        def perf_counter(self):
            self.now += 0.01
            return self.now

    clock = BudgetClock(FakeClock().perf_counter)
    result = train(MODEL, cfg(minutes=0.05), prepared.shard_dir, tmp_path, threads=1, clock=clock)
    state = torch.load(result.checkpoint / "trainer_state.pt", weights_only=True)
    first, (start, total), *refits = state["plans"]  # refits: shortened to the time left
    assert first == [0, 8] and 8 < start < result.step <= total
    assert all(start < s < t <= total for s, t in refits) and result.step == state["total_steps"]
    lrs = [r["lr"] for r in _logs(tmp_path)]  # lrs[i]: step i's
    assert lrs[start - 1] == pytest.approx(3e-4)  # the timed steps stay at the floor ...
    assert lrs[start] > lrs[start - 1]  # ... and the new plan re-warms from there


def test_the_saved_count_unless_the_length_changed():
    state = {"step": 100, "seconds": 60.0, "total_steps": 100, "minutes": 1.0}
    assert _resumed_total(TrainConfig(minutes=1.0), state) == 100
    assert _resumed_total(TrainConfig(minutes=2.0), state) is None  # timed again
    assert _resumed_total(TrainConfig(minutes=1.0, max_steps=300), state) == 300
