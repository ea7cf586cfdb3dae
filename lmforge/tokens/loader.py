"""The resumable training-data loader: blended token-shard datasets, data-parallel, prefetched.

Each dataset (a shard folder and split, with a weight) yields windows of `seq_len + 1` tokens in
a seeded order that reshuffles every epoch (`sequences.py`). Global batches of `batch_size`
windows are filled slot by slot from the datasets by weight (`blend.py`); rank r of
`world_size` takes the r-th contiguous slice of every global batch, so a run sees the same
sequences whatever its world size, only split differently between ranks. The state is the
global count of batches and of windows taken per dataset: identical on every rank, plain JSON,
and valid to resume under another world size.

How the training loop uses it:

    loader = TokenLoader(
        [DataSource(shard_dir, "train", weight=0.7), DataSource(code_dir, "train", weight=0.3)],
        batch_size=cfg.batch_size,      # global: each rank gets batch_size // world_size rows
        seq_len=cfg.seq_len,
        seed=cfg.seed,
        rank=rank, world_size=world_size,
    )
    if resuming:
        loader.load_state_dict(loader_state)            # from the checkpoint's loader_state.json
    for step ...:
        for micro in range(grad_accum_steps):
            x, y = loader.next_batch(device)            # (B/world, seq_len) int64 each
            ...
        if checkpointing:
            save(..., loader_state=loader.state_dict())  # the batches consumed, not prefetched
        if logging:
            record.update({f"mix/{k}": v for k, v in loader.mixture().items()})
    loader.close()                                      # or use it as a context manager

With `segments=True`, `next_batch` returns `(x, y, segments)`: per-token document numbers
(int32, (B/world, seq_len)) of the inputs from the shards' `.idx`; `segment_mask(segments)`
turns them into an attention mask that keeps attention within each document.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lmforge.errors import LmforgeError
from lmforge.tokens.blend import assign, normalized
from lmforge.tokens.prefetch import Prefetcher
from lmforge.tokens.sequences import SequenceOrder
from lmforge.tokens.shards import read_meta

STATE_KIND = "sequential"


@dataclass
class DataSource:
    """A dataset to draw from: shard `split` of `shard_dir`, blended with relative `weight`."""

    shard_dir: str | Path
    split: str = "train"
    weight: float = 1.0
    name: str = ""  # empty: "<folder name>/<split>"

    @property
    def label(self) -> str:
        return self.name or f"{Path(self.shard_dir).name}/{self.split}"


@dataclass
class _Position:
    batches: int
    taken: list[int]  # windows taken from each dataset, over all ranks


class TokenLoader:
    """Deterministic, resumable batches of windows from blended token-shard datasets."""

    def __init__(
        self,
        sources: list[DataSource],
        batch_size: int,
        seq_len: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        prefetch: int = 2,
        segments: bool = False,
        chunk_sequences: int = 1,
        pin_memory: bool | None = None,
    ) -> None:
        _check_layout(sources, batch_size, rank, world_size)
        self.sources = list(sources)
        self.batch_size, self.seq_len, self.seed = batch_size, seq_len, seed
        self.rank, self.world_size = rank, world_size
        self.local_batch_size = batch_size // world_size
        self.chunk_sequences = chunk_sequences
        self.segments = segments
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self._orders = [
            SequenceOrder(s.shard_dir, s.split, seq_len, seed, i, chunk_sequences)
            for i, s in enumerate(self.sources)
        ]
        self._weights = normalized([s.weight for s in self.sources])
        self._depth = prefetch
        self._prefetcher: Prefetcher | None = None
        self._position = _Position(0, [0] * len(self.sources))

    def next_batch(self, device: str | torch.device = "cpu") -> tuple[torch.Tensor, ...]:
        """This rank's next (inputs, targets), plus segment ids when built with segments=True."""
        if self._depth > 0:
            if self._prefetcher is None:
                self._prefetcher = Prefetcher(self._produce, self._position, self._depth)
            tensors, self._position = self._prefetcher.get()
        else:
            tensors, self._position = self._produce(self._position)
        device = torch.device(device)
        non_blocking = device.type == "cuda" and self.pin_memory
        return tuple(t.to(device, non_blocking=non_blocking) for t in tensors)

    def _produce(self, position: _Position) -> tuple[tuple[torch.Tensor, ...], _Position]:
        """The batch at `position` on this rank, as CPU tensors, and the position after it."""
        choice = assign(self._weights, position.taken, self.batch_size)
        cursors = np.empty(self.batch_size, dtype=np.int64)
        taken = list(position.taken)
        for d in range(len(self._orders)):
            slots = np.flatnonzero(choice == d)
            cursors[slots] = taken[d] + np.arange(len(slots))
            taken[d] += len(slots)
        lo = self.rank * self.local_batch_size
        local = slice(lo, lo + self.local_batch_size)
        choice, cursors = choice[local], cursors[local]
        windows = np.empty((self.local_batch_size, self.seq_len + 1), dtype=np.int64)
        segments = np.empty((self.local_batch_size, self.seq_len), dtype=np.int32)
        for d, order in enumerate(self._orders):
            rows = np.flatnonzero(choice == d)
            if len(rows) == 0:
                continue
            starts = order.window_starts(cursors[rows])
            windows[rows] = order.read(starts)
            if self.segments:
                segments[rows] = order.segments(starts)
        window = torch.from_numpy(windows)
        out = [window[:, :-1], window[:, 1:]]
        if self.segments:
            out.append(torch.from_numpy(segments))
        if self.pin_memory:
            out = [t.pin_memory() for t in out]
        return tuple(out), _Position(position.batches + 1, taken)

    def mixture(self) -> dict[str, float]:
        """Fraction of the sequences consumed so far (all ranks) that came from each dataset."""
        total = sum(self._position.taken)
        return {
            s.label: (n / total if total else 0.0)
            for s, n in zip(self.sources, self._position.taken, strict=True)
        }

    def epochs(self) -> dict[str, float]:
        """Passes made over each dataset so far (fractional)."""
        return {
            s.label: n / o.sequences
            for s, n, o in zip(self.sources, self._position.taken, self._orders, strict=True)
        }

    def state_dict(self) -> dict:
        """The position after the batches consumed so far, as plain JSON-serialisable data."""
        return {
            "kind": STATE_KIND,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "chunk_sequences": self.chunk_sequences,
            "datasets": [
                {"name": s.label, "weight": s.weight, "sequences": o.sequences}
                for s, o in zip(self.sources, self._orders, strict=True)
            ],
            "batches": self._position.batches,
            "taken": list(self._position.taken),
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly after the batches `state` records; drops anything prefetched."""
        expected = self.state_dict()
        keys = ("kind", "seed", "batch_size", "seq_len", "chunk_sequences", "datasets")
        for key in keys:
            if state.get(key) != expected[key]:
                raise LmforgeError(
                    f"loader state has {key}={state.get(key)!r} but this run has "
                    f"{expected[key]!r}: resume with the same data and batch settings, or --fresh"
                )
        self.close()
        self._position = _Position(int(state["batches"]), [int(n) for n in state["taken"]])

    def close(self) -> None:
        """Stop the prefetch thread; the next `next_batch` restarts it where consumption stands."""
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None

    def __enter__(self) -> TokenLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_layout(sources: list[DataSource], batch_size: int, rank: int, world_size: int) -> None:
    if not sources:
        raise LmforgeError("the loader needs at least one dataset: pass a DataSource")
    if world_size < 1 or not 0 <= rank < world_size:
        raise LmforgeError(f"rank {rank} is outside world size {world_size}: check the launcher")
    if batch_size < 1 or batch_size % world_size:
        raise LmforgeError(
            f"global batch size {batch_size} does not split over {world_size} ranks: "
            "make train.batch_size a multiple of the data-parallel size"
        )
    if any(not s.weight > 0 for s in sources):
        raise LmforgeError("every dataset weight must be positive: fix the blend weights")
    labels = [s.label for s in sources]
    if len(set(labels)) != len(labels):
        raise LmforgeError(f"dataset names {labels} repeat: give each DataSource a distinct name")
    fingerprints = {read_meta(s.shard_dir).tokenizer_fingerprint for s in sources}
    if len(fingerprints) > 1:
        raise LmforgeError(
            "the datasets were tokenized with different tokenizers: re-tokenize them with one"
        )
