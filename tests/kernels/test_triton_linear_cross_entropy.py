"""The Triton fused linear + cross-entropy under the interpreter (fp32) against
F.cross_entropy(hidden @ weight.T): loss and both gradients, ignored targets, a vocabulary
that spans several partial blocks and a last chunk shorter than the others."""

import pytest
import torch
import torch.nn.functional as F

from lmforge.errors import LmforgeError
from lmforge.kernels.triton import interpreted, load
from lmforge.kernels.triton.interpreted import forward_backward, run_interpreted

interpreted.start()


def problem(tokens_shape, vocab=131, d=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(*tokens_shape, d, generator=g)
    weight = torch.randn(vocab, d, generator=g) * 0.3
    targets = torch.randint(0, vocab, tokens_shape, generator=g)
    return hidden, weight, targets


def reference(hidden, weight, targets):
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss = F.cross_entropy((h @ w.T).flatten(0, -2), targets.flatten(), ignore_index=-100)
    loss.backward()
    return loss.detach(), h.grad, w.grad


def triton(hidden, weight, targets, **options):
    loss, grads = forward_backward(
        "linear_cross_entropy", "linear_cross_entropy", hidden.clone().requires_grad_(),
        weight.clone().requires_grad_(), targets, grad=torch.tensor(1.0), **options,
    )  # fmt: skip
    return loss, *grads


def assert_equal(got, want):
    for name, a, b in zip(("loss", "d_hidden", "d_weight"), got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"{name} differs")


@pytest.mark.parametrize(("shape", "chunk"), [((53,), 16), ((2, 13), None), ((7,), 64)])
def test_loss_and_gradients_equal_cross_entropy_of_the_full_logits(shape, chunk):
    hidden, weight, targets = problem(shape)
    targets.view(-1)[::5] = -100  # ignored rows: no loss, no gradient, not counted in the mean
    got = triton(hidden, weight, targets, chunk_size=chunk)
    assert_equal(got, reference(hidden, weight, targets))


def test_every_target_ignored_gives_nan_and_zero_gradients_as_torch():
    hidden, weight, targets = problem((9,))
    targets[:] = -100
    loss, d_hidden, d_weight = triton(hidden, weight, targets, chunk_size=4)
    want = reference(hidden, weight, targets)
    assert loss.isnan() and want[0].isnan()
    assert torch.equal(d_hidden, want[1]) and torch.equal(d_weight, want[2])
    assert not d_hidden.any() and not d_weight.any()


def test_a_frozen_weight_gets_no_gradient():
    hidden, weight, targets = problem((20,))
    loss, grads = forward_backward(
        "linear_cross_entropy", "linear_cross_entropy", hidden.clone().requires_grad_(), weight,
        targets, grad=torch.tensor(2.0), chunk_size=8,
    )  # fmt: skip
    want = reference(hidden, weight, targets)
    assert len(grads) == 1
    torch.testing.assert_close(loss, want[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads[0], 2 * want[1], rtol=1e-5, atol=1e-6)


def test_targets_outside_the_vocabulary_are_a_clear_error():
    ce = load("linear_cross_entropy")  # checked before any kernel runs
    hidden, weight, targets = problem((6,))
    targets[2] = 131
    with pytest.raises(LmforgeError, match="outside the vocabulary"):
        ce.linear_cross_entropy(hidden, weight, targets)
    with pytest.raises(LmforgeError, match="one target per hidden row"):
        ce.linear_cross_entropy(hidden, weight, targets[:5])


def largest_tensor(hidden, weight, targets, chunk_size):
    """(in the child) The most bytes of any tensor torch creates in forward and backward (the
    interpreter's copies of kernel arguments included)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        most = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, tuple | list) else (out,):
                if isinstance(t, torch.Tensor):
                    Largest.most = max(Largest.most, t.numel() * t.element_size())
            return out

    ce = load("linear_cross_entropy")
    with Largest():
        ce.linear_cross_entropy(hidden, weight, targets, chunk_size=chunk_size).backward()
    return Largest.most


def test_the_whole_logits_never_exist():
    hidden, weight, targets = problem((96,), vocab=131, d=8)
    hidden.requires_grad_()
    weight.requires_grad_()
    most = run_interpreted(__file__, "largest_tensor", hidden=hidden, weight=weight,
                           targets=targets, chunk_size=32)  # fmt: skip
    assert most == 32 * 131 * 4  # one chunk's fp32 logits, a third of the (96 x 131) whole
