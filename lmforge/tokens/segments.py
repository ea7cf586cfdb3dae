"""Document boundaries inside packed sequences: per-token segment ids and the mask they imply.

A packed sequence runs across document ends. Its segment ids number the documents it touches
from 0 in order, so `segments[b, i] == segments[b, j]` says tokens i and j share a document and
attention between them is allowed.
"""

from __future__ import annotations

import numpy as np
import torch


def segment_ids(doc_starts: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    """Segment ids (rows, length) of the tokens at `starts[r] + 0 .. length-1`.

    `doc_starts` are a shard's document start offsets (its `.idx`), sorted; empty documents
    (repeated offsets) own no tokens and are skipped.
    """
    positions = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(length, dtype=np.int64)
    docs = np.searchsorted(doc_starts, positions, side="right")
    changes = np.diff(docs, axis=1, prepend=docs[:, :1]) != 0
    return np.cumsum(changes, axis=1, dtype=np.int32)


def segment_mask(segments: torch.Tensor) -> torch.Tensor:
    """Boolean attention mask (B, 1, T, T): causal and within one document, for SDPA's attn_mask."""
    t = segments.shape[-1]
    causal = torch.ones(t, t, dtype=torch.bool, device=segments.device).tril()
    same = segments[:, :, None] == segments[:, None, :]
    return (same & causal)[:, None]
