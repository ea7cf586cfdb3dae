"""Where the training loop's batches come from: random windows or the sequential loader.

`random` (the default) draws windows at offsets that are a pure function of (seed, step,
micro-step), so resuming needs no state. `sequential` walks the shards in a seeded order that
reshuffles every epoch, with a background thread reading ahead (tokens/loader.py); its position
goes into the checkpoint's `loader_state.json`.

`batch_size` is always the global batch. On many processes, data-parallel rank r of n takes
rows [r·b/n, (r+1)·b/n) of exactly the batch one process would see, so the data order does not
depend on the parallel layout.
"""

from __future__ import annotations

from pathlib import Path

import torch

from lmforge.errors import LmforgeError
from lmforge.tokens import WindowSampler, load_doc_starts, load_tokens
from lmforge.tokens.loader import DataSource, TokenLoader
from lmforge.train.config import LOADERS


class RandomBatches:
    def __init__(
        self,
        shard_dir: str | Path,
        batch_size: int,
        seq_len: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        segments: bool = False,
    ) -> None:
        tokens = load_tokens(shard_dir, "train")
        doc_starts = load_doc_starts(shard_dir, "train") if segments else None
        self.sampler = WindowSampler(tokens, batch_size, seq_len, seed, doc_starts)
        rows = batch_size // world_size
        self.rows = slice(rank * rows, (rank + 1) * rows)

    def next(self, step: int, micro_step: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        return tuple(t[self.rows] for t in self.sampler.batch(step, micro_step, device))

    def state_dict(self) -> dict:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        _check_kind(state, self.state_dict()["kind"])

    def log_fields(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


class SequentialBatches:
    def __init__(
        self,
        shard_dir: str | Path,
        batch_size: int,
        seq_len: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        segments: bool = False,
    ) -> None:
        self.loader = TokenLoader(
            [DataSource(shard_dir, "train")],
            batch_size,
            seq_len,
            seed,
            rank=rank,
            world_size=world_size,
            segments=segments,
        )

    def next(self, step: int, micro_step: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        return self.loader.next_batch(device)

    def state_dict(self) -> dict:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        _check_kind(state, self.state_dict()["kind"])
        self.loader.load_state_dict(state)

    def log_fields(self) -> dict[str, float]:
        mixture = self.loader.mixture()
        return {f"mix/{k}": round(v, 4) for k, v in mixture.items()} if len(mixture) > 1 else {}

    def close(self) -> None:
        self.loader.close()


Batches = RandomBatches | SequentialBatches


def make_batches(
    kind: str,
    shard_dir: str | Path,
    batch_size: int,
    seq_len: int,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
    segments: bool = False,
) -> Batches:
    """This data-parallel `rank`'s share of every global batch of `batch_size` rows; with
    `segments`, each batch also carries its rows' document numbers (train.loader.document_mask)."""
    if kind not in LOADERS:
        raise LmforgeError(
            f"unknown train.loader.kind {kind!r}: choose one of {', '.join(LOADERS)}"
        )
    cls = RandomBatches if kind == "random" else SequentialBatches
    return cls(shard_dir, batch_size, seq_len, seed, rank, world_size, segments)


def _check_kind(state: dict, kind: str) -> None:
    if state.get("kind") != kind:
        raise LmforgeError(
            f"the checkpoint's loader state is {state.get('kind')!r} but this run uses {kind!r}: "
            "resume with the same train.loader.kind, or start over with --fresh"
        )
