"""How a step list runs: passes over the shards, the files between them, and one shard's task.

Per-document steps run back to back in one pass over a shard. A global step (deduplication)
splits the work: the pass before it collects its keys, the driver decides once over all shards,
and the next pass applies the decision before the following steps. So `n` global steps make
`n + 1` passes. Every task (pass, shard) writes its documents, keys and stats, then a completion
marker; a rerun skips every task whose marker exists, which makes a crashed run resumable. A
shard that finds the disk full stops the run with one line, its finished tasks kept.

    OUT/shard_00000.jsonl.zst ...        the final documents, one shard per input shard
    OUT/.work/shards.json                 the input shard plan (fixed at the first run)
    OUT/.work/pass_P/shard_S.jsonl       documents after pass P (input of pass P + 1)
    OUT/.work/pass_P/keys_S.npz          keys of the global step that follows pass P
    OUT/.work/pass_P/decision_S.npz      its decision for shard S
    OUT/.work/pass_P/stats_S.json, done_S
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lmforge.atomic import disk_full_is_an_error, write_text
from lmforge.data.pipeline.registry import STEPS
from lmforge.data.pipeline.step import GlobalStep
from lmforge.data.pipeline.writers import read_shard_file, shard_name, write_shard
from lmforge.data.readers import Unit, read_shard
from lmforge.data.stats import StepStats

DISK_FULL_FIX = (
    "free space on that disk, then run the same command again: it keeps the shards finished "
    "so far and resumes after them"
)


@dataclass(frozen=True)
class Pass:
    index: int
    apply: str | None  # the global step whose decision this pass applies first
    steps: tuple[str, ...]  # per-document steps
    collect: str | None  # the global step whose keys this pass collects last
    last: bool


def plan_passes(steps: list[str]) -> list[Pass]:
    passes: list[Pass] = []
    apply, run = None, []
    for name in steps:
        if issubclass(STEPS[name], GlobalStep):
            passes.append(Pass(len(passes), apply, tuple(run), name, False))
            apply, run = name, []
        else:
            run.append(name)
    passes.append(Pass(len(passes), apply, tuple(run), None, True))
    return passes


class Layout:
    """Paths of one pipeline run's files under its output folder."""

    def __init__(self, output: str | Path) -> None:
        self.out = Path(output)
        self.work = self.out / ".work"

    def pass_dir(self, p: int) -> Path:
        return self.work / f"pass_{p}"

    def docs(self, p: int, s: int) -> Path:
        return self.pass_dir(p) / f"shard_{s:05d}.jsonl"

    def keys(self, p: int, s: int) -> Path:
        return self.pass_dir(p) / f"keys_{s:05d}.npz"

    def decision(self, p: int, s: int) -> Path:
        return self.pass_dir(p) / f"decision_{s:05d}.npz"

    def decided(self, p: int) -> Path:
        return self.pass_dir(p) / "decided.json"

    def stats(self, p: int, s: int) -> Path:
        return self.pass_dir(p) / f"stats_{s:05d}.json"

    def done(self, p: int, s: int) -> Path:
        return self.pass_dir(p) / f"done_{s:05d}"

    def final(self, s: int, fmt: str) -> Path:
        return self.out / shard_name(s, fmt)

    def temp_files(self) -> list[Path]:
        """The temporary files a run may leave when killed mid-write (only names it writes)."""
        names = ("shard_*.tmp", ".pipeline.json.*.tmp", ".stats.json.*.tmp", ".summary.md.*.tmp")
        found = [p for name in names for p in self.out.glob(name)]
        if self.work.is_dir():
            found += [p for p in self.work.rglob("*") if ".tmp" in p.name and p.is_file()]
        return sorted(set(found))


def write_json(path: Path, obj: Any) -> None:
    """`obj` as JSON, non-ASCII kept as is (what `atomic.write_json` would escape)."""
    write_text(path, json.dumps(obj, indent=1, ensure_ascii=False) + "\n")


def save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    tmp = path.with_name(path.stem + ".tmp.npz")
    try:
        np.savez(tmp, **arrays)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {key: data[key] for key in data.files}


_QUEUE = None  # where a worker process reports progress; set by the executor


def set_progress_queue(queue) -> None:
    global _QUEUE
    _QUEUE = queue


def run_task(task: dict) -> dict:
    """Run pass `task["pass"]` on shard `task["shard"]`; returns the stats it wrote."""
    from lmforge.data.pipeline.config import PipelineConfig

    cfg = PipelineConfig.from_dict(task["config"])
    layout = Layout(cfg.output)
    p = plan_passes(cfg.steps)[task["pass"]]
    s = task["shard"]
    queue = _QUEUE

    def report(name: str, docs: int, nbytes: int) -> None:
        if queue is not None:
            queue.put((name, docs, nbytes))

    stats: list[StepStats] = []
    if p.index == 0:
        read = StepStats("read")
        docs = read_shard([Unit(*u) for u in task["units"]], cfg.read, read)
        stats.append(read)
    else:
        docs = read_shard_file(layout.docs(p.index - 1, s))
    if p.apply:
        step = STEPS[p.apply](cfg.step_config[p.apply])
        applier = step.applying(load_arrays(layout.decision(p.index - 1, s)))
        applier.progress = report
        docs = applier(docs)
        stats.append(step.stats)
    for name in p.steps:
        step = STEPS[name](cfg.step_config[name])
        step.progress = report
        docs = step(docs)
        stats.append(step.stats)
    keys: list[Any] = []
    collector = None
    if p.collect:
        collector = STEPS[p.collect](cfg.step_config[p.collect])
        docs = collector.collect(docs, keys)
    target, fmt = (
        (layout.final(s, cfg.write.format), cfg.write.format)
        if p.last
        else (layout.docs(p.index, s), "jsonl")
    )
    with disk_full_is_an_error("shard", target, DISK_FULL_FIX):
        write_shard(target, docs, fmt)
    if collector is not None:
        path = layout.keys(p.index, s)
        with disk_full_is_an_error("deduplication keys", path, DISK_FULL_FIX):
            save_arrays(path, collector.pack(keys))
        stats.append(collector.stats)
    result = {"pass": p.index, "shard": s, "stats": [st.to_dict() for st in stats]}
    with disk_full_is_an_error("task stats", layout.stats(p.index, s), DISK_FULL_FIX):
        write_json(layout.stats(p.index, s), result)
        layout.done(p.index, s).touch()
    return result
