"""GRPO's policy updates on the training core it shares with pretraining (train/).

`PolicyTrainer` composes the policy for its device and layout (train/compose.py: precision,
activation checkpointing, compile, DDP or FSDP), builds the optimizer (train/optimizers.py, betas
`rl.beta1`/`rl.beta2`) and the non-finite guard, and takes `num_iterations` optimizer steps on a
step's rollouts: micro-batched forward and backward of the clipped loss (grpo_loss.py), each
micro-batch normalised by the whole batch's denominators, then `train.step.optimizer_step`
(unscale, clip, and the update taken or, non-finite, skipped). Its learning rate is constant
after a linear warmup (`warmup_lr`).

Under torchrun every rank holds the whole batch (groups.py gathers it); each data rank trains
on its contiguous slice of the rows, its loss multiplied by the number of data ranks, so that the
average DDP and FSDP take of the ranks' gradients is the one process's gradient. Every rank runs
as many micro-batches as the others (FSDP gathers weights in each forward): a rank with fewer
rows pads with micro-batches that weigh nothing.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from lmforge.model import Transformer
from lmforge.parallel.layout import ParallelOptions
from lmforge.parallel.world import World
from lmforge.posttrain.groups import Collected
from lmforge.posttrain.grpo_loss import LossOptions, policy_loss, token_logprobs
from lmforge.posttrain.rl_config import RlConfig
from lmforge.posttrain.rollout import batch_tensors
from lmforge.train.compose import compose
from lmforge.train.guard import NonFiniteGuard
from lmforge.train.optimizers import build_optimizer
from lmforge.train.precision import make_precision
from lmforge.train.step import optimizer_step, set_lr


def warmup_lr(cfg: RlConfig, step: int) -> float:
    """GRPO's learning rate at `step`: `lr` after a linear warmup of `warmup_steps`."""
    return cfg.lr * min(1.0, (step + 1) / max(cfg.warmup_steps, 1))


@dataclass(frozen=True)
class Micro:
    """One micro-batch of a data rank's rows; a padding one (`live` false) weighs nothing."""

    rows: slice
    live: bool = True


