"""FlashAttention-2 in Triton: a tiled forward with online softmax and a recomputing backward.

Reference: `torch.nn.functional.scaled_dot_product_attention` (values and gradients), with the
semantics of lmforge.kernels.flash_attention, the PyTorch FA2 it mirrors:

- shapes (..., heads, seq, d_head) with any leading dims (or (seq, d_head)); K and V may have
  fewer heads than Q (grouped-query attention: query head h reads key head h // (Hq / Hkv), as
  SDPA's `enable_gqa`), V its own d_head, seq_q may differ from seq_k;
- `is_causal` aligned to the top-left corner (query i sees key j <= i), as SDPA's;
- `segment_ids` (*batch, seq) or (*batch, heads, seq), one tensor for self-attention or a
  (q, k) pair: a query sees only keys of its own segment (document masking). Ids are int32;
- `mask` as SDPA's `attn_mask`: boolean (True = attend) or additive, broadcastable to
  (..., Hq, seq_q, seq_k), read through strides (a broadcast mask is not materialised when its
  leading dims are all broadcast or all full);
- a query that may attend to nothing outputs 0 with zero gradient (SDPA gives NaN).

Forward: one program per (query tile, batch·head) walks the key tiles, keeping the running row
maximum and sum and rescaling its accumulator, and saves one log-sum-exp per query row (fp32,
shaped (..., Hq, seq_q)). Backward, with Δ = rowsum(dO∘O) from a small kernel: one program per
(key tile, batch·key head) loops over the query heads of its group and their query tiles,
recomputing P = exp(S − LSE) and accumulating dK and dV (no atomics); another per (query tile,
batch·head) accumulates dQ. Causal tiles above the diagonal and tiles whose segments cannot
meet are skipped. Inputs in bf16/fp16 go through tl.dot in that dtype with fp32 accumulation;
fp32 uses IEEE fp32 dots (no tf32), to match SDPA.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from lmforge.errors import LmforgeError
from lmforge.kernels.flash_attention import Segments, check_mask, check_segments
from lmforge.kernels.triton import configs, interpreting

INTERPRETED = interpreting()  # as triton.jit built this module's kernels (fixed at import)


_INTERPRETER_CONFIGS = [triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=1, num_stages=1)]
_FORWARD_GPU = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
    for bm, bn, w, s in (
        (128, 64, 4, 3),
        (128, 128, 8, 3),
        (64, 64, 4, 4),
        (64, 32, 4, 2),
    )
]
_BACKWARD_GPU = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
    for bm, bn, w, s in (
        (64, 64, 4, 2),
        (32, 128, 8, 2),
        (32, 64, 4, 3),
        (32, 32, 4, 2),
    )
]
_KEY = ["M", "N", "BLOCK_D", "BLOCK_DV", "IS_CAUSAL", "HAS_SEG", "HAS_MASK"]


@triton.jit
def _bounds(seg, first, valid):
    """Smallest and largest segment id among the valid lanes (the others read as `first`)."""
    seg = tl.where(valid, seg, first)
    return tl.min(seg, axis=0), tl.max(seg, axis=0)


@triton.jit
def _tile(PTR, offs_r, stride_r, offs_c, C, row_ok):
    """Rows `offs_r` of the matrix at PTR (row stride `stride_r`, C contiguous columns), zero
    beyond the valid rows and the C columns."""
    return tl.load(PTR + offs_r[:, None] * stride_r + offs_c[None, :],
                   mask=row_ok[:, None] & (offs_c[None, :] < C), other=0.0)  # fmt: skip


@triton.jit
def _segments(SEG, base, offs, start, valid, HAS_SEG: tl.constexpr):
    """A tile's segment ids (row `base` of SEG) and their smallest and largest; without
    segments (SEG is None) its positions, and bounds that never rule a tile out."""
    seg = offs
    lo = 0
    hi = 0
    if HAS_SEG:
        seg = tl.load(SEG + base + offs, mask=valid, other=0)
        lo, hi = _bounds(seg, tl.load(SEG + base + start), valid)
    return seg, lo, hi


@triton.jit
def _mask_tile(MASK, base, offs_m, offs_n, smm, smn, row_ok, col_ok, HAS_MASK: tl.constexpr):
    """The (BLOCK_M, BLOCK_N) tile of the explicit mask at MASK + base (without one, MASK is
    None: a placeholder)."""
    tile = offs_n
    if HAS_MASK:
        tile = tl.load(MASK + base + offs_m[:, None] * smm + offs_n[None, :] * smn,
                       mask=row_ok[:, None] & col_ok[None, :], other=0)  # fmt: skip
    return tile


@triton.jit
def _scores(q, k, scale, offs_m, offs_n, M, N, seg_q, seg_k, mask_tile,
            IS_CAUSAL: tl.constexpr, HAS_SEG: tl.constexpr, HAS_MASK: tl.constexpr,
            MASK_BOOL: tl.constexpr, PRECISION: tl.constexpr):  # fmt: skip
    """The (BLOCK_M, BLOCK_N) tile of scaled scores, -inf where a key may not be attended."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
    keep = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if IS_CAUSAL:
        keep = keep & (offs_m[:, None] >= offs_n[None, :])
    if HAS_SEG:
        keep = keep & (seg_q[:, None] == seg_k[None, :])
    if HAS_MASK:
        if MASK_BOOL:
            keep = keep & (mask_tile != 0)
        else:
            s = s + mask_tile.to(tl.float32)
    return tl.where(keep, s, float("-inf"))


