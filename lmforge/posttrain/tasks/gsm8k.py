"""GSM8K-format problems ({"question", "answer"} with the answer ending "#### N") as Problems.

From a local JSONL file (or a folder holding `train.jsonl` and `test.jsonl`, as the original
release ships them), or from Hugging Face as `hf:openai/gsm8k` (config "main", or
`hf:owner/name:config`) through `datasets`, imported only then. GSM8K comes split already, so
the split names a file or a Hugging Face split rather than a hash. Calculator annotations
(`<<48/2=24>>`) are dropped from solutions by default: a small model has no calculator.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from lmforge.errors import LmforgeError
from lmforge.posttrain.tasks.problem import Problem, check_split
from lmforge.posttrain.tasks.rewards import combine, exact_answer, extract_answer, format_reward

HF_PREFIX = "hf:"
_CALCULATOR = re.compile(r"<<[^<>]*>>")
REWARD = combine([(exact_answer, 1.0), (format_reward, 0.1)])


def to_problem(record: dict, strip_calculator: bool = True, where: str = "record") -> Problem:
    """One GSM8K record as a Problem; where names it in errors."""
    question, solution = record.get("question"), record.get("answer")
    if not isinstance(question, str) or not isinstance(solution, str):
        raise LmforgeError(f"{where} lacks a text 'question' and 'answer'; give GSM8K records")
    answer = extract_answer(solution)
    if answer is None:
        raise LmforgeError(f"{where}: its answer has no final '#### N' line; give GSM8K records")
    if strip_calculator:
        solution = _CALCULATOR.sub("", solution)
    key = "gsm8k:" + " ".join(question.split())
    return Problem(question.strip(), solution.strip(), answer, {}, key=key)


def _read_local(path: Path, split: str) -> list[tuple[dict, str]]:
    source = path / f"{split}.jsonl" if path.is_dir() else path
    if not source.is_file():
        raise LmforgeError(f"no GSM8K file at {source}; pass a JSONL file or hf:openai/gsm8k")
    records = []
    with source.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                records.append((json.loads(line), f"{source}:{number}"))
            except json.JSONDecodeError as err:
                raise LmforgeError(
                    f"{source}:{number} is not JSON ({err.msg}); give one record a line"
                ) from err
    return records


def _read_hf(name: str, split: str) -> list[tuple[dict, str]]:
    try:
        import datasets
    except ImportError as err:
        raise LmforgeError(
            f"reading {HF_PREFIX}{name} needs the datasets package: pip install datasets "
            "(or pass a local JSONL file)"
        ) from err
    repo, _, config = name.partition(":")
    try:
        rows = datasets.load_dataset(repo, config or "main", split=split)
    except Exception as err:  # network, unknown repo or split: all the user's to fix
        raise LmforgeError(
            f"could not load {HF_PREFIX}{name} split {split} ({err}); check the name and the "
            "network, or pass a local JSONL file"
        ) from err
    return [(dict(row), f"{HF_PREFIX}{name} {split} row {i}") for i, row in enumerate(rows)]


def gsm8k_problems(
    path_or_hf: str, split: str, n: int | None = None, *, strip_calculator: bool = True
) -> list[Problem]:
    """The first n problems (all when n is None) of a GSM8K split, in file order."""
    check_split(split)
    if n is not None and n < 0:
        raise LmforgeError(f"asked for {n} GSM8K problems; ask for zero or more")
    if path_or_hf.startswith(HF_PREFIX):
        records = _read_hf(path_or_hf[len(HF_PREFIX) :], split)
    else:
        records = _read_local(Path(path_or_hf), split)
    if n is not None and n > len(records):
        raise LmforgeError(
            f"{path_or_hf} has {len(records)} {split} problems, not {n}; ask for fewer"
        )
    chosen = records if n is None else records[:n]
    return [to_problem(record, strip_calculator, where) for record, where in chosen]
