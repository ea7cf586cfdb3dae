"""The stages of a pretraining run, as functions that compose, and how a run's end is told.

    prepare → size → pretrain                                   `lmforge train` (train_run)
    prepare → size → pretrain → evaluate → sample → report      the speedrun (speedrun.py)

`prepare` validates the settings, claims the run folder (`RunDir`) and makes the token shards
(under torchrun rank 0 prepares while the others wait: `prepare_once`); `size` picks the shape
the time budget buys (recipe/sizing.py); `pretrain` trains on them. Sizing and training spend
the command's one `BudgetClock`; the data preparation, done once and cached, runs inside
`clock.excluded()`. `ending` maps how training ended to the command's message and exit status,
for every command that trains (`command_status`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from lmforge.atomic import write_text
from lmforge.budget_clock import BudgetClock
from lmforge.config import RUN_FOLDER, RunConfig, to_dict
from lmforge.errors import LmforgeError
from lmforge.parallel.world import world_size_from_env
from lmforge.prepare import Prepared, prepare_corpus
from lmforge.recipe.sizing import Sizing, size_run
from lmforge.run_dir import RunDir
from lmforge.threads import requested_threads
from lmforge.train import TrainResult, train
from lmforge.train.checkpoint_dir import TRAINED_ON, data_record
from lmforge.train.data import require_val_shard
from lmforge.train.signals import exit_status, stopped_message

PREPARE_WAIT_S = 3 * 3600  # under torchrun, how long the other ranks wait for rank 0's data


@dataclass
class Data:
    """The token shards a run trains on, and where they came from."""

    shard_dir: Path
    documents: str | None  # what they were made from ("stdlib", a path); None: given ready-made
    prepared: Prepared | None = None  # the preparation (its folder and statistics), if any


@dataclass(frozen=True)
class Ending:
    """How a run's training ended: what the command says and the status it exits with."""

    how: str  # "finished" or "interrupted"
    exit_status: int  # 0, or 128 + the signal that stopped it (130 Ctrl-C, 143 SIGTERM)
    message: str  # for stderr when the run did not finish ("" when it did)


class Trained(Protocol):
    """What every trainer returns (pretraining's and SFT's TrainResult, GRPO's RlResult)."""

    step: int
    checkpoint: Path
    interrupted: bool
    stop_signal: str | None


def ending(result: Trained) -> Ending:
    """How `result`'s training ended, and what the command then exits with:

    - finished: its steps taken, or its time budget spent (a budgeted run ends on the last
      step its budget holds, decayed): 0;
    - interrupted: Ctrl-C or SIGTERM (or another rank's stop request) checkpointed first:
      128 + the signal, so `lmforge train && lmforge export` stops there;
    - diverged: `max_bad_steps` non-finite steps in a row; the loop raises
      `lmforge.train.guard.Diverged` (a one-line LmforgeError naming the last good checkpoint)
      instead of returning, which the CLI prints and exits 2 with, as for every user error.
    """
    if result.interrupted:
        message = stopped_message(result.stop_signal, result.step, result.checkpoint)
        return Ending("interrupted", exit_status(result.stop_signal), message)
    return Ending("finished", 0, "")


def command_status(result: Trained) -> int:
    """The exit status of a command whose training ended as `result` (`ending`); a run that
    did not finish says why on stderr, once (rank 0's line under torchrun)."""
    ended = ending(result)
    if ended.message and is_rank_zero():
        print(ended.message, file=sys.stderr)
    return ended.exit_status


def train_run(
    cfg: RunConfig,
    out: str | Path,
    fresh: bool = False,
    shard_dir: str | Path | None = None,
    threads: int | None = None,
    clock: BudgetClock | None = None,
) -> TrainResult:
    """`lmforge train`: prepare → size → pretrain into `out`, on `shard_dir` or on `cfg.data`
    prepared first (the built-in corpus into a cache shared by runs with the same data and
    tokenizer settings). `clock` is the command's budget (default: one started now)."""
    clock = clock or BudgetClock()
    out = Path(out)
    data = prepare(cfg, out, fresh, threads, shard_dir, cached=True, clock=clock)
    cfg, sizing = size(cfg, data, out, threads, clock)
    return pretrain(cfg, data, out, clock, sizing, threads)


def prepare(
    cfg: RunConfig,
    out: Path,
    fresh: bool = False,
    threads: int | None = None,
    shard_dir: str | Path | None = None,
    cached: bool = False,
    clock: BudgetClock | None = None,
) -> Data:
    """Check the settings, claim the run folder `out` and prepare `cfg.data` into it (`cached`:
    the built-in corpus into `cache_root` instead), or take the ready-made `shard_dir`.

    Bad settings (and a bad `threads` count) fail before any work. The preparation runs inside
    `clock.excluded()`: it is done once and cached, so no budget holds it."""
    cfg.validate()
    requested_threads(threads)
    with clock.excluded() if clock else contextlib.nullcontext():
        if shard_dir is not None:
            require_val_shard(shard_dir)
            if _rank() == 0:  # under torchrun, rank 0 alone claims the folder
                RunDir(out, RUN_FOLDER).claim(cfg, fresh)
            return Data(Path(shard_dir), None)
        root = cache_root(cfg) if cached and not cfg.data.path else out
        prepared = prepare_once(cfg, out, fresh, root)
        return Data(prepared.shard_dir, cfg.data.path or "stdlib", prepared)


