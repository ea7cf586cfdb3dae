"""SIGKILL at random moments: a command run to its end through kills, and the check that what a
killed process left is whole wherever a reader looks.

The killed-run tests of pretraining (tests/train/test_robustness.py), SFT and GRPO
(tests/posttrain/), the data pipeline and tokenizing (tests/data/test_killed_runs.py) kill
their command `KILLS` times each, at moments drawn from a generator seeded with `SEED` and the
test's name, then let it finish and compare its result with an uninterrupted run's (metrics
and final weights; shards byte for byte). After every kill, each file under a final name must
read whole. `make test` kills each once; the full run, 5 kills in each of the 5 commands:

    LMFORGE_KILLS=5 pytest -p no:xdist -s tests -k killed

prints one `killed runs:` line per command (kills made, when, resumes, results identical).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tests import forked

KILLS = int(os.environ.get("LMFORGE_KILLS", "1"))
SEED = int(os.environ.get("LMFORGE_KILL_SEED", "0"))
DEADLINE_S = 300  # for one attempt, a generous bound on a loaded machine: a hang fails


def kill_rng(name: str) -> random.Random:
    """The moments' generator of one test: `SEED` and the test's name."""
    return random.Random(f"{SEED}:{name}")


@dataclass
class Attempt:
    """One start of the command: killed `after_s` seconds after it was ready, or finished."""

    killed: bool
    after_s: float
    stdout: str
    progress: int | None = None  # what `progress` said when it was killed


@dataclass
class KillLog:
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def kills(self) -> int:
        return sum(a.killed for a in self.attempts)

    def summary(self, name: str, identical: bool) -> str:
        killed = [a for a in self.attempts if a.killed]
        moments = ", ".join(f"{a.after_s:.2f}" for a in killed)
        where = ""
        if killed and killed[0].progress is not None:
            where = f"; newest checkpoint when killed: {', '.join(str(a.progress) for a in killed)}"
        line = (
            f"killed runs: {name}: {self.kills} kills (at {moments} s after each start was "
            f"ready{where}), {len(self.attempts) - 1} resumes, identical to an uninterrupted "
            f"run: {identical}"
        )
        print(line)
        return line


def env() -> dict[str, str]:
    return {**os.environ, "LMFORGE_PROGRESS": "0", "OMP_NUM_THREADS": "1"}


def lmforge(*args: str) -> list[str]:
    return [sys.executable, "-m", "lmforge", *args]


def newest_write(folder: Path) -> float:
    """The newest modification time of anything under `folder` (0 when there is nothing)."""
    times = []
    # os.walk skips a folder that vanishes while it walks (a temporary renamed); rglob raises
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            with contextlib.suppress(FileNotFoundError):
                times.append(os.stat(os.path.join(root, name)).st_mtime)
    return max(times, default=0.0)


def newest_checkpoint(run: Path) -> int:
    """The step of the newest complete checkpoint in `run` (0 when there is none)."""
    from lmforge.train.checkpoint_dir import list_checkpoints

    found = list_checkpoints(run / "checkpoints")
    return int(found[-1].name.removeprefix("step_")) if found else 0


def run_through_kills(
    command: list[str],
    folder: Path,
    kills: int,
    spread_s: float,
    rng: random.Random,
    check: Callable[[], None],
    progress: Callable[[], int] | None = None,
    reset: Callable[[], None] | None = None,
) -> KillLog:
    """Run `command` until it exits 0, SIGKILLing it (its whole process group) `kills` times.

    Each start waits until it is ready, then a moment drawn from [0, `spread_s`). Ready: with
    `progress` (say, the newest checkpoint's step), once it has grown since the start, so each
    kill lands further into the run than the one before; without, once the process wrote under
    `folder` (its imports behind it). A start that finishes first is not killed and ends the
    run (its callers give a spread under their command's length). A first start that finished
    before its moment (a machine faster than when the spread was measured) is undone by
    `reset`, when given, and tried again with half the spread, so at least one kill lands.
    After each kill `check()` looks at what was left."""
    log = KillLog()
    out_dir = folder.parent / f".{folder.name}.logs"
    out_dir.mkdir(parents=True, exist_ok=True)
    while True:
        n = len(log.attempts)
        stdout, stderr = out_dir / f"{n}.out", out_dir / f"{n}.err"
        started = time.time() - 1.0  # mtimes are coarse on some file systems
        before = progress() if progress is not None else 0
        proc = forked.start(command, env(), stdout, stderr, new_session=True)

        killed, after = False, 0.0
        if log.kills < kills:
            deadline = time.monotonic() + DEADLINE_S
            while proc.poll() is None and not _ready(progress, before, folder, started):
                assert time.monotonic() < deadline, f"attempt {n} never got ready: {command}"
                time.sleep(0.01)
            after = rng.uniform(0, spread_s)
            end = time.monotonic() + after
            while proc.poll() is None and time.monotonic() < end:
                time.sleep(0.005)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                killed = True
        code = proc.wait(timeout=DEADLINE_S)
        at = progress() if killed and progress is not None else None
        log.attempts.append(Attempt(killed, after, stdout.read_text(), at))
        if killed:
            assert code == -signal.SIGKILL, (code, stderr.read_text()[-3000:])
            check()
            continue
        assert code == 0, stderr.read_text()[-3000:]
        if log.kills == 0 and kills and reset is not None and len(log.attempts) < 5:
            reset()
            log.attempts.clear()
            spread_s /= 2
            continue
        return log


def _ready(progress: Callable[[], int] | None, before: int, folder: Path, started: float) -> bool:
    if progress is not None:
        return progress() > before
    return newest_write(folder) >= started


def timed_run(
    command: list[str] | Callable[[], None],
    folder: Path,
    progress: Callable[[], int] | None = None,
) -> float:
    """Run `command` uninterrupted (a command line, or a function run in this process: no
    start-up to wait for). Seconds from its first write under `folder` to its end; with
    `progress`, the median seconds between two of its values (one checkpoint interval: what a
    kill drawn after a new checkpoint should spread over)."""
    first, changes, last = None, [], 0
    done = threading.Event()

    def watch() -> None:
        nonlocal first, last
        while not done.is_set():
            if first is None and folder.exists() and any(folder.iterdir()):
                first = time.monotonic()
            if progress is not None and progress() != last:
                changes.append(time.monotonic())
                last = progress()
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        if callable(command):
            command()
        else:
            output = folder.parent / f".{folder.name}.timed.log"
            code = forked.run(command, env(), output, DEADLINE_S)
            assert code == 0, output.read_text()[-3000:]
    finally:
        end = time.monotonic()
        done.set()
        watcher.join()
    if progress is not None:
        gaps = sorted(b - a for a, b in itertools.pairwise(changes))
        assert gaps, "the run made no progress twice"
        return gaps[len(gaps) // 2]
    return end - (first or end)


def _is_temporary(path: Path, root: Path) -> bool:
    """Named as a temporary: a dot name (`.x.123.tmp`, `.step_4.tmp/`) or `*.tmp` anywhere."""
    parts = path.relative_to(root).parts
    return any(p.startswith(".") or ".tmp" in p for p in parts)


def assert_whole(root: Path) -> list[Path]:
    """Every file under `root` not named as a temporary reads whole by its format; returns
    them. An append-only `.jsonl` log may end in the line a kill cut short, which its readers
    drop (train/metrics.py); any other line must parse."""
    import safetensors.torch
    import torch

    from lmforge.config import read_toml

    checked = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or _is_temporary(path, root):
            continue
        suffix, text = path.suffix, None
        if suffix in (".json", ".toml", ".jsonl", ".md", ".txt"):
            text = path.read_text(encoding="utf-8")
        if suffix == ".json":
            json.loads(text)
        elif suffix == ".toml":
            read_toml(path)
        elif suffix == ".jsonl":
            lines = text.split("\n")
            for line in lines[:-1]:
                json.loads(line)
            assert lines[-1] == "" or path.name == "metrics.jsonl", path
        elif suffix == ".safetensors":
            safetensors.torch.load_file(path)
        elif suffix == ".pt":
            torch.load(path, weights_only=True)
        elif suffix == ".npz":
            with np.load(path, allow_pickle=False) as data:
                [data[k] for k in data.files]
        elif suffix == ".zst":
            import zstandard

            zstandard.ZstdDecompressor().stream_reader(path.read_bytes()).read()
        checked.append(path)
    return checked


def kill_training_run(command: list[str], run: Path, spread_s: float, name: str) -> KillLog:
    """`run_through_kills` for a command that checkpoints into `run`: kills walk from one new
    checkpoint to the next, every checkpoint left must be whole, a too-fast start starts over."""
    return run_through_kills(
        command, run, KILLS, spread_s, kill_rng(name), lambda: assert_checkpoints_whole(run),
        progress=lambda: newest_checkpoint(run), reset=lambda: shutil.rmtree(run),
    )  # fmt: skip


def assert_checkpoints_whole(run: Path) -> None:
    """Every `checkpoints/step_N` folder is complete: a whole checkpoint or none at all."""
    from lmforge.train.checkpoint_dir import list_checkpoints

    folder = run / "checkpoints"
    named = sorted(p for p in folder.glob("step_*")) if folder.is_dir() else []
    assert sorted(list_checkpoints(folder)) == named
    expected = {"model.safetensors", "optimizer.pt", "trainer_state.pt", "config.json"}
    for checkpoint in named:
        assert expected <= {p.name for p in checkpoint.iterdir()}, checkpoint
    assert_whole(run)
