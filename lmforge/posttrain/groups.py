"""A GRPO step's groups: the problems drawn, their completions sampled through the engine and
scored, and dynamic sampling over them.

Each round draws `prompts_per_step` problems from the pool, seeded by the run's seed, the step
and the round. Groups whose completions all score the same carry no signal:
`dynamic_sampling="drop"` (DAPO) replaces them with fresh problems, up to `max_refills` extra
rounds; `"count"` keeps and counts them. Under torchrun each rank samples and scores its share
of a round (`rollout.Shares`, seeded by the problems' places in the whole round) and the ranks
gather the groups, so every rank holds the round one process samples and drops the same groups.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from lmforge.posttrain.grpo_loss import group_advantages
from lmforge.posttrain.rl_config import RlConfig
from lmforge.posttrain.rollout import ONE_PROCESS, Rollout, RolloutEngine, Shares
from lmforge.posttrain.tasks import exact_answer
from lmforge.posttrain.tasks.problem import Problem

Group = tuple[list[Rollout], list[float], list[float]]  # a problem's rollouts, rewards, correct


@dataclass
class Collected:
    """A step's rollouts, their rewards and advantages, after dynamic sampling."""

    rollouts: list[Rollout]
    group_size: int
    rewards: torch.Tensor
    advantages: torch.Tensor
    correct: torch.Tensor
    groups_drawn: int
    zero_variance: int  # groups whose completions all scored the same
    rounds: int
    rollout_seconds: float
    generated_tokens: int  # by every round, dropped groups' completions included


class GroupSampler:
    """Problems for each step's rounds, and their scored, grouped rollouts (under torchrun each
    rank samples and scores its `shares` of a round, and every rank gets the whole round)."""

    def __init__(
        self,
        cfg: RlConfig,
        pool: list[Problem],
        reward,
        engine: RolloutEngine,
        shares: Shares = ONE_PROCESS,
    ) -> None:
        self.cfg, self.pool, self.reward, self.engine = cfg, pool, reward, engine
        self.shares = shares

    def draw(self, step: int, round_: int) -> list[Problem]:
        rng = random.Random(f"{self.cfg.seed}:{step}:{round_}")
        return rng.sample(self.pool, min(self.cfg.prompts_per_step, len(self.pool)))

    def sample_round(self, problems: list[Problem], round_id: int) -> tuple[list[Group], float]:
        """Each problem's scored group, in the round's order, and this rank's seconds."""
        cfg, G = self.cfg, self.cfg.group_size
        mine = self.shares.mine(len(problems))
        local = [problems[i] for i in mine]
        batch = self.engine.sample(
            local, G, cfg.temperature, cfg.top_k, cfg.seed, round_id, indices=mine
        )
        scored = []
        for k, (i, problem) in enumerate(zip(mine, local, strict=True)):
            group = batch.rollouts[k * G : (k + 1) * G]
            fields = problem.reward_fields()
            rewards = [self.reward(problem.prompt, r.text, **fields) for r in group]
            correct = [exact_answer(problem.prompt, r.text, **fields) for r in group]
            scored.append((i, (group, rewards, correct)))
        return self.shares.gather(scored), batch.seconds

    def collect(self, step: int) -> Collected:
        cfg, G = self.cfg, self.cfg.group_size
        kept: list[Group] = []
        drawn = zero = rounds = generated = 0
        seconds = 0.0
        while len(kept) < cfg.prompts_per_step and rounds <= cfg.max_refills:
            groups, round_seconds = self.sample_round(self.draw(step, rounds), step * 1000 + rounds)
            seconds += round_seconds
            generated += sum(len(r.completion_ids) for group, _, _ in groups for r in group)
            rounds += 1
            for group, rewards, correct in groups:
                drawn += 1
                same = all(x == rewards[0] for x in rewards)
                zero += same
                if same and cfg.dynamic_sampling == "drop":
                    continue
                kept.append((group, rewards, correct))
            if cfg.dynamic_sampling == "count":
                break
        kept = kept[: cfg.prompts_per_step]
        rollouts = [r for group, _, _ in kept for r in group]
        rewards = torch.tensor([x for _, rs, _ in kept for x in rs])
        correct = torch.tensor([x for _, _, cs in kept for x in cs])
        advantages = group_advantages(rewards, G, cfg.scale_rewards)[0] if kept else torch.zeros(0)
        return Collected(
            rollouts, G, rewards, advantages, correct, drawn, zero, rounds, seconds, generated
        )
