"""Evaluation of a checkpoint: validation loss and bits per byte (measured by lmforge.train.bpb,
the same code periodic validation runs), and scores on tasks (eval/tasks.py for the spec,
eval/harness.py for running one, eval/run_tasks.py for `lmforge eval --tasks`).

Names import their module (and torch) on first use.
"""

from lmforge.lazy import lazy_exports

_EXPORTS = {
    "EvalResult": "lmforge.train.bpb",
    "evaluate": "lmforge.train.bpb",
    "token_byte_lengths": "lmforge.train.bpb",
    "unigram_bpb": "lmforge.train.bpb",
    "EngineBackend": "lmforge.eval.backend",
    "TaskSpec": "lmforge.eval.tasks",
    "load_spec": "lmforge.eval.tasks",
    "run_task": "lmforge.eval.harness",
}

__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
