"""FlashAttention-2 in plain PyTorch: tiled attention whose backward recomputes the softmax.

`flash_attention(q, k, v, ...)` (a `torch.autograd.Function`, `FlashAttention2.apply`) equals
`torch.nn.functional.scaled_dot_product_attention` in values and gradients while holding
O(sequence) memory for backward instead of the O(sequence²) attention matrix:

- forward walks query tiles and, inside each, key tiles, keeping a running row maximum and
  row sum (online softmax) and rescaling the output accumulator as the maximum grows;
- backward saves only q, k, v, the output and one log-sum-exp per query row (..., seq_q), and
  rebuilds each tile's probabilities as exp(S - LSE); with D = rowsum(dO * O):
  dV += Pᵀ dO, dP = dO Vᵀ, dS = P * (dP - D), dQ += dS K * scale, dK += dSᵀ Q * scale.

Shapes are (..., heads, seq, d_head) with any leading dimensions (or (seq, d_head)). K and V
may have fewer heads than Q on dim -3 (grouped-query attention, query head h reading key head
h // (heads_q / heads_kv), as SDPA's `enable_gqa`): the query heads of a group become extra rows
of one matmul against their shared K/V tile, so K/V are never repeated. V may have its own
d_head. seq_q may differ from seq_k.

Masks (any combination; a key is attended only when every one allows it):
- `is_causal`: query i sees key j when j <= i, aligned to the top-left corner exactly as SDPA's
  `is_causal` (so with seq_q < seq_k the last queries do not see the last keys);
- `segment_ids`: integers shaped (*batch, seq) — q's leading dims without the head dim, shared
  by all heads — or (*batch, heads, seq); one tensor for both sides (self-attention) or a pair
  (q_segments, k_segments). A query sees only keys of its own segment: document masking for
  packed sequences. Key tiles in no query's segment are skipped;
- `mask`: as SDPA's `attn_mask`, broadcastable to (..., seq_q, seq_k): boolean (True = attend)
  or additive float (added to the scaled scores). It takes no gradient.

A query row that may attend to nothing outputs 0 with zero gradient (SDPA gives NaN); its
log-sum-exp is -inf. Inputs in bf16/fp16 are computed and accumulated in fp32 (fp64 stays
fp64, for gradcheck); the log-sum-exp is kept in that compute dtype. Key tiles wholly above the
causal diagonal are skipped. The mask and segment tensors are the caller's, kept by reference
for backward (nothing of theirs is copied or saved by autograd).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from lmforge.errors import LmforgeError

Segments = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    is_causal: bool = False,
    segment_ids: Segments | None = None,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    block_q: int = 64,
    block_k: int = 64,
) -> torch.Tensor:
    """softmax(q kᵀ * scale + masks) v, tiled; see the module docstring for shapes and masks."""
    return FlashAttention2.apply(q, k, v, is_causal, segment_ids, mask, scale, block_q, block_k)


class FlashAttention2(torch.autograd.Function):
    """Tiled attention with a recomputing backward; saves q, k, v, out and the log-sum-exp."""

    @staticmethod
    def forward(
        ctx,
        q,
        k,
        v,
        is_causal=False,
        segment_ids=None,
        mask=None,
        scale=None,
        block_q=64,
        block_k=64,
    ):
        shape = _Shape.of(q, k, v)
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
        masks = _Masks(shape, is_causal, segment_ids, mask, _block(block_q), _block(block_k))
        out, lse = _forward(
            shape, masks, _queries(shape, q, scale), _keys(shape, k), _keys(shape, v)
        )
        out, lse = shape.query_output(out).to(q.dtype), shape.query_rows(lse)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.shape, ctx.masks, ctx.scale = shape, masks, scale
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        shape, scale = ctx.shape, ctx.scale
        dq, dk, dv = _backward(
            shape,
            ctx.masks,
            scale,
            _queries(shape, q, scale),
            _keys(shape, k),
            _keys(shape, v),
            _queries(shape, out, 1.0),
            _queries(shape, dout, 1.0),
            _rows(shape, lse),
        )
        dq = shape.query_output(dq).to(q.dtype)
        dk, dv = shape.key_output(dk).to(k.dtype), shape.key_output(dv).to(v.dtype)
        return dq, dk, dv, None, None, None, None, None, None


@dataclass(frozen=True)
class _Shape:
    """The problem's sizes. Internally queries are (N, seq_q, G, d) and keys (N, seq_k, d),
    N = prod(lead) * heads_kv and G = heads_q / heads_kv, so a query tile of a key head's group
    is one (N, rows, d) view with rows ordered (position, group member)."""

    lead: tuple[int, ...]
    heads_q: int
    heads_kv: int
    seq_q: int
    seq_k: int
    d: int
    d_v: int
    squeeze: bool  # inputs were (seq, d_head): a head dim of 1 was added
    dtype: torch.dtype  # compute dtype

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv

    @property
    def n(self) -> int:
        return math.prod(self.lead) * self.heads_kv

    @staticmethod
    def of(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> _Shape:
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or t.dim() < 2 or not t.is_floating_point():
                raise LmforgeError(
                    f"flash_attention: {name} must be a float tensor shaped (..., seq, d_head)"
                )
        if not q.dtype == k.dtype == v.dtype or not q.device == k.device == v.device:
            raise LmforgeError(
                "flash_attention: q, k and v differ in dtype or device: convert them to one"
            )
        if not q.dim() == k.dim() == v.dim():
            raise LmforgeError("flash_attention: q, k and v need the same number of dimensions")
        squeeze = q.dim() == 2
        qs, ks, vs = (t.shape if not squeeze else (1, *t.shape) for t in (q, k, v))
        if qs[:-3] != ks[:-3] or ks[:-1] != vs[:-1] or qs[-1] != ks[-1]:
            raise LmforgeError(
                f"flash_attention: shapes q {tuple(q.shape)}, k {tuple(k.shape)}, "
                f"v {tuple(v.shape)} do not fit: q and k share leading dims and d_head, k and v "
                "all but d_head"
            )
        if qs[-3] % ks[-3]:
            raise LmforgeError(
                f"flash_attention: {qs[-3]} query heads are not a multiple of {ks[-3]} key heads"
            )
        dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        return _Shape(
            tuple(qs[:-3]), qs[-3], ks[-3], qs[-2], ks[-2], qs[-1], vs[-1], squeeze, dtype
        )

    def query_output(self, x: torch.Tensor) -> torch.Tensor:
        """(N, seq_q, G, e) back to the caller's (..., heads_q, seq_q, e)."""
        x = x.view(*self.lead, self.heads_kv, self.seq_q, self.group, x.shape[-1])
        x = x.transpose(-3, -2).reshape(*self.lead, self.heads_q, self.seq_q, x.shape[-1])
        return x.squeeze(-3) if self.squeeze else x

    def query_rows(self, x: torch.Tensor) -> torch.Tensor:
        """(N, seq_q, G) back to (..., heads_q, seq_q)."""
        x = x.view(*self.lead, self.heads_kv, self.seq_q, self.group).transpose(-2, -1)
        x = x.reshape(*self.lead, self.heads_q, self.seq_q)
        return x.squeeze(-2) if self.squeeze else x

    def key_output(self, x: torch.Tensor) -> torch.Tensor:
        x = x.view(*self.lead, self.heads_kv, self.seq_k, x.shape[-1])
        return x.squeeze(-3) if self.squeeze else x


