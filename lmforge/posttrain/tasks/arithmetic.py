"""Multi-digit addition and subtraction word problems, with column-wise worked solutions.

Sized for a tiny model: two digits, + and -, results never negative, and one short regular
solution per problem, the digits from right to left as taught in school:

    37 + 58: 7 + 8 = 15, write 5 carry 1. 3 + 5 + 1 = 9. So 37 + 58 = 95.
    #### 95

    95 - 58: 15 - 8 = 7, write 7 borrow 1. 9 - 1 - 5 = 3. So 95 - 58 = 37.
    #### 37

A problem's key is its sum ("arith:37+58"), not its wording, so the same sum told as a story
about apples and as a bare question is on one side of the split.
"""

from __future__ import annotations

import random

from lmforge.errors import LmforgeError
from lmforge.posttrain.tasks.problem import Problem, sample_problems
from lmforge.posttrain.tasks.rewards import combine, exact_answer, format_reward

OPS = "+-"
MAX_DIGITS = 12
NAMES = ("Tom", "Ana", "Sam", "Mia", "Leo", "Zoe")
ITEMS = ("apples", "books", "coins", "cards", "pens", "stones")
TEMPLATES = {
    "+": (
        "{name} has {a} {item} and buys {b} more. How many {item} does {name} have?",
        "There are {a} {item} in a box. {name} puts in {b} more. How many {item} are in the box?",
        "What is {a} + {b}?",
    ),
    "-": (
        "{name} has {a} {item} and gives away {b}. How many {item} does {name} have left?",
        "There are {a} {item} in a box. {name} takes out {b}. How many {item} are left in the box?",
        "What is {a} - {b}?",
    ),
}


def _digits(n: int, width: int) -> list[int]:
    """The digits of n from the ones column up, padded with zeros to width."""
    return [int(c) for c in reversed(str(n).rjust(width, "0"))]


def add_steps(a: int, b: int) -> list[str]:
    """One sentence per column of a + b, ones first, carrying into the next column."""
    width = max(len(str(a)), len(str(b)))
    steps, carry = [], 0
    for i, (x, y) in enumerate(zip(_digits(a, width), _digits(b, width), strict=True)):
        total = x + y + carry
        text = f"{x} + {y}{' + 1' if carry else ''} = {total}"
        if i == width - 1:
            steps.append(text + ".")
        else:
            carry = total // 10
            steps.append(text + f", write {total % 10}{' carry 1' if carry else ''}.")
    return steps


def subtract_steps(a: int, b: int) -> list[str]:
    """One sentence per column of a - b (a >= b), ones first, borrowing from the next column."""
    width = len(str(a))
    steps, borrow = [], 0
    for i, (x, y) in enumerate(zip(_digits(a, width), _digits(b, width), strict=True)):
        owed = " - 1" if borrow else ""
        if x - borrow >= y:
            result, top, borrow = x - borrow - y, f"{x}", 0
        else:
            result, top, borrow = x + 10 - borrow - y, f"1{x}", 1
        text = f"{top}{owed} - {y} = {result}"
        if i == width - 1:
            steps.append(text + ".")
        else:
            steps.append(text + f", write {result}{' borrow 1' if borrow else ''}.")
    return steps


def solve(a: int, op: str, b: int) -> tuple[str, int]:
    """The worked solution of `a op b` and its value."""
    value = a + b if op == "+" else a - b
    steps = add_steps(a, b) if op == "+" else subtract_steps(a, b)
    return f"{a} {op} {b}: {' '.join(steps)} So {a} {op} {b} = {value}.\n#### {value}", value


class Arithmetic:
    """Addition and subtraction of numbers of 1 to max_digits digits, as word problems."""

    name = "arithmetic"

    def __init__(self, max_digits: int = 2, ops: str = OPS, test_percent: int = 10) -> None:
        if not 1 <= max_digits <= MAX_DIGITS:
            raise LmforgeError(
                f"arithmetic max_digits is {max_digits}; use 1 to {MAX_DIGITS} (2 suits a 5M model)"
            )
        if not ops or set(ops) - set(OPS):
            raise LmforgeError(f"arithmetic ops is {ops!r}; use a combination of {OPS!r}")
        self.max_digits = max_digits
        self.ops = "".join(sorted(set(ops), key=OPS.index))
        self.test_percent = test_percent
        # Right answer first; the small format bonus gives early RL a signal to end on ####.
        self.reward = combine([(exact_answer, 1.0), (format_reward, 0.1)])

    def _operand(self, rng: random.Random) -> int:
        digits = rng.randint(1, self.max_digits)  # as many 1-digit as 2-digit operands
        return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)

    def draw(self, rng: random.Random) -> Problem:
        op = rng.choice(self.ops)
        a, b = self._operand(rng), self._operand(rng)
        if op == "-" and a < b:
            a, b = b, a
        template = rng.choice(TEMPLATES[op])
        prompt = template.format(a=a, b=b, name=rng.choice(NAMES), item=rng.choice(ITEMS))
        solution, value = solve(a, op, b)
        fields = {"a": a, "op": op, "b": b}
        return Problem(prompt, solution, str(value), fields, key=f"arith:{a}{op}{b}")

    def problems(self, n: int, split: str, seed: int) -> list[Problem]:
        return sample_problems(
            self.draw,
            n,
            split,
            seed,
            task=self.name,
            test_percent=self.test_percent,
            hint="ask for fewer or raise max_digits",
        )
