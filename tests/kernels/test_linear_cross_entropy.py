"""The chunked linear + cross-entropy equals F.cross_entropy over the full logits in value and
gradients, and never creates or saves a (tokens × vocab) tensor."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from lmforge.errors import LmforgeError
from lmforge.kernels.linear_cross_entropy import default_chunk_size, linear_cross_entropy


def reference(x, weight, targets, ignore_index=-100, reduction="mean", softcap=None):
    logits = (x @ weight.T).float()
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return F.cross_entropy(
        logits.flatten(0, -2), targets.flatten(), ignore_index=ignore_index, reduction=reduction
    )


def inputs(shape, d, vocab, dtype=torch.float32, ignored=5, ignore_index=-100, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, d, generator=g).to(dtype).requires_grad_()
    weight = (torch.randn(vocab, d, generator=g) * 0.5).to(dtype).requires_grad_()
    targets = torch.randint(0, vocab, shape, generator=g)
    targets.view(-1)[:ignored] = ignore_index
    return x, weight, targets


def loss_and_grads(fn, x, weight, *args, **kwargs):
    x.grad = weight.grad = None
    loss = fn(x, weight, *args, **kwargs)
    loss.backward()
    return loss.detach(), x.grad, weight.grad


def assert_matches(x, weight, targets, rtol=1e-5, atol=1e-6, **kwargs):
    chunk = kwargs.pop("chunk_size", None)
    want = loss_and_grads(reference, x, weight, targets, **kwargs)
    got = loss_and_grads(linear_cross_entropy, x, weight, targets, chunk_size=chunk, **kwargs)
    for name, g, w in zip(("loss", "dx", "dweight"), got, want, strict=True):
        assert g.dtype == w.dtype, name
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol, msg=name)
    return got


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("softcap", [None, 4.0])
@pytest.mark.parametrize("shape,chunk", [((37,), 16), ((3, 13), 8), ((2, 5, 7), None)])
def test_fp32_value_and_gradients_equal_the_full_logits_path(shape, chunk, softcap, reduction):
    # token counts 37, 39, 70 are no multiple of the chunk; vocab 101 no multiple of anything
    x, weight, targets = inputs(shape, 24, 101)
    loss, dx, dw = assert_matches(
        x, weight, targets, chunk_size=chunk, reduction=reduction, softcap=softcap
    )
    assert loss.dtype == torch.float32 and dx.shape == x.shape and dw.shape == weight.shape


def test_a_chunk_of_one_token_and_a_chunk_larger_than_all_tokens():
    x, weight, targets = inputs((9,), 8, 33)
    assert_matches(x, weight, targets, chunk_size=1)
    assert_matches(x, weight, targets, chunk_size=1000)


def test_other_ignore_index_and_ignored_rows_get_no_gradient():
    x, weight, targets = inputs((20,), 8, 30, ignored=6, ignore_index=3)
    _, dx, _ = assert_matches(x, weight, targets, chunk_size=7, ignore_index=3)
    assert (dx[targets == 3] == 0).all() and (dx[targets != 3] != 0).any()


def test_all_targets_ignored_gives_torchs_nan_mean_zero_sum_and_zero_gradients():
    x, weight, targets = inputs((10,), 8, 16, ignored=10)
    loss, dx, dw = loss_and_grads(linear_cross_entropy, x, weight, targets, chunk_size=4)
    want = loss_and_grads(reference, x, weight, targets)
    assert loss.isnan() and want[0].isnan()  # 0/0, as torch's mean
    assert (dx == 0).all() and (dw == 0).all()
    assert (want[1] == 0).all() and (want[2] == 0).all()
    total, dx, dw = loss_and_grads(linear_cross_entropy, x, weight, targets, reduction="sum")
    assert total == 0 and (dx == 0).all() and (dw == 0).all()


def test_bf16_inputs_take_the_softmax_in_fp32_within_bf16_tolerance():
    x, weight, targets = inputs((45,), 32, 77, dtype=torch.bfloat16)
    loss, dx, dw = assert_matches(x, weight, targets, chunk_size=16, rtol=2e-2, atol=2e-3)
    assert loss.dtype == torch.float32 and dx.dtype == dw.dtype == torch.bfloat16


def test_autocast_runs_the_matmuls_in_bf16_and_gives_fp32_gradients():
    x, weight, targets = inputs((40,), 32, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = loss_and_grads(reference, x, weight, targets)
        got = loss_and_grads(linear_cross_entropy, x, weight, targets, chunk_size=16)
    fp32 = loss_and_grads(reference, x, weight, targets)
    for name, g, w, f in zip(("loss", "dx", "dweight"), got, want, fp32, strict=True):
        assert g.dtype == torch.float32, name
        torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-3, msg=name)
        assert not torch.equal(g, f), name  # bf16 matmuls really ran


def test_inputs_without_requires_grad_get_none_and_no_grad_mode_keeps_the_value():
    x, weight, targets = inputs((30,), 16, 50)
    want = loss_and_grads(reference, x, weight, targets)
    frozen = weight.detach()
    loss = linear_cross_entropy(x, frozen, targets, chunk_size=8)
    loss.backward()
    torch.testing.assert_close(x.grad, want[1], rtol=1e-5, atol=1e-6)
    x.grad = None
    fixed_x = x.detach()
    linear_cross_entropy(fixed_x, weight, targets, chunk_size=8).backward()
    torch.testing.assert_close(weight.grad, want[2], rtol=1e-5, atol=1e-6)
    assert fixed_x.grad is None and frozen.grad is None
    with torch.no_grad():
        value = linear_cross_entropy(x, weight, targets, chunk_size=8)
    assert not value.requires_grad
    torch.testing.assert_close(value, want[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("factor", [3.0, 1.0])  # 1: the saved gradients are handed over
def test_backward_scales_by_the_incoming_gradient_and_can_run_twice(factor):
    x, weight, targets = inputs((12,), 8, 20)
    want = loss_and_grads(lambda *a: reference(*a) * factor, x, weight, targets)
    x.grad = weight.grad = None
    loss = linear_cross_entropy(x, weight, targets, chunk_size=5) * factor
    loss.backward(retain_graph=True)
    torch.testing.assert_close(x.grad, want[1], rtol=1e-5, atol=1e-6)
    loss.backward()  # the saved gradients were neither scaled nor accumulated into
    torch.testing.assert_close(x.grad, 2 * want[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weight.grad, 2 * want[2], rtol=1e-5, atol=1e-6)


def test_gradcheck_in_float64_and_no_double_backward():
    x, weight, targets = inputs((7,), 4, 9, dtype=torch.float64, ignored=2)

    def fn(a, b):
        return linear_cross_entropy(a, b, targets, chunk_size=3, softcap=2.0)

    assert torch.autograd.gradcheck(fn, (x, weight))
    (dx,) = torch.autograd.grad(fn(x, weight), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|does not require grad"):
        dx.sum().backward()


class LargestTensor(TorchDispatchMode):
    """Records the element count of the largest tensor any op creates."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def largest_created_and_saved(fn, x, weight, targets):
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with LargestTensor() as mode:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = fn(x, weight, targets)
        loss.backward()
    return mode.largest, saved