def _block(size: int) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise LmforgeError(f"flash_attention: block size {size!r} must be a positive integer")
    return size


def _queries(shape: _Shape, x: torch.Tensor, scale: float) -> torch.Tensor:
    """(..., heads_q, seq_q, e) as a contiguous (N, seq_q, G, e) in the compute dtype, * scale."""
    if shape.group == 1 and scale == 1.0 and x.dtype == shape.dtype and x.is_contiguous():
        return x.view(shape.n, shape.seq_q, 1, x.shape[-1])  # already laid out: no copy
    x = x.reshape(*shape.lead, shape.heads_kv, shape.group, shape.seq_q, x.shape[-1])
    out = torch.empty(
        (shape.n, shape.seq_q, shape.group, x.shape[-1]), dtype=shape.dtype, device=x.device
    )
    out.view(*shape.lead, shape.heads_kv, shape.seq_q, shape.group, x.shape[-1]).copy_(
        x.transpose(-3, -2)
    )
    return out.mul_(scale) if scale != 1.0 else out


def _keys(shape: _Shape, x: torch.Tensor) -> torch.Tensor:
    return x.reshape(shape.n, shape.seq_k, x.shape[-1]).to(shape.dtype)


def _rows(shape: _Shape, lse: torch.Tensor) -> torch.Tensor:
    """The saved log-sum-exp as (N, seq_q, G), +inf where a row attends to nothing, so that
    exp(S - LSE) is 0 there."""
    x = lse.reshape(*shape.lead, shape.heads_kv, shape.group, shape.seq_q).transpose(-2, -1)
    x = x.reshape(shape.n, shape.seq_q, shape.group)
    return x.masked_fill(x == -math.inf, math.inf)


