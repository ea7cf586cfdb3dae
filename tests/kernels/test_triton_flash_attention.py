"""The Triton FlashAttention-2 under the interpreter (fp32, CPU) against torch's SDPA: values,
gradients and the saved log-sum-exp, for odd shapes, causal, GQA, segments and masks.

The kernels run in the interpreter's child process (interpreted.py says why); the interpreted
block sizes are 16, so every shape below spans several tiles and ends in a partial one.
"""

import pytest
import torch
import torch.nn.functional as F

from lmforge.errors import LmforgeError
from lmforge.kernels.triton import interpreted, load
from lmforge.kernels.triton.interpreted import forward_backward, run_interpreted

interpreted.start()


def inputs(b, h, h_kv, m, n, d, d_v=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, m, d, generator=g)
    k = torch.randn(b, h_kv, n, d, generator=g)
    v = torch.randn(b, h_kv, n, d_v or d, generator=g)
    return q, k, v, torch.randn(b, h, m, d_v or d, generator=g)


def leaves(*tensors):
    return [t.clone().requires_grad_() for t in tensors]


def triton(q, k, v, grad, **options):
    """The Triton kernel's output and q, k, v gradients for the incoming gradient `grad`."""
    out, grads = forward_backward("flash_attention", "flash_attention", *leaves(q, k, v),
                                  grad=grad, **options)  # fmt: skip
    return out, *grads


def run(fn, q, k, v, grad, **kwargs):
    """fn's output (here, in PyTorch) and the gradients of q, k, v for `grad`."""
    q, k, v = leaves(q, k, v)
    out = fn(q, k, v, **kwargs)
    out.backward(grad)
    return out.detach(), q.grad, k.grad, v.grad


def sdpa(q, k, v, is_causal=False, mask=None):
    gqa = q.dim() > 2 and q.shape[-3] != k.shape[-3]
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=gqa
    )


def assert_all_close(got, want, names=("out", "dq", "dk", "dv")):
    for name, a, b in zip(names, got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-5, msg=f"{name} differs")


@pytest.mark.parametrize(
    ("m", "n", "d", "d_v"), [(37, 45, 24, 20), (16, 16, 16, 16), (45, 13, 8, 8)]
)
def test_equals_sdpa_on_odd_shapes(m, n, d, d_v):
    q, k, v, grad = inputs(2, 2, 2, m, n, d, d_v)
    assert_all_close(triton(q, k, v, grad), run(sdpa, q, k, v, grad))


@pytest.mark.parametrize(("m", "n"), [(50, 50), (21, 50), (50, 21)])
def test_causal_is_aligned_to_the_top_left_as_sdpa(m, n):
    q, k, v, grad = inputs(1, 2, 2, m, n, 16)
    got = triton(q, k, v, grad, is_causal=True)
    assert_all_close(got, run(sdpa, q, k, v, grad, is_causal=True))


@pytest.mark.parametrize("h_kv", [1, 2])
def test_grouped_query_heads_read_their_shared_key_head(h_kv):
    q, k, v, grad = inputs(2, 4, h_kv, 33, 33, 16)
    got = triton(q, k, v, grad, is_causal=True)
    assert_all_close(got, run(sdpa, q, k, v, grad, is_causal=True))


def segment_mask(q_ids, k_ids):
    """(B, 1, M, N) True where query and key share a segment."""
    return (q_ids[:, :, None] == k_ids[:, None, :])[:, None]


def test_packed_documents_attend_only_inside_themselves():
    # documents of 10, 25 and 15 tokens cross the 16-token tiles; the second row is unsorted,
    # so no tile may be skipped from its first and last ids alone
    ids = torch.tensor([[0] * 10 + [1] * 25 + [2] * 15, [3, 1] * 25])
    q, k, v, grad = inputs(2, 4, 2, 50, 50, 16)
    causal = torch.ones(50, 50, dtype=torch.bool).tril()
    want = run(sdpa, q, k, v, grad, mask=segment_mask(ids, ids) & causal)
    assert_all_close(triton(q, k, v, grad, is_causal=True, segment_ids=ids), want)


