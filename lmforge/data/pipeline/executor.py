"""Executors: the shared driver that runs a pipeline's passes, and the local process pool.

`Executor.run` is the whole driver: it fixes the shard plan, runs each pass's unfinished tasks
through `map`, lets each global step decide between passes, merges the stats and writes the
summary. A subclass only says how tasks run (`map`) and whether workers report live progress;
`LocalExecutor` runs them in this process or a pool of worker processes, `RayExecutor` as Ray
tasks. Results do not depend on the executor or the number of workers.
"""

from __future__ import annotations

import multiprocessing
import os
import queue as queue_module
import shutil
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator

from lmforge.data.pipeline.config import PipelineConfig
from lmforge.data.pipeline.passes import (
    Layout,
    load_arrays,
    plan_passes,
    run_task,
    save_arrays,
    set_progress_queue,
    write_json,
)
from lmforge.data.pipeline.registry import STEPS
from lmforge.data.pipeline.summary import finish_run, load_finished
from lmforge.data.readers import list_units, plan_shards
from lmforge.progress import bar


class Executor(ABC):
    live_progress = False  # whether workers stream progress through `self.queue`

    def __init__(self, workers: int = 1) -> None:
        self.workers = workers or os.cpu_count() or 1
        self.queue = None

    @abstractmethod
    def map(self, fn: Callable[[dict], dict], tasks: list[dict]) -> Iterator[dict]:
        """Run `fn` on every task, yielding results as they complete (in any order)."""

    def close(self) -> None:  # noqa: B027 - most executors hold nothing to release
        """Release workers."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(self, cfg: PipelineConfig) -> dict:
        """Run (or resume, or reuse) the pipeline `cfg`; returns the stats written to stats.json."""
        layout = Layout(cfg.output)
        finished = load_finished(layout, cfg)
        if finished is not None:
            print(f"data: reusing the finished run in {cfg.output}")
            return finished
        shards = _shard_plan(layout, cfg)
        config = cfg.to_dict()
        passes = plan_passes(cfg.steps)
        results: list[dict] = []
        board = ProgressBoard(["read", *cfg.steps])
        with board.draining(self.queue if self.live_progress else None):
            for p in passes:
                todo = []
                for s, units in enumerate(shards):
                    if layout.done(p.index, s).exists():
                        results.append(_read_json(layout.stats(p.index, s)))
                    else:
                        todo.append({"config": config, "pass": p.index, "shard": s, "units": units})
                for result in self.map(run_task, todo):
                    results.append(result)
                    if not self.live_progress:
                        board.from_stats(result["stats"])
                if p.collect:
                    results.append(_decide(layout, cfg, p.index, p.collect, len(shards)))
                if p.index > 0:
                    for s in range(len(shards)):
                        layout.docs(p.index - 1, s).unlink(missing_ok=True)
        stats = finish_run(layout, cfg, results, len(shards))
        shutil.rmtree(layout.work, ignore_errors=True)
        return stats


def _shard_plan(layout: Layout, cfg: PipelineConfig) -> list[list]:
    path = layout.work / "shards.json"
    if path.exists():
        return _read_json(path)
    units = list_units(cfg.input)
    shards = [
        [[u.kind, u.path, u.size, u.name] for u in shard]
        for shard in plan_shards(units, cfg.read.shard_bytes)
    ]
    write_json(path, shards)
    return shards


def _decide(layout: Layout, cfg: PipelineConfig, p: int, name: str, n_shards: int) -> dict:
    """Run (or reuse) global step `name`'s decision over the keys pass `p` collected."""
    path = layout.decided(p)
    if path.exists():
        return _read_json(path)
    step = STEPS[name](cfg.step_config[name])
    start = time.perf_counter()
    decisions = step.decide([load_arrays(layout.keys(p, s)) for s in range(n_shards)])
    for s, decision in enumerate(decisions):
        save_arrays(layout.decision(p, s), decision)
    step.stats.seconds += time.perf_counter() - start
    result = {"pass": p, "shard": -1, "stats": [step.stats.to_dict()]}
    write_json(path, result)
    return result


def _read_json(path):
    import json

    return json.loads(path.read_text())


class ProgressBoard:
    """One progress bar per step (documents, docs/s, MB/s), fed by workers or finished tasks."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.bars: dict = {}
        self.bytes: dict[str, int] = {}

    def update(self, name: str, docs: int, nbytes: int) -> None:
        if name not in self.bars:
            position = self.names.index(name) if name in self.names else len(self.bars)
            self.bars[name] = bar(desc=f"{name:>14}", unit="doc", position=position)
            self.bytes[name] = 0
        progress = self.bars[name]
        self.bytes[name] += nbytes
        elapsed = progress.format_dict.get("elapsed") or 1e-9
        progress.set_postfix_str(f"{self.bytes[name] / 1e6 / elapsed:.1f} MB/s", refresh=False)
        progress.update(docs)

    def from_stats(self, stats: list[dict]) -> None:
        for s in stats:
            if s["docs_in"]:
                self.update(s["name"], s["docs_in"], s["bytes_in"])

    def draining(self, source) -> _Drain:
        return _Drain(self, source)

    def close(self) -> None:
        for progress in self.bars.values():
            progress.close()


class _Drain:
    """Moves progress messages from a queue to the board on a thread while the run lasts."""

    def __init__(self, board: ProgressBoard, source) -> None:
        self.board, self.source = board, source
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> _Drain:
        if self.source is not None:
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.source is not None:
            self.stop.set()
            self.thread.join()
        self.board.close()

    def _loop(self) -> None:
        while True:
            try:
                self.board.update(*self.source.get(timeout=0.1))
            except queue_module.Empty:
                if self.stop.is_set():
                    return
            except (EOFError, OSError):
                return


class LocalExecutor(Executor):
    """Tasks in this process (`workers=1`) or in a pool of worker processes."""

    live_progress = True

    def __init__(self, workers: int = 1) -> None:
        super().__init__(workers)
        self.pool = None
        if self.workers > 1:
            ctx = multiprocessing.get_context("spawn")
            self.queue = ctx.Queue()
            self.pool = ctx.Pool(
                self.workers, initializer=set_progress_queue, initargs=(self.queue,)
            )
        else:
            self.queue = queue_module.Queue()

    def map(self, fn: Callable[[dict], dict], tasks: list[dict]) -> Iterator[dict]:
        if self.pool is None:
            set_progress_queue(self.queue)
            try:
                yield from map(fn, tasks)
            finally:
                set_progress_queue(None)
            return
        yield from self.pool.imap_unordered(fn, tasks)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
            self.pool = None
