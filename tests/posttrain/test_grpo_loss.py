"""GRPO's advantages and losses against slow references written from the formulas."""

import math

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.posttrain.grpo_loss import (
    NORMS,
    LossOptions,
    group_advantages,
    policy_loss,
    token_logprobs,
)


def _slow_advantages(rewards, g, scale, eps=1e-4):
    r = [float(x) for x in rewards]
    out = []
    whole_mean = sum(r) / len(r)
    whole_std = math.sqrt(sum((x - whole_mean) ** 2 for x in r) / (len(r) - 1))
    for i in range(0, len(r), g):
        group = r[i : i + g]
        mean = sum(group) / g
        std = math.sqrt(sum((x - mean) ** 2 for x in group) / (g - 1))
        for x in group:
            if scale == "group":
                out.append((x - mean) / (std + eps))
            elif scale == "batch":
                out.append((x - mean) / (whole_std + eps))
            else:
                out.append(x - mean)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_advantages_match_the_formula(scale):
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 2.0, 1.0, 0.0, 3.0])
    adv, zero = group_advantages(rewards, 4, scale)
    assert torch.allclose(adv.double(), _slow_advantages(rewards, 4, scale), atol=1e-6)
    assert zero.tolist() == [False, True, False]
    assert adv[4:8].abs().max() == 0


def _slow_loss(logp, old, adv, mask, opt, ref):
    """Python loops over sequences and tokens, float64."""
    b, t = mask.shape
    total, seq_means, active = 0.0, [], 0
    for i in range(b):
        row, n = 0.0, 0
        for j in range(t):
            if not mask[i, j]:
                continue
            ratio = torch.exp(logp[i, j] - old[i, j])
            clipped = ratio.clamp(1 - opt.eps_low, 1 + opt.eps_high)
            value = -torch.minimum(ratio * adv[i], clipped * adv[i])
            if ref is not None:
                d = ref[i, j] - logp[i, j]
                value = value + opt.beta * (torch.exp(d) - d - 1)
            row, n = row + value, n + 1
        total += row
        active += n
        seq_means.append(row / n if n else 0.0)
    if opt.norm == "dapo":
        return total / active
    if opt.norm == "grpo":
        return sum(seq_means) / b
    return total / (b * (opt.max_len or t))


def _batch(seed=0, b=5, t=7):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    logp = (old + torch.randn(b, t, generator=g, dtype=torch.float64) * 0.3).requires_grad_()
    ref = old + torch.randn(b, t, generator=g, dtype=torch.float64) * 0.2
    adv = torch.randn(b, generator=g, dtype=torch.float64)
    lengths = [7, 3, 0, 5, 1]
    mask = torch.tensor([[1] * n + [0] * (t - n) for n in lengths], dtype=torch.float64)
    return logp, old, adv, mask, ref


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("beta", [0.0, 0.05])
def test_loss_and_gradient_match_the_formula(norm, beta):
    logp, old, adv, mask, ref = _batch()
    opt = LossOptions(norm=norm, beta=beta, max_len=9 if norm == "dr_grpo" else None)
    loss, stats = policy_loss(logp, old, adv, mask, opt, ref if beta else None)
    (grad,) = torch.autograd.grad(loss, logp)
    slow = _slow_loss(logp, old, adv, mask, opt, ref if beta else None)
    (slow_grad,) = torch.autograd.grad(slow, logp)
    assert torch.isfinite(loss)
    assert abs(float(loss.detach()) - float(slow.detach())) < 1e-9
    assert torch.allclose(grad, slow_grad, atol=1e-9)
    assert stats.active_tokens == 16


@pytest.mark.parametrize("norm", NORMS)
def test_micro_batches_add_up_to_the_global_batch(norm):
    logp, old, adv, mask, ref = _batch(seed=1)
    opt = LossOptions(norm=norm, beta=0.1)
    whole, _ = policy_loss(logp, old, adv, mask, opt, ref)
    (g_whole,) = torch.autograd.grad(whole, logp)
    totals = {"total_active_tokens": int(mask.sum()), "total_sequences": len(mask)}
    parts = [
        policy_loss(logp[s], old[s], adv[s], mask[s], opt, ref[s], **totals)[0]
        for s in (slice(0, 2), slice(2, 5))
    ]
    (g_parts,) = torch.autograd.grad(sum(parts), logp)
    assert abs(float(sum(parts).detach()) - float(whole.detach())) < 1e-12
    assert torch.allclose(g_parts, g_whole, atol=1e-12)


def test_clip_higher_and_the_clip_fraction():
    mask = torch.ones(1, 1, dtype=torch.float64)
    up = torch.tensor([[math.log(1.25)]], dtype=torch.float64)
    zero = torch.zeros(1, 1, dtype=torch.float64)
    positive = torch.ones(1, dtype=torch.float64)
    assert policy_loss(up, zero, positive, mask, LossOptions(eps_high=0.28))[1].clip_fraction == 0
    assert policy_loss(up, zero, positive, mask, LossOptions(eps_high=0.2))[1].clip_fraction == 1
    # a negative advantage is clipped below 1 - eps_low only
    assert policy_loss(up, zero, -positive, mask, LossOptions(eps_high=0.2))[1].clip_fraction == 0
    down = torch.tensor([[math.log(0.7)]], dtype=torch.float64)
    assert policy_loss(down, zero, -positive, mask, LossOptions())[1].clip_fraction == 1


def test_on_policy_gradient_is_the_policy_gradient():
    logp, _, adv, mask, _ = _batch(seed=2)
    loss, stats = policy_loss(logp, logp.detach(), adv, mask, LossOptions())
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.allclose(grad, -adv[:, None] * mask / mask.sum())
    assert stats.ratio_mean == pytest.approx(1.0) and stats.clip_fraction == 0


def test_token_logprobs_and_entropy():
    logits = torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(0))
    targets = torch.randint(0, 11, (2, 3), generator=torch.Generator().manual_seed(1))
    chosen, entropy = token_logprobs(logits, targets)
    full = torch.log_softmax(logits, -1)
    assert torch.allclose(chosen, full.gather(-1, targets[..., None])[..., 0])
    assert torch.allclose(entropy, -(full.exp() * full).sum(-1))
    half, _ = token_logprobs(logits.bfloat16(), targets)
    assert half.dtype == torch.float32


def test_bad_options_are_refused():
    with pytest.raises(LmforgeError, match="unknown reward scaling"):
        group_advantages(torch.zeros(4), 2, "rank")
    with pytest.raises(LmforgeError, match="groups of 3"):
        group_advantages(torch.zeros(4), 3)
    logp, old, adv, mask, _ = _batch()
    with pytest.raises(LmforgeError, match="unknown loss norm"):
        policy_loss(logp, old, adv, mask, LossOptions(norm="mean"))
    with pytest.raises(LmforgeError, match="at least 0"):
        policy_loss(logp, old, adv, mask, LossOptions(eps_low=-0.1))
