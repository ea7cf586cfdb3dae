"""`lmforge data run` and `lmforge data train-classifier`: one function each for the CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmforge.data.pipeline.config import PipelineConfig, load_pipeline_config
from lmforge.data.pipeline.executor import Executor, LocalExecutor
from lmforge.data.pipeline.passes import Layout
from lmforge.data.pipeline.requirements import check_requirements, input_needs, require_all
from lmforge.data.readers import ReadConfig, list_units, plan_shards, read_shard
from lmforge.data.stats import StepStats
from lmforge.errors import LmforgeError


def make_executor(cfg: PipelineConfig) -> Executor:
    if cfg.executor == "ray":
        from lmforge.data.pipeline.ray_executor import RayExecutor

        return RayExecutor(cfg.workers, cfg.address)
    return LocalExecutor(cfg.workers)


def run_pipeline(cfg: PipelineConfig) -> dict:
    """Run `cfg` with its executor; returns the merged stats (also in OUTPUT/stats.json).

    What the config needs installed is checked first, before the output folder is claimed. A
    run that fails (any exception, Ctrl-C too) leaves its finished tasks for a rerun to resume
    from, and no temporary files.
    """
    check_requirements(cfg)
    try:
        with make_executor(cfg) as executor:
            return executor.run(cfg)
    except BaseException:
        for path in Layout(cfg.output).temp_files():  # workers are stopped by now
            path.unlink(missing_ok=True)
        raise


def data_run(config_path: str | None, flags: dict[str, Any], overrides: list[str]) -> dict:
    """`lmforge data run`: the config file, then flags, then `--set`; runs and summarizes."""
    cfg = load_pipeline_config(config_path, flags, overrides)
    stats = run_pipeline(cfg)
    print(
        f"data: {stats['documents_in']:,} documents in, {stats['documents_out']:,} out "
        f"in {stats['shards']} shard(s); summary: {Path(cfg.output) / 'summary.md'}"
    )
    return stats


def read_texts(paths: list[str]) -> list[str]:
    """Every document's text under `paths` (any format the pipeline reads)."""
    cfg = ReadConfig()
    stats = StepStats("read")
    listed = list_units(paths)
    require_all(input_needs(listed))
    units = [u for shard in plan_shards(listed, cfg.shard_bytes) for u in shard]
    return [doc.text for doc in read_shard(units, cfg, stats)]


def train_classifier_files(positive: list[str], negative: list[str], out: str) -> Path:
    """`lmforge data train-classifier`: fit on documents at the two path lists, save to `out`."""
    from lmforge.data.classifier import train_classifier

    pos, neg = read_texts(positive), read_texts(negative)
    if not pos or not neg:
        which = "--positive" if not pos else "--negative"
        raise LmforgeError(f"{which} holds no readable documents: pass files with text")
    model = train_classifier(pos, neg)
    model.save(out)
    print(f"classifier: trained on {len(pos):,} positive / {len(neg):,} negative, saved to {out}")
    return Path(out)
