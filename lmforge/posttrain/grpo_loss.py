"""GRPO's arithmetic: group-relative advantages and the clipped policy loss, with each paper's
normalisation.

- Advantages (GRPO, Shao et al. 2024): G completions per prompt, A = (r - mean_group) /
  (std_group + eps); `scale="batch"` divides by the whole batch's std, `scale="none"` is
  Dr.GRPO's (Liu et al. 2025) unscaled r - mean. The std is torch's default (unbiased), as TRL's.
  Groups whose rewards are all equal carry no signal and are flagged (DAPO's dynamic sampling
  drops and refills them).
- Per-token loss: -min(ρ·A, clip(ρ, 1 - ε_low, 1 + ε_high)·A) with ρ = exp(logp - logp_old)
  (DAPO's clip-higher: ε_high > ε_low), plus β·k3, k3 = exp(ref - logp) - (ref - logp) - 1, the
  KL estimator to a frozen reference.
- Aggregation: `dapo` sums over every active token of the global batch and divides by their
  count; `grpo` averages each sequence over its tokens, then over sequences; `dr_grpo` sums and
  divides by B · max_len. `total_active_tokens` / `total_sequences` give a micro-batch the
  global batch's denominators, so micro-batch losses add up to the full batch's exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lmforge.errors import LmforgeError
from lmforge.posttrain.rl_config import NORMS, SCALES


def group_advantages(
    rewards: torch.Tensor, group_size: int, scale: str = "group", eps: float = 1e-4
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages (N·G,), zero_variance (N,)) for rewards laid out group after group."""
    if scale not in SCALES:
        raise LmforgeError(f"unknown reward scaling {scale!r}: choose one of {', '.join(SCALES)}")
    if group_size < 2 or rewards.numel() % group_size:
        raise LmforgeError(
            f"{rewards.numel()} rewards do not split into groups of {group_size}: the group "
            "size must be at least 2 and divide the number of completions"
        )
    groups = rewards.float().view(-1, group_size)
    centered = groups - groups.mean(dim=1, keepdim=True)
    zero_variance = (groups == groups[:, :1]).all(dim=1)
    if scale == "group":
        centered = centered / (groups.std(dim=1, keepdim=True) + eps)
    elif scale == "batch":
        centered = centered / (groups.std() + eps)
    return centered.flatten(), zero_variance


def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(target), entropy), each (B, T), in fp32, from logits (B, T, V) of any dtype."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    chosen = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return chosen, entropy


@dataclass
class LossOptions:
    eps_low: float = 0.2
    eps_high: float = 0.28  # DAPO's clip-higher
    beta: float = 0.0  # the k3 KL penalty's weight (0: no reference model)
    norm: str = "dapo"
    max_len: int | None = None  # dr_grpo's constant (the generation cap); default: mask's T

    def validate(self) -> None:
        if self.norm not in NORMS:
            raise LmforgeError(f"unknown loss norm {self.norm!r}: choose one of {', '.join(NORMS)}")
        if self.eps_low < 0 or self.eps_high < 0 or self.beta < 0:
            raise LmforgeError(
                f"eps_low, eps_high and beta must be at least 0, got {self.eps_low}, "
                f"{self.eps_high}, {self.beta}"
            )


@dataclass
class LossStats:
    clip_fraction: float  # active tokens whose clip zeroed the gradient
    kl: float  # mean k3 over active tokens (0 without a reference)
    ratio_mean: float
    active_tokens: int


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    options: LossOptions,
    ref_logprobs: torch.Tensor | None = None,
    total_active_tokens: int | None = None,
    total_sequences: int | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """The clipped surrogate loss over completion tokens (mask (B, T) of 0/1)."""
    options.validate()
    mask = mask.to(logprobs.dtype)
    ratio = torch.exp(logprobs - old_logprobs)
    adv = advantages.to(logprobs.dtype)[:, None]
    clipped_ratio = ratio.clamp(1 - options.eps_low, 1 + options.eps_high)
    per_token = -torch.minimum(ratio * adv, clipped_ratio * adv)
    kl = torch.zeros_like(per_token)
    if ref_logprobs is not None and options.beta:
        delta = ref_logprobs - logprobs
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + options.beta * kl
    active = int(mask.sum())
    if options.norm == "dapo":
        loss = (per_token * mask).sum() / max(total_active_tokens or active, 1)
    elif options.norm == "grpo":
        lengths = mask.sum(dim=1).clamp(min=1)
        loss = ((per_token * mask).sum(dim=1) / lengths).sum() / (total_sequences or len(mask))
    else:
        max_len = options.max_len or mask.shape[1]
        loss = (per_token * mask).sum() / ((total_sequences or len(mask)) * max_len)
    with torch.no_grad():
        clipped = ((ratio < 1 - options.eps_low) & (adv < 0)) | (
            (ratio > 1 + options.eps_high) & (adv > 0)
        )
        n = max(active, 1)
        stats = LossStats(
            clip_fraction=float((clipped * mask).sum()) / n,
            kl=float((kl * mask).sum()) / n,
            ratio_mean=float((ratio * mask).sum()) / n,
            active_tokens=active,
        )
    return loss, stats
