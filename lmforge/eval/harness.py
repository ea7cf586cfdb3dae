"""Running a task: its documents to requests, the backend's answers to per-example records and a
summary with standard errors.

Requests are built as lm-eval builds them (`context`: description, few-shot examples and the
document's text; a choice's continuation is `target_delimiter + choice`), so `lmforge eval`
and lm-eval agree on the same model. Few-shot examples come from the task's fewshot split, or
else from its other documents, drawn by a generator seeded with (seed, document index): the same
every run, and never the document itself.

Every example becomes one JSON record (its prompt, choices, per-choice log-likelihoods,
prediction, gold and whether it was correct); `write_results` saves them beside a summary.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from pathlib import Path

from lmforge.atomic import write_text
from lmforge.errors import LmforgeError
from lmforge.eval.backend import EngineBackend
from lmforge.eval.code_tasks import run_code_task
from lmforge.eval.metrics import (
    count_words,
    mean,
    mean_stderr,
    numeric_answer,
    ratio_bootstrap,
)
from lmforge.eval.result import TaskResult
from lmforge.eval.tasks import TaskSpec, load_docs

FEWSHOT_SEED = 1234


def run_task(
    backend: EngineBackend,
    spec: TaskSpec,
    limit: int | None = None,
    num_fewshot: int | None = None,
    seed: int = FEWSHOT_SEED,
    docs: list[dict] | None = None,
) -> TaskResult:
    """Evaluate `backend` on the first `limit` documents of `spec`'s test split."""
    docs = load_docs(spec) if docs is None else docs
    if not docs:
        raise LmforgeError(f"task {spec.task!r} has no documents in split {spec.test_split!r}")
    pool = load_docs(spec, spec.fewshot_split) if spec.fewshot_split else None
    tested = docs[:limit] if limit else docs
    shots = spec.num_fewshot if num_fewshot is None else num_fewshot
    contexts = [
        _context(spec, doc, i, pool or docs, pool is None, shots, seed)
        for i, doc in enumerate(tested)
    ]
    runner = RUNNERS[spec.output_type]
    return runner(backend, spec, tested, contexts)


def _context(
    spec: TaskSpec,
    doc: dict,
    index: int,
    pool: list[dict],
    same_split: bool,
    shots: int,
    seed: int,
) -> str:
    if spec.output_type in ("loglikelihood_rolling", "schema", "code"):
        return ""
    prefix = spec.description
    if shots:
        candidates = [d for j, d in enumerate(pool) if not (same_split and j == index)]
        if len(candidates) < shots:
            raise LmforgeError(
                f"task {spec.task!r}: {shots} few-shot examples asked, {len(candidates)} "
                "documents to draw them from: lower --num-fewshot"
            )
        examples = random.Random(f"{seed}:{index}").sample(candidates, shots)
        prefix += spec.fewshot_delimiter.join(
            spec.text(ex) + spec.target_delimiter + _target_text(spec, ex) for ex in examples
        )
        prefix += spec.fewshot_delimiter
    return prefix + spec.text(doc)


def _target_text(spec: TaskSpec, doc: dict) -> str:
    if spec.output_type == "multiple_choice":
        return spec.choices(doc)[spec.gold_index(doc)]
    return str(spec.target(doc))


def _with_stderr(values: dict[str, list[float]]) -> dict[str, float]:
    out = {}
    for name, vals in values.items():
        out[name] = mean(vals)
        out[f"{name}_stderr"] = mean_stderr(vals)
    return out


def _multiple_choice(
    backend: EngineBackend, spec: TaskSpec, docs: list[dict], contexts: list[str]
) -> TaskResult:
    choices = [spec.choices(doc) for doc in docs]
    requests = [
        (ctx, spec.target_delimiter + c)
        for ctx, cs in zip(contexts, choices, strict=True)
        for c in cs
    ]
    scores = iter(backend.loglikelihood(requests))
    records, values = [], {"acc": [], "acc_norm": [], "acc_per_token": []}
    for ctx, doc, cs in zip(contexts, docs, choices, strict=True):
        scored = [next(scores) for _ in cs]
        lls = [s.total for s in scored]
        per_token = [s.total / max(1, len(s.logprobs)) for s in scored]
        norm = [ll / len(c) if c else ll for ll, c in zip(lls, cs, strict=True)]
        gold = spec.gold_index(doc)
        pred, pred_norm, pred_token = (_argmax(v) for v in (lls, norm, per_token))
        values["acc"].append(float(pred == gold))
        values["acc_norm"].append(float(pred_norm == gold))
        values["acc_per_token"].append(float(pred_token == gold))
        records.append(
            {
                "prompt": ctx,
                "choices": cs,
                "loglikelihoods": lls,
                "tokens": [len(s.logprobs) for s in scored],
                "prediction": pred,
                "prediction_norm": pred_norm,
                "gold": gold,
                "gold_text": cs[gold],
                "correct": pred == gold,
            }
        )
    baseline = spec.baseline if spec.baseline is not None else mean([1 / len(c) for c in choices])
    return TaskResult(spec.task, spec.output_type, _with_stderr(values), records, baseline)