def test_no_tokens_by_vocab_tensor_is_ever_created_or_saved():
    tokens, d, vocab, chunk = 300, 16, 257, 64
    x, weight, targets = inputs((tokens,), d, vocab)

    largest, saved = largest_created_and_saved(reference, x, weight, targets)
    assert largest >= tokens * vocab and max(saved) >= tokens * vocab  # the trackers see it

    def fused(a, b, t):
        return linear_cross_entropy(a, b, t, chunk_size=chunk)

    largest, saved = largest_created_and_saved(fused, x, weight, targets)
    assert largest == chunk * vocab  # one chunk's logits
    assert sorted(saved) == sorted([tokens * d, vocab * d])  # just dx and dW


def test_default_chunk_keeps_a_chunks_logits_near_32_mib():
    assert default_chunk_size(32768) == 256  # 256 · 32768 · 4 bytes = 32 MiB
    assert default_chunk_size(262144) == 128  # at least 128 tokens feed the matmul
    assert default_chunk_size(100) == 4096
    x, weight, targets = inputs((50,), 8, 40)
    assert_matches(x, weight, targets)  # chunk_size=None


@pytest.mark.parametrize(
    "change,match",
    [
        ({"targets": torch.zeros(5, dtype=torch.long)}, "one target per row"),
        ({"targets": torch.full((6,), 40)}, "outside the vocabulary"),
        ({"targets": torch.zeros(6)}, "int64"),
        ({"weight": torch.randn(40, 7)}, r"weight \(vocab, d\)"),
        ({"weight": torch.randn(40, 8, dtype=torch.float64)}, "one dtype"),
        ({"reduction": "none"}, "reduction"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"softcap": 0.0}, "softcap"),
    ],
)
def test_bad_input_raises_a_one_line_error(change, match):
    targets = torch.zeros(6, dtype=torch.long)
    args = {"x": torch.randn(6, 8), "weight": torch.randn(40, 8), "targets": targets}
    args.update(change)
    with pytest.raises(LmforgeError, match=match):
        linear_cross_entropy(**args)
