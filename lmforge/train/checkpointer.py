"""A run's checkpoints as one component: where they go, when they are due, and resuming.

Every command that trains (pretraining, SFT, GRPO) saves and resumes through a `Checkpointer`:
`checkpoints/step_N/` under the run folder, written atomically (train/checkpoint.py), the newest
`keep_last` kept, every `every` steps and at the end. On many processes each rank writes its
shards (checkpoint_dcp.py); a run resumes a checkpoint written by the same kind of run.
A save on a full disk stops the run with one line naming the checkpoint it can resume from.
"""

from __future__ import annotations

from pathlib import Path

import torch

from lmforge.atomic import disk_full_is_an_error
from lmforge.errors import LmforgeError
from lmforge.model import Transformer
from lmforge.parallel.world import World
from lmforge.train.checkpoint import (
    load_model_weights,
    load_training_state,
    save_checkpoint,
    save_sharded_checkpoint,
)
from lmforge.train.checkpoint_dir import STEP_PREFIX, is_distributed, list_checkpoints


class Checkpointer:
    def __init__(
        self,
        run_dir: str | Path,
        world: World,
        run_config: dict,
        tokenizer_dir: str | Path | None,
        every: int = 0,
        keep_last: int = 2,
    ) -> None:
        self.dir = Path(run_dir) / "checkpoints"
        self.world, self.run_config, self.tokenizer_dir = world, run_config, tokenizer_dir
        self.every, self.keep_last = every, keep_last
        self.latest: Path | None = None  # the newest checkpoint, once saved or resumed from
        self.last_good: Path | None = None  # the newest one saved after a finite step

    def due(self, step: int) -> bool:
        return bool(self.every) and step % self.every == 0

    def find(self) -> Path | None:
        """The newest complete checkpoint in the run folder, if any."""
        found = list_checkpoints(self.dir)
        return found[-1] if found else None

    def restore(
        self, path: Path, model: Transformer, optimizer: torch.optim.Optimizer
    ) -> tuple[dict, dict]:
        """Load `path` into `model` and `optimizer` (and the RNGs); return (trainer_state,
        loader_state). A single process loads a checkpoint of any layout; many processes
        need one they wrote (per-rank shards, resharded on load)."""
        if is_distributed(path):
            from lmforge.train.checkpoint_dcp import load_distributed

            layout = self.world.layout
            load_distributed(path, model, optimizer, self.world.data_rank, layout.data_parallel)
            state, loader_state = load_training_state(path, None)
        elif self.world.is_distributed:
            raise LmforgeError(
                f"checkpoint {path} was written by a single process: resume it without "
                "--parallel, or start over with --fresh"
            )
        else:
            load_model_weights(model, path)
            state, loader_state = load_training_state(path, optimizer)
        self.latest = self.last_good = path
        return state, loader_state

    def save(
        self,
        step: int,
        model: Transformer,
        optimizer: torch.optim.Optimizer,
        trainer_state: dict,
        loader_state: dict,
        good: bool = True,
    ) -> Path:
        """Write `step_N/` (every rank must call this on many processes); `good`: the step
        that led here was finite, so a diverged run can point back to it."""
        args = (step, model, optimizer, trainer_state, loader_state, self.run_config)
        target = self.dir / f"{STEP_PREFIX}{step}"
        with disk_full_is_an_error("checkpoint", target, self._disk_fix()):
            if self.world.is_distributed:
                path = save_sharded_checkpoint(
                    self.world, self.dir, *args, self.tokenizer_dir, self.keep_last
                )
            else:
                path = save_checkpoint(self.dir, *args, self.tokenizer_dir, self.keep_last)
        self.latest = path
        if good:
            self.last_good = path
        return path

    def _disk_fix(self) -> str:
        """What to do when a save finds the disk full: the run resumes from `latest`."""
        then = (
            f"resumes from {self.latest}, which is intact"
            if self.latest is not None
            else "starts over (no checkpoint was saved before this one)"
        )
        return (
            "free space on that disk (or move the run folder to a larger one), then run the "
            f"same command again: it {then}"
        )
