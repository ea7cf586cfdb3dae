"""Causal self-attention with grouped-query heads, RoPE and an optional KV cache.

Packed documents (segment ids) attend only inside themselves through `document_attention`, the
one place that picks that kernel: SDPA with an explicit (B, 1, T, T) mask for short rows, and
from DOCUMENT_FA2_MIN_SEQ tokens on the tiled FlashAttention-2 of kernels/flash_attention.py,
whose memory grows with T rather than T². Branch ids inside a document make it a two-level
tree: a shared trunk (branch 0, first) and branches that each see the trunk and themselves,
as a multiple-choice question's context and its choices are scored in one row.
flex_attention is not used: on a CPU it has no backward in torch 2.13 ("FlexAttention does not
support backward on CPU").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.model.layers import Linear
from lmforge.model.rope import apply_rope

if TYPE_CHECKING:
    from lmforge.model.cache import Cache


# From this many tokens on, a row's (T, T) mask and SDPA's masked path hold more memory than
# the tiled kernel's extra time is worth (benchmarks/bench_attention.py measures both).
DOCUMENT_FA2_MIN_SEQ = 2048


def document_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    segments: torch.Tensor,
    branches: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of q, k, v (B, H or H_kv, T, D) inside each document of `segments`
    (B, T), the document number of each position, and inside each branch of `branches`."""
    if q.shape[-2] >= DOCUMENT_FA2_MIN_SEQ and branches is None:
        from lmforge.kernels.flash_attention import flash_attention

        return flash_attention(q, k, v, is_causal=True, segment_ids=segments)
    gqa = q.shape[1] != k.shape[1]
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=document_mask(segments, branches), enable_gqa=gqa
    )


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    start: int | torch.Tensor = 0,
    segments: torch.Tensor | None = None,
    branches: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of T queries at positions start.. over keys at positions 0 .. start+T-1.

    q is (B, H, T, D); k, v are (B, H_kv, start+T, D) with H_kv dividing H. A LongTensor start
    (B,) gives each row its own position; keys past a row's own are then masked out.
    `segments` (B, T) numbers the documents packed in each row; each then attends only to
    itself, and `branches` (B, T) splits each into a trunk and its branches
    (`document_attention`). `branches` alone, after keys a cache holds (start > 0), splits the
    queries the same way: every one sees all the cached keys (`cached_tree_mask`).
    """
    if segments is not None:
        return document_attention(q, k, v, segments, branches)
    t, s = q.shape[-2], k.shape[-2]
    gqa = q.shape[1] != k.shape[1]
    if branches is not None:
        mask = cached_tree_mask(start, branches, s)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    mask = None
    if isinstance(start, torch.Tensor):
        last = start[:, None, None, None] + torch.arange(t, device=q.device)[:, None]
        mask = torch.arange(s, device=q.device) <= last  # (B, 1, T, S)
    if t == 1 and q.device.type == "cpu" and q.dtype != torch.float32:
        return _one_query_attention(q, k, v, mask)
    if mask is not None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    if t == 1:  # a single newest query may see every key
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    if start == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    # is_causal aligns the mask to the top-left corner, which is wrong once start > 0.
    mask = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(diagonal=start)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


def document_mask(segments: torch.Tensor, branches: torch.Tensor | None = None) -> torch.Tensor:
    """(B, 1, T, T): query i sees key j when j <= i and both lie in the same document of
    `segments` (B, T), the document number of each position; with `branches` (B, T), key j
    must also lie in the document's trunk (branch 0) or in query i's own branch."""
    t = segments.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=segments.device).tril()
    mask = causal & (segments[:, :, None] == segments[:, None, :])
    if branches is not None:
        mask &= (branches[:, None, :] == 0) | (branches[:, :, None] == branches[:, None, :])
    return mask[:, None]


def cached_tree_mask(start: int | torch.Tensor, branches: torch.Tensor, s: int) -> torch.Tensor:
    """(B, 1, T, S): T new queries, a trunk and its branches (`branches` (B, T)), written at
    key positions start .. start+T-1 (an int, or one per row (B,)) of S: each sees every key
    before start, and of the new ones those `document_mask` lets it see."""
    b, t = branches.shape
    new = document_mask(torch.zeros_like(branches), branches)[:, 0]  # (B, T, T)
    first = start[:, None] if isinstance(start, torch.Tensor) else start
    j = (torch.arange(s, device=branches.device) - first).expand(b, s)  # index among the new
    inside = (j >= 0) & (j < t)
    seen = new.gather(2, j.clamp(0, t - 1)[:, None, :].expand(b, t, s)) & inside[:, None, :]
    return (seen | (j < 0)[:, None, :])[:, None]


def segment_positions(segments: torch.Tensor, branches: torch.Tensor | None = None) -> torch.Tensor:
    """(B, T): each position's offset from the start of its document, as if it were alone.

    With `branches` (B, T), a branch's positions continue from the end of its document's trunk
    (branch 0, which comes first in the document), as if the branch followed the trunk alone.
    """
    t = segments.shape[1]
    index = torch.arange(t, device=segments.device).expand_as(segments)
    runs = segments if branches is None else segments * (int(branches.max()) + 1) + branches
    starts = torch.ones_like(runs, dtype=torch.bool)
    starts[:, 1:] = runs[:, 1:] != runs[:, :-1]
    offsets = index - torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
    if branches is None:
        return offsets
    trunk = (branches == 0).long()
    seen = trunk.cumsum(dim=1)  # trunk tokens up to each position, this row's documents so far
    doc_starts = torch.ones_like(starts)
    doc_starts[:, 1:] = segments[:, 1:] != segments[:, :-1]
    before = torch.where(doc_starts, seen - trunk, torch.zeros_like(seen)).cummax(dim=1).values
    return offsets + torch.where(trunk.bool(), 0, seen - before)


def _one_query_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """A decode step's attention as two batched matmuls around an fp32 softmax.

    On a CPU, SDPA's flash kernel runs one bf16/fp16 query 4-7x slower than this. The query
    heads sharing a key head become that head's rows, so K and V are read once, not repeated.
    """
    b, h, _, d = q.shape
    h_kv = k.shape[1]
    scores = (q.view(b, h_kv, h // h_kv, d) @ k.transpose(-1, -2)).float() * d**-0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    out = scores.softmax(dim=-1).to(v.dtype) @ v  # (B, H_kv, G = H / H_kv, D)
    return out.view(b, h, 1, d)


class Attention(nn.Module):
    """Projects to q, k, v heads, rotates q and k, attends causally and projects back.

    `rotate` and `attend` are the functions it does that with, PyTorch's here; a kernel choice
    (lmforge.train.kernel_choice) replaces them on a module with ones of the same signature.
    """

    rotate = staticmethod(apply_rope)
    attend = staticmethod(causal_attention)

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, layer_idx: int = 0) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = d_model // n_heads
        self.layer_idx = layer_idx  # which of the KV cache's layers this one reads and writes
        self.q_proj = Linear(d_model, n_heads * self.head_dim)
        self.k_proj = Linear(d_model, n_kv_heads * self.head_dim)
        self.v_proj = Linear(d_model, n_kv_heads * self.head_dim)
        self.o_proj = Linear(n_heads * self.head_dim, d_model)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: Cache | None = None,
        segments: torch.Tensor | None = None,
        branches: torch.Tensor | None = None,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds a slice of the heads
        q = self.q_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
        start = 0
        y = None if kv_cache is None else kv_cache.attend(self.layer_idx, q, k, v)
        if y is None:
            if kv_cache is not None:
                start = kv_cache.pos
                k, v = kv_cache.update(self.layer_idx, k, v)
            y = self.attend(q, k, v, start, segments, branches)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))
