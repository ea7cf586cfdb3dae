"""One task's outcome: its metrics, every example's record, and what to compare it with."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lmforge.eval.metrics import centered


@dataclass
class TaskResult:
    task: str
    output_type: str
    metrics: dict[str, float]  # name -> value; "<name>_stderr" beside each
    records: list[dict[str, Any]]
    baseline: float | None = None  # chance level of the headline metric, where it has one
    headline: str = "acc"
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. contamination

    @property
    def score(self) -> float:
        return self.metrics[self.headline]

    @property
    def centered(self) -> float | None:
        return None if self.baseline is None else centered(self.score, self.baseline)

    def summary(self) -> dict[str, Any]:
        out = {
            "task": self.task,
            "output_type": self.output_type,
            "examples": len(self.records),
            "headline": self.headline,
            "metrics": {k: None if v != v else v for k, v in self.metrics.items()},  # NaN: None
            "baseline": self.baseline,
            "centered": self.centered,
        }
        return {**out, **self.extra, "failures": self.failures()}

    def failures(self, n: int = 3) -> list[dict[str, Any]]:
        return [r for r in self.records if not r.get("correct", True)][:n]

    def example_texts(self) -> list[str]:
        """Each example's text as a model would read it, gold included (for contamination)."""
        return [r["prompt"] + " " + str(r.get("gold_text", "")) for r in self.records]
