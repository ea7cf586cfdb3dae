"""FlashAttention-2 in PyTorch against SDPA: values, gradients, masks, saved tensors, errors."""

import pytest
import torch
import torch.nn.functional as F

from lmforge.errors import LmforgeError
from lmforge.kernels.flash_attention import FlashAttention2, flash_attention


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Thousands of tile-sized ops: on a shared, busy CPU a second OpenMP thread only waits."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def qkv(b, hq, hk, sq, sk, d, dtype=torch.float32, d_v=None):
    g = torch.Generator().manual_seed(sq * 1000 + sk)
    shapes = ((b, hq, sq, d), (b, hk, sk, d), (b, hk, sk, d_v or d))
    return [torch.randn(s, generator=g, dtype=dtype).requires_grad_() for s in shapes]


def grads(out, inputs, dout):
    return torch.autograd.grad(out, inputs, dout)


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    if is_causal:  # SDPA refuses is_causal together with a mask: fold it in, top-left aligned
        causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        mask = causal if mask is None else mask & causal
    gqa = q.dim() > 2 and q.shape[-3] != k.shape[-3]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)


def assert_matches(inputs, ours, ref, atol=1e-5, rtol=1e-5):
    dout = torch.randn_like(ref)
    torch.testing.assert_close(ours, ref, atol=atol, rtol=rtol)
    for a, b in zip(grads(ours, inputs, dout), grads(ref, inputs, dout), strict=True):
        torch.testing.assert_close(a, b, atol=atol, rtol=rtol)


@pytest.mark.parametrize(
    ("sq", "sk", "block_q", "block_k"),
    [(1, 1, 64, 64), (17, 17, 16, 16), (130, 130, 64, 64), (130, 130, 48, 33), (17, 130, 8, 32),
     (130, 17, 32, 8), (1, 130, 16, 16)],
)  # fmt: skip
@pytest.mark.parametrize("is_causal", [False, True])
def test_equals_sdpa_fp32(sq, sk, block_q, block_k, is_causal):
    q, k, v = qkv(2, 3, 3, sq, sk, 16)
    out = flash_attention(q, k, v, is_causal=is_causal, block_q=block_q, block_k=block_k)
    assert_matches((q, k, v), out, sdpa(q, k, v, is_causal=is_causal))


@pytest.mark.parametrize(("sq", "sk"), [(37, 37), (29, 53), (53, 29)])
def test_grouped_query_heads(sq, sk):
    q, k, v = qkv(2, 8, 2, sq, sk, 16)
    out = flash_attention(q, k, v, is_causal=True, block_q=16, block_k=12)
    assert_matches((q, k, v), out, sdpa(q, k, v, is_causal=True))


def test_other_shapes_scale_and_value_width():
    q, k, v = qkv(1, 4, 4, 23, 31, 8, d_v=12)  # v has its own d_head
    out = flash_attention(q, k, v, scale=0.3, block_q=8, block_k=8)
    assert out.shape == (1, 4, 23, 12)
    assert_matches((q, k, v), out, sdpa(q, k, v, scale=0.3))
    # (seq, d_head) without batch or heads, and a layout transposed from (B, S, H, D)
    q2, k2, v2 = (t.detach()[0, 0].requires_grad_() for t in qkv(1, 1, 1, 19, 19, 8))
    out2 = flash_attention(q2, k2, v2, True, block_q=4)
    assert_matches((q2, k2, v2), out2, sdpa(q2, k2, v2, is_causal=True))
    base = [t.detach().transpose(1, 2).contiguous() for t in qkv(2, 4, 2, 21, 21, 8)]
    q3, k3, v3 = (t.transpose(1, 2).requires_grad_() for t in base)
    out3 = flash_attention(q3, k3, v3, is_causal=True, block_q=8, block_k=8)
    assert_matches((q3, k3, v3), out3, sdpa(q3, k3, v3, is_causal=True))
    # several leading dims: (2, 3, heads, seq, d)
    q4, k4, v4 = (t.detach().unflatten(0, (2, 3)).requires_grad_() for t in qkv(6, 4, 2, 13, 13, 8))
    out4 = flash_attention(q4, k4, v4, is_causal=True, block_q=4, block_k=4)
    assert_matches((q4, k4, v4), out4, sdpa(q4, k4, v4, is_causal=True))


def packed_segments(b, s, n_docs, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n_docs, (b, s), generator=g).sort(-1).values


