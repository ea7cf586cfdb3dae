"""Task scores during training (`train.eval.tasks`): the trainer calls back with its model.

Training never imports eval/ (its validation is train/bpb.py), so the speedrun builds this
callback and hands it to `train`, which calls it at every validation with the model it trains.
The tasks are resolved once (the code suite built from the run's validation documents, at
`PERIODIC_EXAMPLES` examples each); each call wraps the model in an engine for the time of the
evaluation, with no copy of the weights and no relayout, and puts it back in training mode.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from lmforge.eval.backend import EngineBackend
from lmforge.eval.harness import run_task
from lmforge.eval.run_tasks import RunDocuments, resolve_tasks
from lmforge.infer.engine import Engine
from lmforge.tokenizer import Tokenizer

PERIODIC_EXAMPLES = 100  # per task: periodic scores show the trend, the final one the number


def task_evaluator(
    names: list[str], documents: RunDocuments | None, tokenizer_dir: str | Path
) -> Callable[[torch.nn.Module], dict[str, float]]:
    """A callback giving each task's headline score for a model, e.g. {"code_next_line": 0.41}."""
    tasks = resolve_tasks(names, documents, PERIODIC_EXAMPLES)
    tokenizer = Tokenizer.load(tokenizer_dir)

    def scores(model: torch.nn.Module) -> dict[str, float]:
        was_training = model.training
        try:
            with Engine(model, tokenizer, max_batch_size=4) as engine:
                backend = EngineBackend(engine, tokenizer)
                return {
                    spec.task: run_task(backend, spec, PERIODIC_EXAMPLES, docs=docs).score
                    for spec, docs in tasks
                }
        finally:
            model.train(was_training)

    return scores
