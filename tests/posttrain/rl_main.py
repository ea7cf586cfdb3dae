"""`lmforge rl` as the command line runs it (`python -m lmforge`), with one more task for the
tests: `digits`, arithmetic's problems rewarded by the share of digits in a completion, so that
a tiny untrained model's groups carry signal (its exact answers are all wrong: reward 0).

Usage, like `-m lmforge`, also under torchrun:
    python tests/posttrain/rl_main.py rl --task digits --checkpoint CKPT ...
"""

import contextlib
import sys
from collections.abc import Iterator

from lmforge.posttrain.tasks import TASKS, Arithmetic


def digits(prompt: str, completion: str, **fields) -> float:
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)


class Digits(Arithmetic):
    name = "digits"

    def __init__(self) -> None:
        super().__init__()
        self.reward = digits


@contextlib.contextmanager
def digits_task() -> Iterator[None]:
    """The `digits` task among the tasks, within the block."""
    TASKS["digits"] = Digits
    try:
        yield
    finally:
        del TASKS["digits"]


if __name__ == "__main__":
    from lmforge.cli import main

    with digits_task():
        raise SystemExit(main(sys.argv[1:]))
