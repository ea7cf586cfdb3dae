"""A time-budgeted WSD run follows the machine: slowed down on its plateau, it still ends with a
full cooldown inside its budget, and a resumed run repeats the saved decision exactly."""

import itertools

import pytest
import torch

import lmforge.train.loop as loop
from lmforge.model import ModelConfig
from lmforge.train import TrainConfig, train
from lmforge.train.metrics import read_metrics

MODEL = ModelConfig(vocab_size=320, d_model=32, n_layers=2, n_heads=2, max_seq_len=32)


class SlowingClock:
    """Every reading advances `tick`; from the `slow_from`-th reading on, `factor` times more:
    the machine got busy partway through the run."""

    def __init__(self, tick: float, slow_from: int, factor: float):
        self.now, self.calls = 0.0, 0
        self.tick, self.slow_from, self.factor = tick, slow_from, factor

    def perf_counter(self) -> float:
        self.calls += 1
        self.now += self.tick * (self.factor if self.calls > self.slow_from else 1)
        return self.now


def _cfg(**kw):
    return TrainConfig(batch_size=2, seq_len=16, lr=1e-3, min_lr_ratio=0.0, eval_every=0,
                       eval_batches=1, log_every=1, device="cpu", **kw)  # fmt: skip


def test_a_run_slowed_on_its_plateau_still_decays_fully_within_its_budget(
    prepared, tmp_path, monkeypatch
):
    clock = SlowingClock(tick=0.05, slow_from=100, factor=3.0)
    monkeypatch.setattr(loop, "time", clock)
    result = train(MODEL, _cfg(minutes=0.25), prepared.shard_dir, tmp_path, threads=1)
    logs = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "lr" in r]
    lrs = [r["lr"] for r in logs]
    state = torch.load(result.checkpoint / "trainer_state.pt", weights_only=True)
    assert result.step == state["total_steps"] == logs[-1]["step"]  # not cut by the clock
    assert 0 < lrs[-1] < 0.2e-3  # cooled down to the last step
    assert max(lrs) == pytest.approx(1e-3)
    assert result.seconds <= 0.25 * 60 * 1.15
    peak_steps = sum(lr == pytest.approx(1e-3) for lr in lrs)
    decay = lrs[_decay_start(lrs) :]
    assert len(decay) >= 0.15 * len(lrs)  # a real cooldown, not a cut plateau
    assert all(b < a for a, b in itertools.pairwise(decay))
    assert peak_steps > 0.35 * len(lrs)
    assert state["minutes"] == 0.25


def _decay_start(lrs: list[float]) -> int:
    return max(i for i, lr in enumerate(lrs) if lr == pytest.approx(1e-3)) + 1


def test_a_resumed_budgeted_run_repeats_the_schedule_it_saved(prepared, tmp_path, monkeypatch):
    monkeypatch.setattr(loop, "time", SlowingClock(tick=0.05, slow_from=10**9, factor=1.0))
    first = train(MODEL, _cfg(minutes=0.1, checkpoint_every=10), prepared.shard_dir,
                  tmp_path / "a", threads=1)  # fmt: skip
    saved = torch.load(first.checkpoint / "trainer_state.pt", weights_only=True)
    assert saved["plans"] and saved["total_steps"] == first.step
    lrs = {r["step"]: r["lr"] for r in read_metrics(tmp_path / "a" / "metrics.jsonl") if "lr" in r}
    from lmforge.train.schedule import Schedule

    schedule = Schedule(1e-3, 0.0, 50, "wsd", 0.05, 0.2, [tuple(p) for p in saved["plans"]])
    assert all(schedule.lr(step - 1) == pytest.approx(lr) for step, lr in lrs.items())