@triton.autotune(configs=configs(_FORWARD_GPU, _INTERPRETER_CONFIGS), key=_KEY)
@triton.jit
def _forward(Q, K, V, OUT, LSE, SEG_Q, SEG_K, MASK,
             sqz, sqh, sqm, skz, skh, skn, svz, svh, svn, soz, soh, som,
             sgqz, sgqh, sgkz, sgkh, smz, smh, smm, smn,
             H, G, M, N, D, DV, scale,
             IS_CAUSAL: tl.constexpr, HAS_SEG: tl.constexpr, HAS_MASK: tl.constexpr,
             MASK_BOOL: tl.constexpr, PRECISION: tl.constexpr,
             BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    m0 = tl.program_id(0) * BLOCK_M
    zh = tl.program_id(1).to(tl.int64)
    z, h = zh // H, zh % H
    hk = h // G
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    row_ok = offs_m < M
    q = _tile(Q + z * sqz + h * sqh, offs_m, sqm, offs_d, D, row_ok)
    K = K + z * skz + hk * skh
    V = V + z * svz + hk * svh
    seg_q, q_lo, q_hi = _segments(SEG_Q, z * sgqz + h * sgqh, offs_m, m0, row_ok, HAS_SEG)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_DV), dtype=tl.float32)
    end = tl.minimum(N, m0 + BLOCK_M) if IS_CAUSAL else N
    for n0 in range(0, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        col_ok = offs_n < N
        seg_k, k_lo, k_hi = _segments(SEG_K, z * sgkz + h * sgkh, offs_n, n0, col_ok, HAS_SEG)
        if (k_lo <= q_hi) & (k_hi >= q_lo):  # a tile of keys some query's segment may see
            k = _tile(K, offs_n, skn, offs_d, D, col_ok)
            v = _tile(V, offs_n, svn, offs_dv, DV, col_ok)
            mask_tile = _mask_tile(
                MASK, z * smz + h * smh, offs_m, offs_n, smm, smn, row_ok, col_ok, HAS_MASK
            )
            s = _scores(q, k, scale, offs_m, offs_n, M, N, seg_q, seg_k, mask_tile,
                        IS_CAUSAL, HAS_SEG, HAS_MASK, MASK_BOOL, PRECISION)  # fmt: skip
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw only masked keys
            p = tl.exp(s - shift[:, None])
            alpha = tl.exp(m_i - shift)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), m_i + tl.log(tl.where(empty, 1.0, l_i)))
    tl.store(OUT + z * soz + h * soh + offs_m[:, None] * som + offs_dv[None, :],
             out.to(OUT.dtype.element_ty),
             mask=row_ok[:, None] & (offs_dv[None, :] < DV))  # fmt: skip
    tl.store(LSE + zh * M + offs_m, lse, mask=row_ok)