_SKIP, _FULL = None, (False, False)  # a tile's plan: skipped, or (needs causal, needs segments)


class _Masks:
    """Which tiles to compute and how to mask each one.

    Tile masks are built in the score tile's 5-D view (*lead, heads_kv, rows_q, G, cols_k) from
    broadcastable views of the caller's tensors, so nothing seq_q x seq_k is materialised here.
    """

    def __init__(self, shape, is_causal, segment_ids, mask, block_q, block_k) -> None:
        self.shape, self.block_q, self.block_k = shape, block_q, block_k
        self.causal = bool(is_causal)
        self.mask = _user_mask(shape, mask)
        self.segments = _segments(shape, segment_ids)
        q_tiles = range(0, shape.seq_q, block_q)
        k_tiles = range(0, shape.seq_k, block_k)
        seg_skip, seg_uniform = self._segment_tables(q_tiles, k_tiles)
        self.plan = [
            [
                self._tile_plan(q0, k0, seg_skip[i][j], seg_uniform[i][j])
                for j, k0 in enumerate(k_tiles)
            ]
            for i, q0 in enumerate(q_tiles)
        ]

    def _tile_plan(self, q0: int, k0: int, seg_skip: bool, seg_uniform: bool):
        q1 = min(q0 + self.block_q, self.shape.seq_q)
        k1 = min(k0 + self.block_k, self.shape.seq_k)
        if seg_skip or (self.causal and k0 > q1 - 1):
            return _SKIP
        return (self.causal and k1 - 1 > q0, self.segments is not None and not seg_uniform)

    def _segment_tables(self, q_tiles: range, k_tiles: range):
        """Per tile pair: no query's segment among the keys' (skip), and one segment on both
        sides (no segment mask needed), for every batch row."""
        shape = (len(q_tiles), len(k_tiles))
        if self.segments is None or not all(shape):
            none = torch.zeros(shape, dtype=torch.bool)
            return none.tolist(), (~none).tolist()
        qs, ks = self.segments
        lead = torch.broadcast_shapes(qs.shape[:-1], ks.shape[:-1])
        qs = qs.expand(*lead, qs.shape[-1]).reshape(-1, qs.shape[-1])
        ks = ks.expand(*lead, ks.shape[-1]).reshape(-1, ks.shape[-1])

        def bounds(s: torch.Tensor, tiles: range, size: int):
            pairs = [s[:, t : t + size].aminmax(dim=-1) for t in tiles]
            return torch.stack([p.min for p in pairs], 1), torch.stack([p.max for p in pairs], 1)

        qmin, qmax = (b[:, :, None] for b in bounds(qs, q_tiles, self.block_q))
        kmin, kmax = (b[:, None, :] for b in bounds(ks, k_tiles, self.block_k))
        skip = ((qmax < kmin) | (qmin > kmax)).all(0)
        uniform = ((qmin == qmax) & (kmin == kmax) & (qmin == kmin)).all(0)
        return skip.tolist(), uniform.tolist()

    def apply(self, scores: torch.Tensor, plan, q0: int, q1: int, k0: int, k1: int) -> None:
        """Mask the (N, rows, cols) score tile of queries q0:q1 and keys k0:k1 in place."""
        need_causal, need_segments = plan
        s = self.shape
        view = scores.view(*s.lead, s.heads_kv, q1 - q0, s.group, k1 - k0)
        blocked = None
        if need_causal:
            rows = torch.arange(q0, q1, device=scores.device)
            blocked = (torch.arange(k0, k1, device=scores.device) > rows[:, None])[:, None]
        if need_segments:
            qs, ks = self.segments
            apart = qs[..., q0:q1].transpose(-1, -2)[..., None] != ks[..., None, :, k0:k1]
            blocked = apart if blocked is None else blocked | apart
        if self.mask is not None:
            tile = self.mask[..., q0:q1, :, k0:k1]
            if tile.dtype == torch.bool:
                blocked = ~tile if blocked is None else blocked | ~tile
            else:
                view.add_(tile)
        if blocked is not None:
            view.masked_fill_(blocked, -math.inf)


