"""Validation as one component: the periodic and closing evaluations of a run.

It runs the data's own validation (bits per byte on token shards, the assistant's tokens for
conversations: train/data.py) under the run's precision, logs it to metrics.jsonl with the
batches it read and, where `train.eval.tasks` names tasks, scores the model on them too.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from lmforge.progress import bar_per_call
from lmforge.train.bpb import EvalResult
from lmforge.train.compose import Composed
from lmforge.train.config import TrainConfig
from lmforge.train.data import TrainingData
from lmforge.train.metrics import MetricsLog


class Validator:
    def __init__(
        self,
        data: TrainingData,
        cfg: TrainConfig,
        composed: Composed,
        metrics: MetricsLog,
        score_tasks: Callable[[nn.Module], dict[str, float]] | None = None,
    ) -> None:
        self.data, self.cfg, self.composed, self.metrics = data, cfg, composed, metrics
        self.score_tasks = score_tasks

    def due(self, step: int, total: int | None) -> bool:
        """Whether a periodic validation follows `step` (the closing one ends every run)."""
        every = self.cfg.eval.every
        return bool(every) and step % every == 0 and step != total

    def run(self, leave: bool = False) -> EvalResult:
        """One validation pass, not logged."""
        evaluator = self.composed.evaluator or self.composed.compute
        shown = bar_per_call(
            evaluator,
            desc="validation",
            total=self.data.validation_batches(self.cfg),
            unit="batch",
            leave=leave,
            disable=not self.metrics.enabled,
        )
        with self.composed.precision.autocast(), shown:
            return self.data.validate(evaluator, self.cfg, self.composed.world.device)

    def validate(self, step: int, log: Callable[[str], None], leave: bool = False) -> EvalResult:
        """A validation at `step`, logged to metrics.jsonl, with the tasks' scores."""
        ev = self.run(leave)
        loss, bpb = round(ev.loss, 5), round(ev.bpb, 5)
        self.metrics.write(
            step=step, val_loss=loss, val_bpb=bpb, eval_batches=self.cfg.eval.batches
        )
        if self.score_tasks is not None:
            scores = {
                f"task_{k}": round(v, 4) for k, v in self.score_tasks(self.composed.master).items()
            }
            self.metrics.write(step=step, **scores)
            log("tasks: " + ", ".join(f"{k[5:]} {v:.3f}" for k, v in scores.items()))
        return ev