def _schema(
    backend: EngineBackend, spec: TaskSpec, docs: list[dict], _contexts: list[str]
) -> TaskResult:
    options = [spec.choices(doc) for doc in docs]
    conts = [spec.continuation(doc) for doc in docs]
    requests = [
        (option, spec.target_delimiter + cont)
        for opts, cont in zip(options, conts, strict=True)
        for option in opts
    ]
    scores = iter(backend.loglikelihood(requests))
    records, correct = [], []
    for doc, opts, cont in zip(docs, options, conts, strict=True):
        scored = [next(scores) for _ in opts]
        mean_lls = [s.total / max(1, len(s.logprobs)) for s in scored]
        pred, gold = _argmax(mean_lls), spec.gold_index(doc)
        correct.append(float(pred == gold))
        records.append(
            {
                "prompt": opts[gold],
                "choices": opts,
                "continuation": cont,
                "loglikelihoods": [s.total for s in scored],
                "prediction": pred,
                "gold": gold,
                "gold_text": cont,
                "correct": pred == gold,
            }
        )
    baseline = spec.baseline if spec.baseline is not None else mean([1 / len(o) for o in options])
    return TaskResult(
        spec.task, spec.output_type, _with_stderr({"acc": correct}), records, baseline
    )


def _loglikelihood(
    backend: EngineBackend, spec: TaskSpec, docs: list[dict], contexts: list[str]
) -> TaskResult:
    targets = [str(spec.target(doc)) for doc in docs]
    requests = [(ctx, spec.target_delimiter + t) for ctx, t in zip(contexts, targets, strict=True)]
    records, correct, lls = [], [], []
    for ctx, target, s in zip(contexts, targets, backend.loglikelihood(requests), strict=True):
        correct.append(float(s.is_greedy))
        lls.append(s.total)
        records.append(
            {
                "prompt": ctx,
                "gold_text": target,
                "loglikelihood": s.total,
                "greedy": s.greedy,
                "correct": s.is_greedy,
            }
        )
    metrics = _with_stderr({"acc": correct})
    metrics["perplexity"] = math.exp(-mean(lls))
    baseline = spec.baseline if spec.baseline is not None else 0.0
    return TaskResult(spec.task, spec.output_type, metrics, records, baseline)


def _rolling(
    backend: EngineBackend, spec: TaskSpec, docs: list[dict], _contexts: list[str]
) -> TaskResult:
    texts = [str(spec.target(doc)) for doc in docs]
    lls = backend.loglikelihood_rolling(texts)
    words = [count_words(t) for t in texts]
    nbytes = [len(t.encode("utf-8")) for t in texts]
    nll = [-ll for ll in lls]
    bpb = sum(nll) / sum(nbytes) / math.log(2)
    metrics = {
        "bits_per_byte": bpb,
        "bits_per_byte_stderr": ratio_bootstrap(nll, nbytes, lambda x: x / math.log(2)),
        "byte_perplexity": 2**bpb,
        "word_perplexity": math.exp(sum(nll) / sum(words)),
    }
    records = [
        {"prompt": "", "gold_text": t, "loglikelihood": ll, "bytes": b, "words": w}
        for t, ll, b, w in zip(texts, lls, nbytes, words, strict=True)
    ]
    return TaskResult(spec.task, spec.output_type, metrics, records, None, "bits_per_byte")


def _generate(
    backend: EngineBackend, spec: TaskSpec, docs: list[dict], contexts: list[str]
) -> TaskResult:
    requests = [(ctx, spec.until, spec.max_gen_toks) for ctx in contexts]
    generations = backend.generate_until(requests)
    records, correct = [], []
    for ctx, doc, (gen,) in zip(contexts, docs, generations, strict=True):
        gold = str(spec.target(doc))
        if spec.metric == "numeric":
            predicted, expected = numeric_answer(gen.text), numeric_answer(gold)
            ok = predicted is not None and predicted == expected
        else:
            predicted, expected = gen.text.strip(), gold.strip()
            ok = predicted == expected
        correct.append(float(ok))
        records.append(
            {
                "prompt": ctx,
                "generation": gen.text,
                "prediction": predicted,
                "gold": expected,
                "gold_text": gold,
                "correct": ok,
            }
        )
    metric = spec.metric
    baseline = spec.baseline if spec.baseline is not None else 0.0
    return TaskResult(
        spec.task, spec.output_type, _with_stderr({metric: correct}), records, baseline, metric
    )


def _argmax(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)


RUNNERS: dict[str, Callable[..., TaskResult]] = {
    "multiple_choice": _multiple_choice,
    "schema": _schema,
    "loglikelihood": _loglikelihood,
    "loglikelihood_rolling": _rolling,
    "generate_until": _generate,
    "code": lambda backend, spec, docs, _contexts: run_code_task(backend, spec, docs),
}


def write_results(
    results: list[TaskResult], out_dir: str | Path, header: dict | None = None
) -> Path:
    """`<task>.jsonl` (one record per example) and `summary.json` in out_dir, each written to a
    temporary name first, so a folder never holds half a result."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for result in results:
        write_text(
            out / f"{result.task}.jsonl",
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in result.records),
        )
    summary = {**(header or {}), "tasks": [r.summary() for r in results]}
    write_text(out / "summary.json", json.dumps(summary, indent=1, default=str) + "\n")
    return out / "summary.json"