def check_mask(mask: torch.Tensor, full: tuple[int, ...]) -> None:
    """Refuse, in one line, a mask SDPA's attn_mask would not take for scores shaped `full`."""
    if not isinstance(mask, torch.Tensor) or not (
        mask.dtype == torch.bool or mask.is_floating_point()
    ):
        raise LmforgeError(
            "flash_attention: mask must be a bool or float tensor (as SDPA's attn_mask)"
        )
    if mask.requires_grad:
        raise LmforgeError(
            "flash_attention: the additive mask takes no gradient: pass mask.detach()"
        )
    try:
        fits = torch.broadcast_shapes(mask.shape, full) == full
    except RuntimeError:
        fits = False
    if not fits:
        raise LmforgeError(
            f"flash_attention: mask shape {tuple(mask.shape)} does not broadcast to {full}"
        )


def _user_mask(shape: _Shape, mask: torch.Tensor | None) -> torch.Tensor | None:
    """The mask as a view shaped (*lead', heads_kv', seq_q, G', seq_k), primes 1 or full."""
    if mask is None:
        return None
    full = (*shape.lead, shape.heads_q, shape.seq_q, shape.seq_k)
    check_mask(mask, full)
    m = mask.reshape((1,) * (len(full) - mask.dim()) + tuple(mask.shape))
    m = m.expand(*m.shape[:-2], shape.seq_q, shape.seq_k)
    return _split_heads(shape, m, -3).transpose(-3, -2)


def check_segments(
    segment_ids: Segments, lead: tuple[int, ...], heads: int, seqs: tuple[int, int]
) -> list[torch.Tensor]:
    """The (q, k) segment ids (one tensor for both, or a pair), checked against q/k's leading
    dims, heads and (seq_q, seq_k); each shaped (*lead, 1 or heads, seq) or broadcastable to it."""
    pair = segment_ids if isinstance(segment_ids, tuple | list) else (segment_ids, segment_ids)
    if len(pair) != 2:
        raise LmforgeError("flash_attention: segment_ids is one tensor or a (q, k) pair")
    out = []
    for ids, seq in zip(pair, seqs, strict=True):
        if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.is_complex():
            raise LmforgeError("flash_attention: segment_ids must be integer tensors")
        if ids.dim() == len(lead) + 1:  # no head dim: shared by all heads
            ids = ids.unsqueeze(-2)
        full = (*lead, heads, seq)
        try:
            fits = ids.dim() == len(full) and torch.broadcast_shapes(ids.shape, full) == full
        except RuntimeError:
            fits = False
        if not fits:
            raise LmforgeError(
                f"flash_attention: segment_ids shape {tuple(ids.shape)} does not fit "
                f"(*batch, seq) or (*batch, heads, seq) for q/k shaped (..., {heads}, seq, d)"
            )
        out.append(ids)
    return out


def _segments(shape: _Shape, segment_ids: Segments | None):
    """(q, k) segment views shaped (*lead', heads_kv', G', seq), primes 1 or full."""
    if segment_ids is None:
        return None
    seqs = (shape.seq_q, shape.seq_k)
    pair = check_segments(segment_ids, shape.lead, shape.heads_q, seqs)
    return tuple(
        _split_heads(shape, ids.expand(*ids.shape[:-1], seq), -2)
        for ids, seq in zip(pair, seqs, strict=True)
    )


