"""A time-budgeted WSD run follows the machine: slowed down on its plateau, it still ends with a
full cooldown inside its budget, and a resumed run repeats the saved decision exactly."""

import itertools

import pytest
import torch

from lmforge.budget_clock import BudgetClock
from lmforge.model import ModelConfig
from lmforge.train import TrainConfig, train
from lmforge.train.budget import steps_in_budget
from lmforge.train.config import CheckpointConfig, EvalConfig, OptimizerConfig, ScheduleConfig
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


def _steady_clock() -> BudgetClock:
    return BudgetClock(SlowingClock(tick=0.05, slow_from=10**9, factor=1.0).perf_counter)


def _cfg(checkpoint_every=0, **kw):
    return TrainConfig(
        batch_size=2, seq_len=16, log_every=1, device="cpu", **kw,
        optimizer=OptimizerConfig(lr=1e-3), schedule=ScheduleConfig(min_lr_ratio=0.0),
        eval=EvalConfig(every=0, batches=1), checkpoint=CheckpointConfig(every=checkpoint_every),
    )  # fmt: skip


def test_a_run_slowed_on_its_plateau_still_decays_fully_within_its_budget(
    prepared, tmp_path, monkeypatch
):
    clock = BudgetClock(SlowingClock(tick=0.05, slow_from=100, factor=3.0).perf_counter)
    result = train(MODEL, _cfg(minutes=0.25), prepared.shard_dir, tmp_path, threads=1, clock=clock)
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
    first = train(MODEL, _cfg(minutes=0.1, checkpoint_every=10), prepared.shard_dir,
                  tmp_path / "a", threads=1, clock=_steady_clock())  # fmt: skip
    saved = torch.load(first.checkpoint / "trainer_state.pt", weights_only=True)
    assert saved["plans"] and saved["total_steps"] == first.step
    lrs = {r["step"]: r["lr"] for r in read_metrics(tmp_path / "a" / "metrics.jsonl") if "lr" in r}
    from lmforge.train.schedule import Schedule

    schedule = Schedule(1e-3, 0.0, 50, "wsd", 0.05, 0.2, [tuple(p) for p in saved["plans"]])
    assert all(schedule.lr(step - 1) == pytest.approx(lr) for step, lr in lrs.items())


def test_the_budget_counts_from_when_it_started(prepared, tmp_path):
    """The budget clock starts with the command: what ran before the loop (`lmforge train`'s
    start-up and the sizing) has spent its share, so the loop trains for what is left."""
    whole = train(MODEL, _cfg(minutes=0.1), prepared.shard_dir, tmp_path / "a", threads=1,
                  clock=_steady_clock())  # fmt: skip
    started_earlier = SlowingClock(tick=0.05, slow_from=10**9, factor=1.0)
    clock = BudgetClock(started_earlier.perf_counter)
    started_earlier.now += 3.0  # 3 s of start-up before training
    half = train(MODEL, _cfg(minutes=0.1), prepared.shard_dir, tmp_path / "b", threads=1,
                 clock=clock)  # fmt: skip
    assert 0.35 * whole.step < half.step < 0.65 * whole.step  # 3 of the 6 s were spent before
    assert 3.0 < half.seconds <= 6.0 * 1.15


def test_the_step_count_leaves_time_for_the_closing_validation():
    closing = TrainConfig(eval=EvalConfig(every=0, batches=4))
    assert steps_in_budget(closing, per_step=1.0, remaining_s=100, step=0, eval_s=10.0) == 90
    assert steps_in_budget(closing, per_step=1.0, remaining_s=5, step=7, eval_s=10.0) == 8
    periodic = TrainConfig(
        eval=EvalConfig(every=10, batches=4)
    )  # 1 s each, one per 10 steps and 1 more
    assert steps_in_budget(periodic, per_step=1.0, remaining_s=100.5, step=0, eval_s=1.0) == 90
    estimated = TrainConfig(eval=EvalConfig(every=0, batches=30))  # a forward ≈ 1/3 step per batch
    assert steps_in_budget(estimated, per_step=1.0, remaining_s=100, step=5) == 5 + 90
