"""The CPU thread count: chosen from timed steps unless --threads or LMFORGE_THREADS gives it."""

import pytest
import torch

import lmforge.train.loop as loop
from lmforge.budget_clock import BudgetClock
from lmforge.cli import main
from lmforge.errors import LmforgeError
from lmforge.model import ModelConfig
from lmforge.threads import ThreadTrial, apply_env_threads, halvings, requested_threads
from lmforge.train import train
from lmforge.train.config import train_config
from lmforge.train.metrics import read_metrics

MODEL = ModelConfig(vocab_size=320, d_model=32, n_layers=2, n_heads=2, max_seq_len=32)


def _choose(start, ms_per_step):
    """Run a trial where a step at n threads takes ms_per_step[n]; the counts it tried."""
    trial, tried = ThreadTrial(start, steps=3), []
    while trial.chosen is None:
        tried.append(trial.threads)
        trial.record(ms_per_step[trial.threads] / 1000)
    return trial.chosen, sorted(set(tried), reverse=True)


def test_halving_candidates():
    assert halvings(8) == [8, 4, 2, 1]
    assert halvings(6) == [6, 3, 1]
    assert halvings(1) == [1]


@pytest.mark.parametrize(
    "ms_per_step,chosen,tried",
    [
        ({2: 800, 1: 1000}, 2, [2, 1]),  # all cores fastest: back to them
        ({2: 1000, 1: 600}, 1, [2, 1]),  # a loaded 2-core host: one thread wins
        ({8: 500, 4: 400, 2: 450, 1: 900}, 4, [8, 4, 2]),  # stops at the first slower halving
        ({8: 500, 4: 500, 2: 300, 1: 200}, 8, [8, 4]),  # a tie is not faster: keep more threads
    ],
)
def test_trial_keeps_the_fastest_count(ms_per_step, chosen, tried):
    start = max(ms_per_step)
    assert _choose(start, ms_per_step) == (chosen, tried)


def test_one_core_is_chosen_without_a_trial():
    trial = ThreadTrial(1)
    assert trial.chosen == 1
    assert trial.describe() == "1 (the only candidate, not timed)"


def test_trial_uses_the_median_of_its_steps():
    trial = ThreadTrial(2, steps=3)
    for seconds in (0.9, 0.1, 0.1):  # one slow outlier at 2 threads
        trial.record(seconds)
    for seconds in (0.2, 0.2, 0.2):
        trial.record(seconds)
    assert trial.chosen == 2
    assert trial.describe() == "2 (ms per step: 2 threads 100, 1 thread 200)"


def test_flag_then_environment_then_choice(monkeypatch):
    monkeypatch.delenv("LMFORGE_THREADS", raising=False)
    assert requested_threads(None) == (None, "")
    monkeypatch.setenv("LMFORGE_THREADS", "3")
    assert requested_threads(None) == (3, "LMFORGE_THREADS")
    assert requested_threads(2) == (2, "--threads")
    monkeypatch.setenv("LMFORGE_THREADS", "many")
    with pytest.raises(LmforgeError, match="LMFORGE_THREADS='many' is not a thread count"):
        requested_threads(None)
    with pytest.raises(LmforgeError, match="--threads 0"):
        requested_threads(0)


def test_environment_sets_torch_threads_for_every_command(monkeypatch):
    monkeypatch.setenv("LMFORGE_THREADS", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "")
    before = torch.get_num_threads()
    try:
        assert apply_env_threads() == 1
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_bad_environment_is_a_one_line_error(monkeypatch, capsys):
    monkeypatch.setenv("LMFORGE_THREADS", "0")
    assert main(["plan", "--model", "tiny"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: LMFORGE_THREADS='0'") and err.count("\n") == 1


def _cfg(**kw):
    base = dict(batch_size=4, seq_len=32, max_steps=12, warmup_steps=3, eval_every=0)
    return train_config({**base, "eval_batches": 2, "log_every": 2, "device": "cpu", **kw})


def _fake_step_times(monkeypatch, ms_per_step) -> BudgetClock:
    """A budget clock that reads as if a step took ms_per_step[current thread count]."""

    class Clock:
        now = 0.0

        def perf_counter(self):
            self.now += ms_per_step[torch.get_num_threads()] / 2000  # two readings per step
            return self.now

    monkeypatch.setattr(loop, "peak_flops", lambda device, dtype: 1e11)  # no matmul timing
    return BudgetClock(Clock().perf_counter)


def test_the_loop_trains_on_with_the_faster_count_and_logs_it(prepared, tmp_path, monkeypatch):
    monkeypatch.delenv("LMFORGE_THREADS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        clock = _fake_step_times(monkeypatch, {2: 900, 1: 300})
        result = train(MODEL, _cfg(), prepared.shard_dir, tmp_path, clock=clock)
        assert torch.get_num_threads() == 2  # the process's count is restored
    finally:
        torch.set_num_threads(before)
    assert result.threads == 1
    logs = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "loss" in r]
    # step 1 pays one-off costs, 2-4 are timed at 2 threads, 5-7 at 1, which is kept
    assert [r["threads"] for r in logs] == [2, 2, 1, 1, 1, 1]  # logged at steps 2, 4, ... 12


def test_flag_and_environment_override_the_choice(prepared, tmp_path, monkeypatch, capsys):
    clock = _fake_step_times(monkeypatch, {2: 300, 1: 900})  # a trial would keep 2 threads
    monkeypatch.setenv("LMFORGE_THREADS", "1")
    result = train(MODEL, _cfg(max_steps=8), prepared.shard_dir, tmp_path / "env", clock=clock)
    assert result.threads == 1
    assert "threads 1 (LMFORGE_THREADS)" in capsys.readouterr().out
    logs = read_metrics(tmp_path / "env" / "metrics.jsonl")
    assert {r["threads"] for r in logs if "loss" in r} == {1}
    result = train(
        MODEL, _cfg(max_steps=8), prepared.shard_dir, tmp_path / "flag", threads=1, clock=clock
    )
    assert result.threads == 1 and "threads 1 (--threads)" in capsys.readouterr().out