def test_per_head_segments_and_a_query_with_no_key_outputs_zero():
    g = torch.Generator().manual_seed(3)
    q_ids = torch.randint(0, 3, (2, 2, 29), generator=g)
    k_ids = torch.randint(0, 3, (2, 2, 40), generator=g)
    q_ids[0, 1, 5] = 7  # no key has segment 7: that row attends to nothing
    q, k, v, grad = inputs(2, 2, 2, 29, 40, 16)
    got = triton(q, k, v, grad, segment_ids=(q_ids, k_ids))
    mask = q_ids[..., :, None] == k_ids[..., None, :]
    want = run(sdpa, q, k, v, grad, mask=mask)  # NaN in the empty row
    assert torch.equal(got[0][0, 1, 5], torch.zeros(16))
    assert torch.equal(got[1][0, 1, 5], torch.zeros(16))
    keep = torch.ones(2, 2, 29, 1, dtype=torch.bool)
    keep[0, 1, 5] = False
    torch.testing.assert_close(got[0] * keep, want[0].nan_to_num() * keep, rtol=1e-5, atol=2e-5)
    grad_empty = grad.clone()
    grad_empty[0, 1, 5] = 0  # SDPA's gradients are finite once the NaN row takes no gradient
    want = run(sdpa, q, k, v, grad_empty, mask=mask)
    assert_all_close(got[1:], want[1:], names=("dq", "dk", "dv"))


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_masks_as_sdpa_attn_mask(kind):
    g = torch.Generator().manual_seed(4)
    q, k, v, grad = inputs(2, 2, 2, 33, 41, 16)
    if kind == "bool":
        mask = torch.rand(2, 1, 33, 41, generator=g) > 0.3
        mask[..., 0] = True  # every row keeps a key, so SDPA has no NaN
    else:
        mask = torch.randn(33, 41, generator=g)
    got = triton(q, k, v, grad, mask=mask)
    assert_all_close(got, run(sdpa, q, k, v, grad, mask=mask))


def saved_for_backward(q, k, v, scale):
    """(in the child) The tensors the kernel's autograd node keeps."""
    out = load("flash_attention").flash_attention(q, k, v, scale=scale)
    return out.detach(), [t.detach() for t in out.grad_fn.saved_tensors]


def test_saves_one_log_sum_exp_per_query_row_and_nothing_quadratic():
    q, k, v, _ = inputs(2, 4, 2, 37, 45, 16)
    q.requires_grad_()
    out, saved = run_interpreted(__file__, "saved_for_backward", q=q, k=k, v=v, scale=0.3)
    lse = [t for t in saved if t.shape == (2, 4, 37)]
    assert len(lse) == 1
    scores = q.detach() @ k.repeat_interleave(2, dim=1).transpose(-1, -2) * 0.3
    torch.testing.assert_close(lse[0], torch.logsumexp(scores, -1), rtol=1e-6, atol=1e-5)
    assert sum(t.numel() for t in saved) == sum(t.numel() for t in (q, k, v, out)) + lse[0].numel()


def test_leading_dims_scale_and_two_dim_inputs():
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 3, 2, 19, 16, generator=g) for _ in range(3))
    grad = torch.randn_like(q)
    want = run(F.scaled_dot_product_attention, q, k, v, grad, scale=0.5)
    assert_all_close(triton(q, k, v, grad, scale=0.5), want)
    q2, k2, v2, grad2 = q[0, 0, 0], k[0, 0, 0], v[0, 0, 0], grad[0, 0, 0]  # (seq, d_head)
    got = triton(q2, k2, v2, grad2, is_causal=True)
    assert_all_close(got, run(sdpa, q2, k2, v2, grad2, is_causal=True))


def test_non_contiguous_heads_are_read_through_strides():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 21, 3, 2, 16, generator=g)  # (batch, seq, q/k/v, heads, d) as a model has
    q, k, v = (x[:, :, i].transpose(1, 2) for i in range(3))
    grad = torch.randn(2, 2, 21, 16, generator=g)
    got = triton(q, k, v, grad, is_causal=True)
    assert_all_close(got, run(sdpa, q, k, v, grad, is_causal=True))


def test_bad_input_is_a_clear_error():
    fa = load("flash_attention")  # checked before any kernel runs: no interpreter needed
    q, k, v, _ = inputs(1, 3, 2, 8, 8, 16)
    with pytest.raises(LmforgeError, match="not a multiple"):
        fa.flash_attention(q, k, v)
    with pytest.raises(LmforgeError, match="float64"):
        fa.flash_attention(*(t.double() for t in (q, q, q)))
    with pytest.raises(LmforgeError, match="segment_ids shape"):
        fa.flash_attention(q, q, q, segment_ids=torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(LmforgeError, match="does not broadcast"):
        fa.flash_attention(q, q, q, mask=torch.ones(8, 9, dtype=torch.bool))
