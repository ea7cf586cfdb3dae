"""One verifiable problem, the train/test split every task shares, and its JSONL file.

A `Problem` is a user prompt, a worked assistant reply ending in a `#### answer` line (the SFT
target), the canonical answer and whatever extra data its reward needs. Each problem has a
canonical `key` ("arith:37+58"); `split_of` hashes that key, so whether a problem is train or
test depends on the problem alone, never on a seed, a template or a task's settings: the two
splits cannot overlap. `sample_problems` is the one draw loop the generators share (a seeded
`random.Random`, other-split and duplicate draws rejected).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from lmforge.errors import LmforgeError

SPLITS = ("train", "test")


@dataclass(frozen=True)
class Problem:
    prompt: str  # the user message
    solution: str  # the assistant reply for SFT: worked steps, then a final line "#### N"
    answer: str  # the canonical final answer, e.g. "1234"
    fields: dict = field(default_factory=dict)  # extra data a reward needs; JSON-serialisable
    key: str = ""  # the canonical key that decides the split, e.g. "arith:37+58"

    def messages(self) -> list[dict]:
        return [
            {"role": "user", "content": self.prompt},
            {"role": "assistant", "content": self.solution},
        ]

    def reward_fields(self) -> dict:
        """The keyword arguments a reward takes for this problem: `answer` and the fields."""
        return {"answer": self.answer, **self.fields}

    def to_json(self) -> dict:
        return {
            "messages": self.messages(),
            "answer": self.answer,
            "fields": self.fields,
            "key": self.key,
        }

    @classmethod
    def from_json(cls, record: dict) -> Problem:
        """The inverse of `to_json` (a record needs a user and an assistant message)."""
        try:
            by_role = {m["role"]: m["content"] for m in record["messages"]}
            return cls(
                prompt=by_role["user"],
                solution=by_role["assistant"],
                answer=str(record["answer"]),
                fields=dict(record.get("fields") or {}),
                key=str(record.get("key", "")),
            )
        except (KeyError, TypeError) as err:
            raise LmforgeError(
                f"not a problem record (missing {err}); write it with Problem.to_json"
            ) from err


class Task(Protocol):
    """What every task offers: a name, its default reward and a seeded problem generator."""

    name: str
    reward: Callable[..., float]  # called as reward(prompt, completion, **problem.reward_fields())

    def problems(self, n: int, split: str, seed: int) -> list[Problem]: ...


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise LmforgeError(f"unknown split {split!r}; use 'train' or 'test'")


def split_of(key: str, test_percent: int = 10) -> str:
    """'test' for about test_percent of keys, 'train' for the rest, from a stable hash."""
    if not 0 <= test_percent <= 100:
        raise LmforgeError(f"test_percent is {test_percent}; give a percentage from 0 to 100")
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return "test" if int.from_bytes(digest, "big") % 100 < test_percent else "train"


def sample_problems(
    draw: Callable[[random.Random], Problem],
    n: int,
    split: str,
    seed: int,
    *,
    task: str,
    test_percent: int = 10,
    hint: str = "ask for fewer",
) -> list[Problem]:
    """n distinct problems of one split from draw(rng), the same list for the same seed.

    Draws of the other split and repeated keys are rejected; after many rejections in a row
    the split is taken to be exhausted and an LmforgeError says so.
    """
    check_split(split)
    if n < 0:
        raise LmforgeError(f"{task}: asked for {n} problems; ask for zero or more")
    rng = random.Random(f"{task}:{split}:{seed}")
    budget = max(10_000, 50 * n)
    seen: set[str] = set()
    out: list[Problem] = []
    misses = 0
    while len(out) < n:
        problem = draw(rng)
        if problem.key in seen or split_of(problem.key, test_percent) != split:
            misses += 1
            if misses > budget:
                raise LmforgeError(
                    f"{task}: the {split} split has no more distinct problems after "
                    f"{len(out)} of {n}; {hint}"
                )
            continue
        misses = 0
        seen.add(problem.key)
        out.append(problem)
    return out


def write_jsonl(problems: Iterable[Problem], path: str | os.PathLike) -> Path:
    """Write one `to_json` record per line, atomically: a temporary file, then os.replace."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for problem in problems:
                f.write(json.dumps(problem.to_json(), ensure_ascii=False) + "\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def read_jsonl(path: str | os.PathLike) -> list[Problem]:
    """The problems `write_jsonl` wrote."""
    source = Path(path)
    if not source.is_file():
        raise LmforgeError(f"no problem file at {source}; write one with write_jsonl")
    with source.open(encoding="utf-8") as f:
        return [Problem.from_json(json.loads(line)) for line in f if line.strip()]