def size(
    cfg: RunConfig, data: Data, out: Path, threads: int | None, clock: BudgetClock
) -> tuple[RunConfig, Sizing | None]:
    """`cfg` at the shape its time budget buys on this machine, and why (recipe/sizing.py);
    `cfg` itself, and None, for a run that is not sized."""
    return size_run(cfg, data.shard_dir, out, requested_threads(threads)[0], clock)


def pretrain(
    cfg: RunConfig,
    data: Data,
    out: Path,
    clock: BudgetClock,
    sizing: Sizing | None = None,
    threads: int | None = None,
) -> TrainResult:
    """Train `cfg` on `data` into `out` (resuming the run there), spending `clock`'s budget;
    at `threads` CPU threads, else at the count the sizing chose, else at a trial's. The run
    records the config it trained with and the data it trained on. Under torchrun every rank
    calls this."""
    result = train(
        cfg.model,
        cfg.train,
        data.shard_dir,
        out,
        run_config={**to_dict(cfg), TRAINED_ON: data_record(data.shard_dir, data.documents)},
        threads=threads or (sizing.threads if sizing else None),
        score_tasks=_task_scorer(cfg, data),
        clock=clock,
    )
    if data.prepared is not None:
        _drop_ready_marker(data.prepared.root)  # every rank read it: they all trained together
    return result


def cache_root(cfg: RunConfig) -> Path:
    """Where `lmforge train` without --data keeps the prepared built-in corpus, per settings."""
    base = Path(os.environ.get("LMFORGE_CACHE", Path.home() / ".cache" / "lmforge"))
    key = json.dumps([to_dict(cfg)["data"], to_dict(cfg)["tokenizer"], sys.version], sort_keys=True)
    return base / "prepared" / hashlib.sha256(key.encode()).hexdigest()[:16]


def prepare_once(cfg: RunConfig, out: Path, fresh: bool, root: Path) -> Prepared:
    """Claim the run folder and prepare `cfg.data` into `root` (or reuse it there).

    Under torchrun, rank 0 alone claims and prepares while the other ranks wait for its
    marker file (the process group is not up yet: training starts it), then read the same
    prepared folder; a failure on rank 0 is written into the marker so the others stop too.
    """
    if world_size_from_env() == 1:
        RunDir(out, RUN_FOLDER).claim(cfg, fresh)
        return prepare_corpus(cfg.data, cfg.tokenizer, root)
    marker = _ready_marker(root)
    if _rank() == 0:
        try:
            RunDir(out, RUN_FOLDER).claim(cfg, fresh)
            prepared = prepare_corpus(cfg.data, cfg.tokenizer, root)
        except BaseException as e:
            write_text(marker, f"failed: {type(e).__name__}: {e}")
            raise
        write_text(marker, "ready")
        return prepared
    deadline = time.monotonic() + PREPARE_WAIT_S
    while not marker.is_file():
        if time.monotonic() > deadline:
            raise LmforgeError(
                f"rank {_rank()}: rank 0 did not prepare the data in {root} within "
                f"{PREPARE_WAIT_S} s: check rank 0's output, or prepare it first with one process"
            )
        time.sleep(0.2)
    state = marker.read_text()
    if state != "ready":
        raise LmforgeError(f"rank {_rank()}: rank 0 could not prepare the data ({state})")
    return Prepared(root, json.loads((root / "data" / "stats.json").read_text()))


def is_rank_zero() -> bool:
    """Whether this process writes what one process writes: the only one, or torchrun's rank 0."""
    return _rank() == 0


def _task_scorer(cfg: RunConfig, data: Data):
    """`train.eval.tasks` as the callback `train` scores its model with (eval/periodic.py)."""
    names = [n.strip() for n in cfg.train.eval.tasks.split(",") if n.strip()]
    if not names:
        return None
    from lmforge.eval.periodic import task_evaluator
    from lmforge.eval.run_tasks import RunDocuments

    run_docs = RunDocuments(data.documents, cfg.data.val_fraction) if data.documents else None
    return task_evaluator(names, run_docs, data.shard_dir / "tokenizer")


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _ready_marker(root: Path) -> Path:
    """This launch's marker: torchrun's run id (or the rendezvous address) names it, so a
    marker left by an earlier launch is never mistaken for this one's."""
    launch = os.environ.get("TORCHELASTIC_RUN_ID") or "{}-{}".format(
        os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    )
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in launch)
    return root / f".prepared-{safe}"


def _drop_ready_marker(root: Path) -> None:
    if world_size_from_env() > 1 and _rank() == 0:
        _ready_marker(root).unlink(missing_ok=True)