@triton.jit
def _delta(OUT, DO, DELTA, soz, soh, som, sdz, sdh, sdm, H, M, DV,
           BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr):  # fmt: skip
    """Δ = rowsum(dO∘O) per query row, in fp32."""
    zh = tl.program_id(1).to(tl.int64)
    z, h = zh // H, zh % H
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    ok = (offs_m[:, None] < M) & (offs_dv[None, :] < DV)
    o = tl.load(
        OUT + z * soz + h * soh + offs_m[:, None] * som + offs_dv[None, :], mask=ok, other=0.0
    )
    do = tl.load(DO + z * sdz + h * sdh + offs_m[:, None] * sdm + offs_dv[None, :], mask=ok,
                 other=0.0)  # fmt: skip
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(DELTA + zh * M + offs_m, delta, mask=offs_m < M)


@triton.jit
def _row_stats(LSE, DELTA, zh, offs_m, M):
    """A query tile's log-sum-exp (+inf for rows that attend nothing, so P is 0) and Δ."""
    ok = offs_m < M
    lse = tl.load(LSE + zh * M + offs_m, mask=ok, other=float("inf"))
    delta = tl.load(DELTA + zh * M + offs_m, mask=ok, other=0.0)
    return tl.where(lse == float("-inf"), float("inf"), lse), delta


@triton.autotune(configs=configs(_BACKWARD_GPU, _INTERPRETER_CONFIGS), key=_KEY)
@triton.jit
def _backward_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV_OUT, SEG_Q, SEG_K, MASK,
                   sqz, sqh, sqm, skz, skh, skn, svz, svh, svn, sdz, sdh, sdm,
                   sgqz, sgqh, sgkz, sgkh, smz, smh, smm, smn,
                   H, G, M, N, D, DV, scale,
                   IS_CAUSAL: tl.constexpr, HAS_SEG: tl.constexpr, HAS_MASK: tl.constexpr,
                   MASK_BOOL: tl.constexpr, PRECISION: tl.constexpr,
                   BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    n0 = tl.program_id(0) * BLOCK_N
    zhk = tl.program_id(1).to(tl.int64)
    h_kv = H // G
    z, hk = zhk // h_kv, zhk % h_kv
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    col_ok = offs_n < N
    k = _tile(K + z * skz + hk * skh, offs_n, skn, offs_d, D, col_ok)
    v = _tile(V + z * svz + hk * svh, offs_n, svn, offs_dv, DV, col_ok)
    dk = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_DV), dtype=tl.float32)
    start = (n0 // BLOCK_M) * BLOCK_M if IS_CAUSAL else 0  # query i sees key j only if i >= j
    for g in range(0, G):
        h = hk * G + g
        zh = z * H + h
        Qh = Q + z * sqz + h * sqh
        DOh = DO + z * sdz + h * sdh
        seg_k, k_lo, k_hi = _segments(SEG_K, z * sgkz + h * sgkh, offs_n, n0, col_ok, HAS_SEG)
        for m0 in range(start, M, BLOCK_M):
            offs_m = m0 + tl.arange(0, BLOCK_M)
            row_ok = offs_m < M
            seg_q, q_lo, q_hi = _segments(SEG_Q, z * sgqz + h * sgqh, offs_m, m0, row_ok, HAS_SEG)
            if (k_lo <= q_hi) & (k_hi >= q_lo):
                q = _tile(Qh, offs_m, sqm, offs_d, D, row_ok)
                do = _tile(DOh, offs_m, sdm, offs_dv, DV, row_ok)
                lse, delta = _row_stats(LSE, DELTA, zh, offs_m, M)
                mask_tile = _mask_tile(
                    MASK, z * smz + h * smh, offs_m, offs_n, smm, smn, row_ok, col_ok, HAS_MASK
                )
                s = _scores(q, k, scale, offs_m, offs_n, M, N, seg_q, seg_k, mask_tile,
                            IS_CAUSAL, HAS_SEG, HAS_MASK, MASK_BOOL, PRECISION)  # fmt: skip
                p = tl.exp(s - lse[:, None])
                dv += tl.dot(tl.trans(p).to(do.dtype), do, input_precision=PRECISION)
                dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
                ds = p * (dp - delta[:, None])
                dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PRECISION)
    kv_row = zhk * N + offs_n
    tl.store(DK + kv_row[:, None] * D + offs_d[None, :], (dk * scale).to(DK.dtype.element_ty),
             mask=col_ok[:, None] & (offs_d[None, :] < D))  # fmt: skip
    tl.store(DV_OUT + kv_row[:, None] * DV + offs_dv[None, :], dv.to(DV_OUT.dtype.element_ty),
             mask=col_ok[:, None] & (offs_dv[None, :] < DV))  # fmt: skip


