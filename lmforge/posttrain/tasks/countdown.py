"""Countdown: reach a target from a few numbers with + - *, each number used at most once.

Every instance is solvable by construction: the target is the value of a random expression of
all the numbers, built the way the game is played (combine two numbers, put the result back,
repeat), with no intermediate value below zero. The solution shows those steps and ends with
the expression as its answer line:

    3 * 7 = 21. 21 + 2 = 23.
    #### 3*7+2

The answer is any valid expression, so the reward evaluates what the model wrote
(`rewards.countdown_reward`) rather than comparing it with ours. A problem's key is its
multiset of numbers and its target ("countdown:2,3,7=23"), whatever order the prompt lists
them in.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from lmforge.errors import LmforgeError
from lmforge.posttrain.tasks.problem import Problem, sample_problems
from lmforge.posttrain.tasks.rewards import combine, countdown_reward, format_reward

OPS = "+-*"
_PRECEDENCE = {"+": 1, "-": 1, "*": 2}


@dataclass(frozen=True)
class _Node:
    value: int
    text: str  # the expression, parenthesised only where needed
    precedence: int  # 3 for a bare number


def _join(left: _Node, op: str, right: _Node) -> _Node:
    prec = _PRECEDENCE[op]
    lhs = f"({left.text})" if left.precedence < prec else left.text
    # a-(b-c) and a-(b+c) need their brackets; a+(b-c) and a*(b*c) do not.
    wrap = right.precedence < prec or (op == "-" and right.precedence == prec)
    rhs = f"({right.text})" if wrap else right.text
    if op == "+":
        value = left.value + right.value
    elif op == "-":
        value = left.value - right.value
    else:
        value = left.value * right.value
    return _Node(value, f"{lhs}{op}{rhs}", prec)


def build(numbers: list[int], rng: random.Random) -> tuple[_Node, list[str]]:
    """A random expression of all the numbers and the steps that compute it."""
    pool = [_Node(n, str(n), 3) for n in numbers]
    steps = []
    while len(pool) > 1:
        i, j = rng.sample(range(len(pool)), 2)
        left, right = pool[i], pool[j]
        op = rng.choice(OPS)
        if op == "-" and left.value < right.value:
            left, right = right, left
        node = _join(left, op, right)
        steps.append(f"{left.value} {op} {right.value} = {node.value}.")
        pool = [p for k, p in enumerate(pool) if k not in (i, j)] + [node]
    return pool[0], steps


class Countdown:
    """n_numbers numbers from 1 to max_number and a target made from all of them."""

    name = "countdown"

    def __init__(self, n_numbers: int = 3, max_number: int = 10, test_percent: int = 10) -> None:
        if not 2 <= n_numbers <= 6:
            raise LmforgeError(
                f"countdown n_numbers is {n_numbers}; use 2 to 6 (3 suits a 5M model)"
            )
        if not 2 <= max_number <= 1000:
            raise LmforgeError(f"countdown max_number is {max_number}; use 2 to 1000")
        self.n_numbers = n_numbers
        self.max_number = max_number
        self.test_percent = test_percent
        # A valid expression hitting the target first; the small bonus for ending on ####.
        self.reward = combine([(countdown_reward, 1.0), (format_reward, 0.1)])

    def draw(self, rng: random.Random) -> Problem:
        while True:
            numbers = [rng.randint(1, self.max_number) for _ in range(self.n_numbers)]
            node, steps = build(numbers, rng)
            if node.value > 0:
                break
        target = node.value
        shown = ", ".join(map(str, numbers))
        prompt = f"Using the numbers {shown} each at most once with + - *, make {target}."
        solution = " ".join(steps) + f"\n#### {node.text}"
        key = f"countdown:{','.join(map(str, sorted(numbers)))}={target}"
        fields = {"numbers": numbers, "target": target}
        return Problem(prompt, solution, node.text, fields, key=key)

    def problems(self, n: int, split: str, seed: int) -> list[Problem]:
        return sample_problems(
            self.draw,
            n,
            split,
            seed,
            task=self.name,
            test_percent=self.test_percent,
            hint="ask for fewer or raise n_numbers or max_number",
        )
