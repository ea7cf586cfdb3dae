"""The data pipeline: one-method steps, run over shards by local or Ray executors."""

from lmforge.data.pipeline.commands import run_pipeline
from lmforge.data.pipeline.config import PipelineConfig, load_pipeline_config
from lmforge.data.pipeline.registry import STEPS
from lmforge.data.pipeline.step import Filter, GlobalStep, Step, Transform
from lmforge.data.pipeline.writers import read_output
from lmforge.data.stats import StepStats

__all__ = [
    "STEPS",
    "Filter",
    "GlobalStep",
    "PipelineConfig",
    "Step",
    "StepStats",
    "Transform",
    "load_pipeline_config",
    "read_output",
    "run_pipeline",
]
