"""The model runner's compiled CPU decode step runs at the thread count its timed first steps
chose for that many rows (up to the decode kernels' MAX_ROWS; more keep every thread), and
leaves the caller's count as it was."""

import time
from types import SimpleNamespace

import torch

from lmforge.infer.runner import MAX_ROWS, TRIAL_STEPS, ModelRunner
from lmforge.threads import using_threads


def test_each_row_count_times_its_first_steps_and_keeps_the_faster_thread_count():
    seen: list[int] = []

    def step(ids: torch.Tensor) -> torch.Tensor:  # slower on two threads, as on a small model
        seen.append(torch.get_num_threads())
        time.sleep(0.01 if seen[-1] == 2 else 0.001)
        return ids

    runner = SimpleNamespace(
        compiled=True, device=torch.device("cpu"), thread_trials={}, _step=step
    )
    ids = torch.zeros(1, 1)
    with using_threads(2):
        for _ in range(1 + 2 * TRIAL_STEPS + 3):
            ModelRunner._timed_step(runner, ids, 1)
            assert torch.get_num_threads() == 2  # the caller's count, between steps
        ModelRunner._timed_step(runner, ids, 2)  # another row count: a trial of its own
        for _ in range(2 * TRIAL_STEPS):  # matrix products, not the kernels': no trial
            ModelRunner._timed_step(runner, ids, 2 * MAX_ROWS)
    assert seen[: 1 + TRIAL_STEPS] == [2] * (1 + TRIAL_STEPS)  # the first step compiles
    assert seen[1 + TRIAL_STEPS : 1 + 2 * TRIAL_STEPS + 3] == [1] * (TRIAL_STEPS + 3)
    assert seen[-2 * TRIAL_STEPS - 1 :] == [2] * (2 * TRIAL_STEPS + 1)
    assert runner.thread_trials[1].chosen == 1
    assert set(runner.thread_trials) == {1, 2} and runner.thread_trials[2].chosen is None