@pytest.mark.parametrize("is_causal", [False, True])
def test_segment_ids_equal_sdpa_with_the_document_mask(is_causal):
    q, k, v = qkv(2, 8, 2, 130, 130, 16)
    seg = packed_segments(2, 130, 5)
    out = flash_attention(q, k, v, is_causal, segment_ids=seg, block_q=32, block_k=24)
    doc = (seg[:, :, None] == seg[:, None, :])[:, None]
    assert_matches((q, k, v), out, sdpa(q, k, v, doc, is_causal))


def test_segment_pairs_and_per_head_segments():
    q, k, v = qkv(2, 4, 2, 29, 41, 8)
    qs, ks = packed_segments(2, 29, 3, seed=1), packed_segments(2, 41, 3, seed=2)
    has_keys = (qs[:, :, None] == ks[:, None, :]).any(-1)
    qs = torch.where(has_keys, qs, ks[:, :1])  # no empty rows: SDPA would give NaN there
    doc = (qs[:, :, None] == ks[:, None, :])[:, None]
    out = flash_attention(q, k, v, segment_ids=(qs, ks), block_q=8, block_k=16)
    assert_matches((q, k, v), out, sdpa(q, k, v, doc))
    heads = torch.stack([packed_segments(2, 29, n, seed=n) for n in (1, 2, 3, 4)], 1)  # (B, H, S)
    q2, k2, v2 = qkv(2, 4, 2, 29, 29, 8)
    out2 = flash_attention(q2, k2, v2, True, segment_ids=heads, block_q=8, block_k=8)
    mask2 = heads[..., :, None] == heads[..., None, :]
    assert_matches((q2, k2, v2), out2, sdpa(q2, k2, v2, mask2, True))


@pytest.mark.parametrize("mask_shape", [(37, 53), (2, 1, 37, 53), (2, 8, 37, 53), (1, 53)])
def test_boolean_and_additive_masks(mask_shape):
    q, k, v = qkv(2, 8, 2, 37, 53, 16)
    g = torch.Generator().manual_seed(3)
    allowed = torch.rand(mask_shape, generator=g) > 0.4
    allowed[..., 0] = True  # no row left empty: SDPA would give NaN there
    out = flash_attention(q, k, v, mask=allowed, block_q=16, block_k=16)
    assert_matches((q, k, v), out, sdpa(q, k, v, allowed))
    bias = torch.randn(mask_shape, generator=g).masked_fill(~allowed, float("-inf"))
    out = flash_attention(q, k, v, mask=bias, block_q=16, block_k=16)
    assert_matches((q, k, v), out, sdpa(q, k, v, bias))


def test_mask_combined_with_causal_and_segments():
    q, k, v = qkv(1, 4, 4, 61, 61, 8)
    seg = packed_segments(1, 61, 3)
    allowed = torch.rand(61, 61, generator=torch.Generator().manual_seed(4)) > 0.3
    allowed.fill_diagonal_(True)
    out = flash_attention(q, k, v, True, seg, allowed, block_q=16, block_k=16)
    doc = (seg[:, :, None] == seg[:, None, :])[:, None] & allowed
    assert_matches((q, k, v), out, sdpa(q, k, v, doc, True))