@triton.autotune(configs=configs(_BACKWARD_GPU, _INTERPRETER_CONFIGS), key=_KEY)
@triton.jit
def _backward_dq(Q, K, V, DO, LSE, DELTA, DQ, SEG_Q, SEG_K, MASK,
                 sqz, sqh, sqm, skz, skh, skn, svz, svh, svn, sdz, sdh, sdm,
                 sgqz, sgqh, sgkz, sgkh, smz, smh, smm, smn,
                 H, G, M, N, D, DV, scale,
                 IS_CAUSAL: tl.constexpr, HAS_SEG: tl.constexpr, HAS_MASK: tl.constexpr,
                 MASK_BOOL: tl.constexpr, PRECISION: tl.constexpr,
                 BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    m0 = tl.program_id(0) * BLOCK_M
    zh = tl.program_id(1).to(tl.int64)
    z, h = zh // H, zh % H
    hk = h // G
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    row_ok = offs_m < M
    q = _tile(Q + z * sqz + h * sqh, offs_m, sqm, offs_d, D, row_ok)
    do = _tile(DO + z * sdz + h * sdh, offs_m, sdm, offs_dv, DV, row_ok)
    lse, delta = _row_stats(LSE, DELTA, zh, offs_m, M)
    K = K + z * skz + hk * skh
    V = V + z * svz + hk * svh
    seg_q, q_lo, q_hi = _segments(SEG_Q, z * sgqz + h * sgqh, offs_m, m0, row_ok, HAS_SEG)
    dq = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    end = tl.minimum(N, m0 + BLOCK_M) if IS_CAUSAL else N
    for n0 in range(0, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        col_ok = offs_n < N
        seg_k, k_lo, k_hi = _segments(SEG_K, z * sgkz + h * sgkh, offs_n, n0, col_ok, HAS_SEG)
        if (k_lo <= q_hi) & (k_hi >= q_lo):
            k = _tile(K, offs_n, skn, offs_d, D, col_ok)
            v = _tile(V, offs_n, svn, offs_dv, DV, col_ok)
            mask_tile = _mask_tile(
                MASK, z * smz + h * smh, offs_m, offs_n, smm, smn, row_ok, col_ok, HAS_MASK
            )
            s = _scores(q, k, scale, offs_m, offs_n, M, N, seg_q, seg_k, mask_tile,
                        IS_CAUSAL, HAS_SEG, HAS_MASK, MASK_BOOL, PRECISION)  # fmt: skip
            p = tl.exp(s - lse[:, None])
            dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
            ds = p * (dp - delta[:, None])
            dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    tl.store(DQ + (zh * M + offs_m)[:, None] * D + offs_d[None, :],
             (dq * scale).to(DQ.dtype.element_ty),
             mask=row_ok[:, None] & (offs_d[None, :] < D))  # fmt: skip


class _Problem:
    """The caller's tensors as 4-D (Z, heads, seq, d) views, Z the product of the leading dims,
    with the segment and mask tensors as strided views the kernels can read."""

    def __init__(self, q, k, v, is_causal, segment_ids, mask, scale) -> None:
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or t.dim() < 2 or not t.is_floating_point():
                raise LmforgeError(
                    f"flash_attention: {name} must be a float tensor shaped (..., seq, d_head)"
                )
        if not q.dtype == k.dtype == v.dtype or not q.device == k.device == v.device:
            raise LmforgeError(
                "flash_attention: q, k and v differ in dtype or device: convert them to one"
            )
        if q.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise LmforgeError(
                f"Triton flash_attention runs in fp32, bf16 or fp16, not {q.dtype}: use "
                "lmforge.kernels.flash_attention for float64"
            )
        if not q.dim() == k.dim() == v.dim():
            raise LmforgeError("flash_attention: q, k and v need the same number of dimensions")
        self.squeeze = q.dim() == 2
        qs, ks, vs = (t.shape if not self.squeeze else (1, *t.shape) for t in (q, k, v))
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
        self.lead = tuple(qs[:-3])
        self.z = math.prod(self.lead)
        self.h, self.h_kv = qs[-3], ks[-3]
        self.m, self.n, self.d, self.dv = qs[-2], ks[-2], qs[-1], vs[-1]
        self.causal = bool(is_causal)
        self.scale = 1.0 / math.sqrt(self.d) if scale is None else float(scale)
        self.precision = "ieee" if q.dtype == torch.float32 else "tf32"
        self.segments = self._segments(segment_ids, q.device)
        self.mask = self._mask(mask, q.device)

    def four_d(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        """(..., heads, seq, e) as (Z, heads, seq, e) with unit stride on e (a view if it can)."""
        x = x.reshape(self.z, heads, x.shape[-2], x.shape[-1])
        return x if x.stride(-1) == 1 else x.contiguous()

    def caller(self, x: torch.Tensor) -> torch.Tensor:
        """(Z, heads, seq, ...) back to the caller's leading dims."""
        x = x.reshape(*self.lead, *x.shape[1:])
        return x.squeeze(len(self.lead)) if self.squeeze else x

    def _segments(self, segment_ids: Segments | None, device) -> tuple | None:
        if segment_ids is None:
            return None
        out = []
        seqs = (self.m, self.n)
        for ids, seq in zip(
            check_segments(segment_ids, self.lead, self.h, seqs), seqs, strict=True
        ):
            heads = ids.shape[-2]
            ids = ids.to(device=device, dtype=torch.int32).expand(*self.lead, heads, seq)
            out.append(ids.reshape(self.z, heads, seq).contiguous().expand(self.z, self.h, seq))
        return tuple(out)

    def _mask(self, mask: torch.Tensor | None, device) -> torch.Tensor | None:
        if mask is None:
            return None
        full = (*self.lead, self.h, self.m, self.n)
        check_mask(mask, full)
        mask = mask.to(device)
        if mask.dtype == torch.bool:
            mask = mask.view(torch.uint8)
        return mask.expand(full).reshape(self.z, self.h, self.m, self.n)

    def args(self) -> tuple:
        """The segment and mask pointers and strides, the sizes and the constexpr flags."""
        seg_q, seg_k = self.segments or (None, None)
        seg_strides = (
            (seg_q.stride(0), seg_q.stride(1), seg_k.stride(0), seg_k.stride(1))
            if self.segments
            else (0, 0, 0, 0)
        )
        mask_strides = self.mask.stride() if self.mask is not None else (0, 0, 0, 0)
        sizes = (self.h, self.h // self.h_kv, self.m, self.n, self.d, self.dv, self.scale)
        flags = {
            "IS_CAUSAL": self.causal,
            "HAS_SEG": self.segments is not None,
            "HAS_MASK": self.mask is not None,
            "MASK_BOOL": self.mask is not None and self.mask.dtype == torch.uint8,
            "PRECISION": self.precision,
            "BLOCK_D": max(16, triton.next_power_of_2(self.d)),
            "BLOCK_DV": max(16, triton.next_power_of_2(self.dv)),
        }
        return (seg_q, seg_k, self.mask), (*seg_strides, *mask_strides), sizes, flags


def _strides(x: torch.Tensor) -> tuple[int, int, int]:
    return x.stride(0), x.stride(1), x.stride(2)


class FlashAttentionFunction(torch.autograd.Function):
    """softmax(q kᵀ · scale + masks) v; saves q, k, v, the output and the log-sum-exp."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False, segment_ids=None, mask=None, scale=None):
        p = _Problem(q, k, v, is_causal, segment_ids, mask, scale)
        q4, k4, v4 = p.four_d(q, p.h), p.four_d(k, p.h_kv), p.four_d(v, p.h_kv)
        out = torch.empty(p.z, p.h, p.m, p.dv, device=q.device, dtype=q.dtype)
        lse = torch.empty(p.z, p.h, p.m, device=q.device, dtype=torch.float32)
        extra, extra_strides, sizes, flags = p.args()

        def grid(meta):
            return (triton.cdiv(p.m, meta["BLOCK_M"]), p.z * p.h)

        _forward[grid](
            q4, k4, v4, out, lse, *extra,
            *_strides(q4), *_strides(k4), *_strides(v4), *_strides(out), *extra_strides,
            *sizes, **flags,
        )  # fmt: skip
        ctx.save_for_backward(q4, k4, v4, out, p.caller(lse))
        ctx.problem = p
        return p.caller(out)

    @staticmethod
    def backward(ctx, dout):
        q4, k4, v4, out, lse = ctx.saved_tensors
        p: _Problem = ctx.problem
        lse = lse.reshape(p.z, p.h, p.m)
        do = p.four_d(dout, p.h)
        extra, extra_strides, sizes, flags = p.args()
        delta = torch.empty_like(lse)
        block_dv = flags["BLOCK_DV"]
        _delta[(triton.cdiv(p.m, 16), p.z * p.h)](
            out, do, delta, *_strides(out), *_strides(do), p.h, p.m, p.dv,
            BLOCK_M=16, BLOCK_DV=block_dv,
        )  # fmt: skip
        dq = torch.empty(p.z, p.h, p.m, p.d, device=q4.device, dtype=q4.dtype)
        dk = torch.empty(p.z, p.h_kv, p.n, p.d, device=q4.device, dtype=k4.dtype)
        dv = torch.empty(p.z, p.h_kv, p.n, p.dv, device=q4.device, dtype=v4.dtype)
        common = (*_strides(q4), *_strides(k4), *_strides(v4), *_strides(do), *extra_strides)

        def kv_grid(meta):
            return (triton.cdiv(p.n, meta["BLOCK_N"]), p.z * p.h_kv)

        def q_grid(meta):
            return (triton.cdiv(p.m, meta["BLOCK_M"]), p.z * p.h)

        _backward_dkdv[kv_grid](
            q4, k4, v4, do, lse, delta, dk, dv, *extra, *common, *sizes, **flags
        )
        _backward_dq[q_grid](q4, k4, v4, do, lse, delta, dq, *extra, *common, *sizes, **flags)
        return p.caller(dq), p.caller(dk), p.caller(dv), None, None, None, None


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    is_causal: bool = False,
    segment_ids: Segments | None = None,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """softmax(q kᵀ · scale + masks) v in Triton; shapes and masks as the module docstring."""
    return FlashAttentionFunction.apply(q, k, v, is_causal, segment_ids, mask, scale)
