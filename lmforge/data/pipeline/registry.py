"""The steps a pipeline can name, by their `name`: the one place a new step is registered."""

from __future__ import annotations

from lmforge.data.pipeline.dedup_steps import ExactDedup, LineDedup, MinHashDedup
from lmforge.data.pipeline.step import Step
from lmforge.data.pipeline.steps import Extract, LangId, Pii, Quality, QualityClassifier, Toxicity

STEPS: dict[str, type[Step]] = {
    cls.name: cls
    for cls in (
        Extract,
        LangId,
        Quality,
        Toxicity,
        Pii,
        QualityClassifier,
        ExactDedup,
        LineDedup,
        MinHashDedup,
    )
}