def test_fully_masked_rows_output_zero_with_zero_gradient():
    q, k, v = qkv(1, 2, 2, 40, 40, 8)
    allowed = torch.rand(40, 40, generator=torch.Generator().manual_seed(5)) > 0.5
    allowed[:, 0] = True
    empty = torch.tensor([3, 17, 18, 39])
    allowed[empty] = False
    out = flash_attention(q, k, v, mask=allowed, block_q=16, block_k=8)
    dout = torch.randn_like(out)
    dq, dk, dv = grads(out, (q, k, v), dout)
    assert out[..., empty, :].abs().max() == 0 and dq[..., empty, :].abs().max() == 0
    # reference: those rows attend everything, then their outputs and gradients are dropped
    keep = torch.ones(40, 1)
    keep[empty] = 0
    ref = sdpa(q, k, v, allowed | (keep == 0)) * keep
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for a, b in zip((dq, dk, dv), grads(ref, (q, k, v), dout), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert all(torch.isfinite(t).all() for t in (out, dq, dk, dv))


def test_bf16_within_bf16_tolerance_of_fp32_sdpa():
    q, k, v = qkv(2, 8, 2, 130, 130, 32, dtype=torch.bfloat16)
    seg = packed_segments(2, 130, 3)
    out = flash_attention(q, k, v, True, seg, block_q=48, block_k=40)
    assert out.dtype == torch.bfloat16
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = sdpa(q32, k32, v32, (seg[:, :, None] == seg[:, None, :])[:, None], True)
    dout = torch.randn_like(ref)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    ours, theirs = grads(out, (q, k, v), dout.bfloat16()), grads(ref, (q32, k32, v32), dout)
    for a, b in zip(ours, theirs, strict=True):
        assert a.dtype == torch.bfloat16
        torch.testing.assert_close(a.float(), b, atol=2e-2, rtol=2e-2)


def test_gradcheck_float64_causal_segments_gqa():
    q, k, v = (t.detach().double().requires_grad_() for t in qkv(1, 4, 2, 11, 11, 4))
    seg = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2]])
    allowed = torch.rand(11, 11, generator=torch.Generator().manual_seed(6)) > 0.2
    allowed.fill_diagonal_(True)

    def attend(q, k, v):
        return flash_attention(q, k, v, True, seg, allowed, block_q=4, block_k=3)

    assert torch.autograd.gradcheck(attend, (q, k, v), eps=1e-6, atol=1e-6)


def test_saves_exactly_q_k_v_out_and_one_lse():
    q, k, v = qkv(2, 8, 2, 96, 96, 16)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = FlashAttention2.apply(q, k, v, True, packed_segments(2, 96, 3), None, None, 32, 32)
    assert len(saved) == 5
    for got, want in zip(saved[:4], (q, k, v, out), strict=True):
        assert got.data_ptr() == want.data_ptr() and got.shape == want.shape
    lse = saved[4]
    assert lse.shape == (2, 8, 96) and lse.dtype == torch.float32
    torch.testing.assert_close(lse, reference_lse(q, k, v, segments=packed_segments(2, 96, 3)))
    assert all(t.numel() < 2 * 8 * 96 * 96 // 4 for t in saved)  # nothing seq_q x seq_k


def reference_lse(q, k, v, segments):
    s = q.detach() @ k.detach().repeat_interleave(4, 1).transpose(-1, -2) / 4.0
    allowed = torch.ones(96, 96, dtype=torch.bool).tril() & (
        segments[:, None, :, None] == segments[:, None, None, :]
    )
    return s.masked_fill(~allowed, float("-inf")).logsumexp(-1)


def test_tiles_above_the_diagonal_and_across_documents_are_skipped(monkeypatch):
    q, k, v = qkv(1, 2, 2, 256, 256, 16)
    seg = torch.arange(256).div(64, rounding_mode="floor")[None]  # four documents of 64
    calls, bmm = [], torch.bmm  # each computed tile: one score bmm forward, two backward
    monkeypatch.setattr(torch, "bmm", lambda a, b: calls.append(1) or bmm(a, b))

    def tiles(**kw):
        calls.clear()
        flash_attention(q, k, v, block_q=32, block_k=32, **kw).sum().backward()
        return len(calls) / 3

    assert tiles() == 64
    assert tiles(is_causal=True) == 8 * 9 // 2
    assert tiles(is_causal=True, segment_ids=seg) == 4 * 3  # per document 2 diagonal, 1 below
    assert tiles(segment_ids=seg) == 4 * 4


def test_bad_input_raises_one_line_errors():
    q, k, v = qkv(1, 4, 2, 8, 8, 4)
    cases = [
        lambda: flash_attention(q, k[..., :3], v),
        lambda: flash_attention(q, k.double(), v),
        lambda: flash_attention(qkv(1, 3, 2, 8, 8, 4)[0], k, v),
        lambda: flash_attention(q, k, v, mask=torch.ones(5, 8, dtype=torch.bool)),
        lambda: flash_attention(q, k, v, mask=torch.zeros(8, 8, requires_grad=True)),
        lambda: flash_attention(q, k, v, segment_ids=torch.zeros(1, 8)),
        lambda: flash_attention(q, k, v, segment_ids=torch.zeros(1, 7, dtype=torch.long)),
        lambda: flash_attention(q, k, v, block_q=0),
    ]
    for case in cases:
        with pytest.raises(LmforgeError) as info:
            case()
        assert "\n" not in str(info.value)
