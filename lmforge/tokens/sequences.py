"""One token-shard dataset as a sequence of training windows in a seeded, per-epoch order.

The shard's tokens are cut into windows of `seq_len + 1` tokens starting every `seq_len` tokens
(consecutive windows share one token, so every token is a target once per epoch). Windows are
grouped into chunks of `chunk_sequences`; each epoch visits the chunks in an order shuffled by
(seed, dataset index, epoch) and the windows inside a chunk in order. The n-th window a dataset
ever yields is therefore a pure function of n, which makes resuming exact.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lmforge.errors import LmforgeError
from lmforge.tokens.segments import segment_ids
from lmforge.tokens.shards import load_doc_starts, load_tokens


class SequenceOrder:
    """The windows of shard `split` in `shard_dir`, in their order over all epochs."""

    def __init__(
        self,
        shard_dir: str | Path,
        split: str,
        seq_len: int,
        seed: int,
        index: int = 0,
        chunk_sequences: int = 1,
    ) -> None:
        if seq_len < 1 or chunk_sequences < 1:
            raise LmforgeError(
                f"seq_len ({seq_len}) and chunk_sequences ({chunk_sequences}) must be positive"
            )
        self.tokens = load_tokens(shard_dir, split)
        self.seq_len = seq_len
        self.sequences = (len(self.tokens) - 1) // seq_len
        if self.sequences < 1:
            raise LmforgeError(
                f"shard {split!r} in {shard_dir} has {len(self.tokens)} tokens, fewer than one "
                f"window of {seq_len + 1}: add data or lower train.seq_len"
            )
        self.shard_dir, self.split = Path(shard_dir), split
        self._seed, self._index, self._chunk = seed, index, chunk_sequences
        self._chunks = -(-self.sequences // chunk_sequences)
        self._doc_starts: np.ndarray | None = None
        self._orders: dict[int, tuple[np.ndarray, int]] = {}

    def _epoch_order(self, epoch: int) -> tuple[np.ndarray, int]:
        """The chunk permutation of `epoch` and where in it the short last chunk sits."""
        if epoch not in self._orders:
            if len(self._orders) >= 2:  # a batch spans at most two epochs
                self._orders.pop(min(self._orders))
            rng = np.random.default_rng([self._seed, self._index, epoch])
            perm = rng.permutation(self._chunks)
            short_at = int(np.flatnonzero(perm == self._chunks - 1)[0])
            self._orders[epoch] = (perm, short_at)
        return self._orders[epoch]

    def window_starts(self, cursors: np.ndarray) -> np.ndarray:
        """Token offset of the window each cursor (count of windows yielded before it) names."""
        cursors = np.asarray(cursors, dtype=np.int64)
        starts = np.empty_like(cursors)
        k, short = self._chunk, self.sequences % self._chunk
        epochs, positions = np.divmod(cursors, self.sequences)
        for epoch in np.unique(epochs):
            sel = epochs == epoch
            perm, short_at = self._epoch_order(int(epoch))
            p = positions[sel]
            if short:  # positions past the short chunk count as if it were full
                lo = short_at * k
                in_short = (p >= lo) & (p < lo + short)
                p = np.where(p >= lo + short, p + (k - short), p)
                window = perm[p // k] * k + p % k
                window = np.where(in_short, (self._chunks - 1) * k + (p - lo), window)
            else:
                window = perm[p // k] * k + p % k
            starts[sel] = window * self.seq_len
        return starts

    def read(self, starts: np.ndarray) -> np.ndarray:
        """The windows at token offsets `starts`, as int64 (rows, seq_len + 1)."""
        if len(starts) == 0:
            return np.empty((0, self.seq_len + 1), dtype=np.int64)
        index = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(self.seq_len + 1)
        return self.tokens[index].astype(np.int64)

    def segments(self, starts: np.ndarray) -> np.ndarray:
        """Segment ids (rows, seq_len) of the input tokens of the windows at `starts`."""
        if self._doc_starts is None:
            self._doc_starts = load_doc_starts(self.shard_dir, self.split)
        return segment_ids(self._doc_starts, starts, self.seq_len)
