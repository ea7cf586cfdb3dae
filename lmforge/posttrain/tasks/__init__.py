"""Offline verifiable tasks for post-training: problems to imitate (SFT) and rewards (RL).

Each task generates chat problems whose answers a program can check, small enough that a
tiny CPU model learns them in minutes: `arithmetic` (column-wise addition and subtraction)
and `countdown` (reach a target with + - *). `gsm8k_problems` reads GSM8K itself. A task is
`get_task(name)`, with `problems(n, split, seed)` and its default `reward`; train and test are
decided by a hash of each problem's key, so they never overlap.
"""

from __future__ import annotations

from collections.abc import Callable

from lmforge.errors import LmforgeError
from lmforge.posttrain.tasks.arithmetic import Arithmetic
from lmforge.posttrain.tasks.countdown import Countdown
from lmforge.posttrain.tasks.gsm8k import gsm8k_problems
from lmforge.posttrain.tasks.problem import Problem, Task, read_jsonl, split_of, write_jsonl
from lmforge.posttrain.tasks.rewards import (
    Reward,
    combine,
    countdown_reward,
    exact_answer,
    extract_answer,
    format_reward,
)

TASKS: dict[str, Callable[[], Task]] = {"arithmetic": Arithmetic, "countdown": Countdown}


def get_task(name: str) -> Task:
    """The task called name, with its default settings."""
    if name not in TASKS:
        raise LmforgeError(f"unknown task {name!r}; choose one of {', '.join(sorted(TASKS))}")
    return TASKS[name]()


__all__ = [
    "TASKS",
    "Arithmetic",
    "Countdown",
    "Problem",
    "Reward",
    "Task",
    "combine",
    "countdown_reward",
    "exact_answer",
    "extract_answer",
    "format_reward",
    "get_task",
    "gsm8k_problems",
    "read_jsonl",
    "split_of",
    "write_jsonl",
]
