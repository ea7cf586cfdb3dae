"""Rewards: how a completion of a problem is scored, from 0.0 to 1.0, with no model involved.

Every reward is called as `reward(prompt, completion, **fields)`, where fields are the
problem's `answer` and its extra fields (`Problem.reward_fields()`), and ignores the fields it
does not need, so any rewards can be combined. The final answer is the text after the last
`####` (GSM8K's convention). Countdown expressions are checked here too, by a small `ast`
walker that admits only integers and + - * (never eval): a completion is untrusted text.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from lmforge.errors import LmforgeError

Reward = Callable[..., float]
MAX_EXPRESSION_CHARS = 256  # far above any countdown answer; keeps the parser's work small
_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}


def extract_answer(completion: str) -> str | None:
    """The text after the last `####` on its line, stripped, commas and a final '.' removed;
    None when there is no `####` or nothing after it."""
    at = completion.rfind("####")
    if at < 0:
        return None
    text = completion[at + 4 :].split("\n", 1)[0].strip().replace(",", "")
    text = text.removesuffix(".").strip()
    return text or None


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def exact_answer(prompt: str, completion: str, answer: str, **fields: Any) -> float:
    """1.0 when the final answer equals `answer`: as numbers where both parse, else as text."""
    got = extract_answer(completion)
    if got is None:
        return 0.0
    want = str(answer).strip()
    got_value, want_value = _number(got), _number(want)
    if got_value is not None and want_value is not None:
        return float(got_value == want_value)
    return float(got == want)


def format_reward(prompt: str, completion: str, **fields: Any) -> float:
    """1.0 when the completion ends with its one and only `#### answer` line, else 0.0."""
    text = completion.rstrip()
    last = text.rsplit("\n", 1)[-1].strip()
    ok = text.count("####") == 1 and last.startswith("####") and last[4:].strip() != ""
    return float(ok)


class InvalidExpression(ValueError):
    """A countdown answer that is not integers joined by + - * using the given numbers."""


def evaluate_expression(expression: str, numbers: Sequence[int]) -> int:
    """The value of an expression of the given numbers (each at most once) and + - *.

    Raises InvalidExpression for anything else: names, calls, attributes, other operators
    (including / // and **), unary minus, non-integers, numbers not given or used too often.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise InvalidExpression(f"longer than {MAX_EXPRESSION_CHARS} characters")
    source_text = expression.strip()
    try:
        tree = ast.parse(source_text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise InvalidExpression(f"does not parse: {err}") from err
    used: Counter[int] = Counter()

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant) and type(node.value) is int:
            source = ast.get_source_segment(source_text, node)
            if source != str(node.value):
                raise InvalidExpression(f"{source!r} is not a plain decimal number")
            used[node.value] += 1
            return node.value
        raise InvalidExpression(f"{type(node).__name__} is not allowed; use integers and + - *")

    value = walk(tree.body)
    extra = used - Counter(numbers)
    if extra:
        raise InvalidExpression(f"uses {sorted(extra.elements())} beyond the numbers given")
    return value


def countdown_reward(
    prompt: str,
    completion: str,
    answer: str | None = None,
    numbers: Sequence[int] | None = None,
    target: int | None = None,
    **fields: Any,
) -> float:
    """1.0 when the expression after `####` uses the numbers validly and equals the target."""
    if numbers is None or target is None:
        raise LmforgeError(
            "countdown_reward needs the problem's numbers and target; pass "
            "**problem.reward_fields()"
        )
    expression = extract_answer(completion)
    if expression is None:
        return 0.0
    try:
        return float(evaluate_expression(expression, numbers) == int(target))
    except InvalidExpression:
        return 0.0


class CombinedReward:
    """A weighted sum of rewards; `breakdown` gives each part's unweighted score for logging."""

    def __init__(self, parts: Sequence[tuple[Reward, float]]) -> None:
        self.parts = list(parts)
        self.__name__ = " + ".join(f"{w:g}*{_name(r)}" for r, w in self.parts)

    def __call__(self, prompt: str, completion: str, **fields: Any) -> float:
        return sum(w * r(prompt, completion, **fields) for r, w in self.parts)

    def breakdown(self, prompt: str, completion: str, **fields: Any) -> dict[str, float]:
        return {_name(r): r(prompt, completion, **fields) for r, _ in self.parts}

    def __repr__(self) -> str:
        return f"CombinedReward({self.__name__})"


def _name(reward: Reward) -> str:
    return getattr(reward, "__name__", type(reward).__name__)


def combine(rewards: Sequence[tuple[Reward, float]]) -> CombinedReward:
    """The reward sum(weight * reward(prompt, completion, **fields)) over (reward, weight)."""
    if not rewards:
        raise LmforgeError("combine() got no rewards; pass a list of (reward, weight) pairs")
    for pair in rewards:
        if not (isinstance(pair, tuple) and len(pair) == 2 and callable(pair[0])):
            raise LmforgeError(f"combine() got {pair!r}; pass (reward, weight) pairs")
    return CombinedReward(rewards)