class PolicyTrainer:
    """The policy's optimizer steps on one step's rollouts, on the shared training core: the
    policy composed for `world` (train/compose.py), micro-batched forward and backward of the
    clipped loss with the whole batch's normalisers, and each update through
    `optimizer_step` with the non-finite guard. Under torchrun this rank trains on its slice of
    the rows (`micro_batches`)."""

    def __init__(
        self, policy: Transformer, cfg: RlConfig, device: torch.device, world: World | None = None
    ) -> None:
        self.policy, self.cfg = policy, cfg
        self.world = world or World.single(device)
        self.device = self.world.device
        self.precision = make_precision(cfg.precision, self.device)
        self.reference = None
        if cfg.beta > 0:  # a frozen, whole copy of the starting policy on every rank
            self.reference = copy.deepcopy(policy).eval().requires_grad_(False)
        self.composed = compose(
            policy, self.precision, self.device, cfg.activation_checkpointing, cfg.compile,
            self.world, ParallelOptions(),
        )  # fmt: skip
        self.optimizer = build_optimizer(policy, cfg.lr, (cfg.beta1, cfg.beta2), cfg.weight_decay)
        self.guard = NonFiniteGuard(self.device, cfg.max_bad_steps)
        self.options = LossOptions(
            cfg.eps_low, cfg.eps_high, cfg.beta, cfg.loss_norm, cfg.max_new_tokens
        )

    def _logprobs(self, model, inputs, targets) -> tuple[torch.Tensor, torch.Tensor]:
        with self.precision.autocast():
            logits = model(inputs)
        return token_logprobs(logits, targets, self.cfg.temperature)

    def micro_batches(self, n: int) -> list[Micro]:
        """This data rank's micro-batches of a batch of `n` rows: its contiguous slice, in
        `micro_batch`-row pieces, as many on every rank (padding ones where it has fewer)."""
        ranks, rank = self.world.layout.data_parallel, self.world.data_rank
        share = math.ceil(n / ranks)
        start, end = min(rank * share, n), min((rank + 1) * share, n)
        size = self.cfg.micro_batch
        micro = []
        for first in range(start, start + max(share, 1), size):
            rows = slice(first, min(first + size, end))
            micro.append(Micro(rows) if rows.start < rows.stop else Micro(slice(0, 1), False))
        return micro

    def _no_grad_logprobs(self, model, tensors, micro: list[Micro]) -> list[torch.Tensor]:
        inputs, targets, _ = tensors
        with torch.no_grad():
            return [self._logprobs(model, inputs[m.rows], targets[m.rows])[0] for m in micro]

    def train(self, step: int, collected: Collected) -> dict:
        """num_iterations optimizer steps on `collected`; the step's training metrics."""
        cfg, compute = self.cfg, self.composed.compute
        tensors = batch_tensors(collected.rollouts, self.device)
        inputs, targets, mask = tensors
        advantages = collected.advantages.to(self.device)
        micro = self.micro_batches(len(inputs))
        total_tokens, total_rows = int(mask.sum()), len(inputs)
        old = self._no_grad_logprobs(compute, tensors, micro) if cfg.num_iterations > 1 else None
        ref = self._no_grad_logprobs(self.reference, tensors, micro) if self.reference else None
        engine = _padded([r.logprobs for r in collected.rollouts], mask)
        lr = warmup_lr(cfg, step)
        set_lr(self.optimizer, lr)
        scale = self.world.layout.data_parallel  # DDP and FSDP average the ranks' gradients
        sums = torch.zeros(5, dtype=torch.float64)  # loss, clipped, kl, entropy, engine gap
        for iteration in range(cfg.num_iterations):
            loss_sum = torch.zeros((), device=self.device)
            for k, m in enumerate(micro):
                s = m.rows
                weight = mask[s] if m.live else torch.zeros_like(mask[s])
                with self.composed.micro_step(last=k == len(micro) - 1):
                    logp, entropy = self._logprobs(compute, inputs[s], targets[s])
                    old_k = logp.detach() if old is None else old[k]
                    loss, stats = policy_loss(
                        logp, old_k, advantages[s], weight, self.options,
                        ref[k] if ref else None, total_tokens, total_rows,
                    )  # fmt: skip
                    self.precision.scale_loss(loss * scale).backward()
                loss_sum += loss.detach()
                if iteration == 0:
                    gap = (logp.detach() - engine[s]).abs() * weight
                    sums += torch.tensor([
                        float(loss.detach()), stats.clip_fraction * stats.active_tokens,
                        stats.kl * stats.active_tokens, float((entropy.detach() * weight).sum()),
                        float(gap.sum()),
                    ], dtype=torch.float64)  # fmt: skip
            grad_norm, _ = optimizer_step(
                self.composed, self.optimizer, self.guard, loss_sum, cfg.grad_clip
            )
        loss, clipped, kl, entropy, gap = self._summed(sums).tolist()
        n = max(total_tokens, 1)
        record = {
            "loss": loss,
            "grad_norm": float(grad_norm),
            "clip_fraction": clipped / n,
            "entropy": entropy / n,
            "lr": lr,
        }
        if cfg.beta > 0:
            record["kl"] = kl / n
        if cfg.temperature == 1.0:  # the engine's log-probs are at T = 1
            record["engine_gap"] = gap / n
        return record

    def _summed(self, sums: torch.Tensor) -> torch.Tensor:
        """`sums` added over the data ranks (every rank is one: rl has no tensor parallel)."""
        if not self.world.is_distributed:
            return sums
        import torch.distributed as dist

        total = sums.to(self.device)
        dist.all_reduce(total)
        return total.cpu()

    def state_dict(self) -> dict:
        return {"guard": self.guard.state_dict(), "precision": self.precision.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if "guard" in state:  # written before the guard came to GRPO: a clean run
            self.guard.load_state_dict(state["guard"])
        self.precision.load_state_dict(state.get("precision", {}))


def _padded(rows: list[list[float]], mask: torch.Tensor) -> torch.Tensor:
    """Per-token values of each completion laid out where `mask` has its completion tokens."""
    out = torch.zeros_like(mask)
    for i, values in enumerate(rows):
        where = mask[i].nonzero().flatten()
        out[i, where[: len(values)]] = torch.tensor(values[: len(where)], dtype=out.dtype)
    return out