def _split_heads(shape: _Shape, x: torch.Tensor, dim: int) -> torch.Tensor:
    """Split a head dim of size 1 or heads_q at `dim` into (heads_kv, G), each 1 or full."""
    split = (1, 1) if x.shape[dim] == 1 else (shape.heads_kv, shape.group)
    return x.unflatten(dim, split)


def _forward(shape: _Shape, masks: _Masks, q, k, v):
    n, g, dtype = shape.n, shape.group, shape.dtype
    out = torch.empty((n, shape.seq_q, g, shape.d_v), dtype=dtype, device=q.device)
    lse = torch.empty((n, shape.seq_q, g), dtype=dtype, device=q.device)
    for i, q0 in enumerate(range(0, shape.seq_q, masks.block_q)):
        q1 = min(q0 + masks.block_q, shape.seq_q)
        rows = (q1 - q0) * g
        qt = q[:, q0:q1].reshape(n, rows, shape.d)
        acc = torch.zeros((n, rows, shape.d_v), dtype=dtype, device=q.device)
        row_max = torch.full((n, rows), -math.inf, dtype=dtype, device=q.device)
        row_sum = torch.zeros((n, rows), dtype=dtype, device=q.device)
        for j, k0 in enumerate(range(0, shape.seq_k, masks.block_k)):
            plan = masks.plan[i][j]
            if plan is _SKIP:
                continue
            k1 = min(k0 + masks.block_k, shape.seq_k)
            s = torch.bmm(qt, k[:, k0:k1].transpose(1, 2))
            if plan != _FULL or masks.mask is not None:
                masks.apply(s, plan, q0, q1, k0, k1)
            new_max = torch.maximum(row_max, s.amax(-1))
            # rows that have seen only masked keys keep max -inf: shift them by 0 instead
            shift = new_max.masked_fill(new_max == -math.inf, 0.0)
            p = s.sub_(shift[..., None]).exp_()
            alpha = row_max.sub_(shift).exp_()
            row_sum.mul_(alpha).add_(p.sum(-1))
            acc.mul_(alpha[..., None]).baddbmm_(p, v[:, k0:k1])
            row_max = new_max
        shift = row_max.masked_fill(row_max == -math.inf, 0.0)
        out[:, q0:q1].view(n, rows, shape.d_v).copy_(
            acc.div_(row_sum.masked_fill(row_sum == 0, 1.0)[..., None])
        )
        lse[:, q0:q1].view(n, rows).copy_(shift.add_(row_sum.log_()))
    return out, lse


def _backward(shape: _Shape, masks: _Masks, scale: float, q, k, v, out, dout, lse):
    n, g = shape.n, shape.group
    delta = (dout * out).sum(-1)  # (N, seq_q, G)
    dq = torch.zeros_like(q)
    dk = torch.zeros_like(k)
    dv = torch.zeros_like(v)
    q_tiles = list(enumerate(range(0, shape.seq_q, masks.block_q)))
    for j, k0 in enumerate(range(0, shape.seq_k, masks.block_k)):
        k1 = min(k0 + masks.block_k, shape.seq_k)
        kt, vt, dkt, dvt = k[:, k0:k1], v[:, k0:k1], dk[:, k0:k1], dv[:, k0:k1]
        for i, q0 in q_tiles:
            plan = masks.plan[i][j]
            if plan is _SKIP:
                continue
            q1 = min(q0 + masks.block_q, shape.seq_q)
            rows = (q1 - q0) * g
            qt = q[:, q0:q1].reshape(n, rows, shape.d)
            dot = dout[:, q0:q1].reshape(n, rows, shape.d_v)
            s = torch.bmm(qt, kt.transpose(1, 2))
            if plan != _FULL or masks.mask is not None:
                masks.apply(s, plan, q0, q1, k0, k1)
            p = s.sub_(lse[:, q0:q1].reshape(n, rows, 1)).exp_()
            dvt.baddbmm_(p.transpose(1, 2), dot)
            ds = torch.bmm(dot, vt.transpose(1, 2))
            ds.sub_(delta[:, q0:q1].reshape(n, rows, 1)).mul_(p)
            dq[:, q0:q1].view(n, rows, shape.d).baddbmm_(ds, kt, alpha=scale)
            dkt.baddbmm_(ds.transpose(1, 2), qt)
    return dq, dk, dv
