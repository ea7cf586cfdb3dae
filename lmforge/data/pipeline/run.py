"""`lmforge data run` and `lmforge data train-classifier`: one function each for the CLI."""

from __future__ import annotations

from lmforge.data.pipeline.config import PipelineConfig
from lmforge.data.pipeline.executor import Executor, LocalExecutor


def make_executor(cfg: PipelineConfig) -> Executor:
    if cfg.executor == "ray":
        from lmforge.data.pipeline.ray_executor import RayExecutor

        return RayExecutor(cfg.workers, cfg.address)
    return LocalExecutor(cfg.workers)


def run_pipeline(cfg: PipelineConfig) -> dict:
    """Run `cfg` with its executor; returns the merged stats (also in OUTPUT/stats.json)."""
    with make_executor(cfg) as executor:
        return executor.run(cfg)
