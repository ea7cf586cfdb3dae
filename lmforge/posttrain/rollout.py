"""Rollouts for RL from lmforge's own engine: G sampled completions per prompt with the log-
probabilities of their tokens, and greedy answers for held-out accuracy.

The engine decodes a copy of the policy (its KV cache and compiled step are built once, for
the whole run); after each optimizer step `sync` copies the trainer's weights into that copy
in place (`Engine.load_weights`), gathering them whole first when FSDP shards them. Every
request has its own seed, a function of the run's seed, the step and the request's place in the
whole batch, so a step's rollouts are the same whatever else is batched with them, a resumed
run samples what the first run did, and under torchrun the ranks can each sample a share of a
batch (`Shares`: rank r takes problems r, r + size, ...) and gather the same rollouts one
process samples.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from lmforge.infer.engine import Engine, SamplingParams
from lmforge.model import Transformer
from lmforge.parallel.world import World
from lmforge.posttrain.tasks.problem import Problem
from lmforge.tokenizer.chat_template import ChatTemplate, Message

SEED_MODULUS = 2**63
T = TypeVar("T")


@dataclass
class Rollout:
    group: int  # the index of its prompt in the (whole) batch
    prompt_ids: list[int]
    completion_ids: list[int]  # as sampled, the token that ended the reply included
    logprobs: list[float]  # the engine's log p of each completion token (softmax at T = 1)
    text: str  # the reply, stop strings and the end token removed
    finish_reason: str  # "stop" or "length"


@dataclass
class RolloutBatch:
    rollouts: list[Rollout]
    seconds: float

    @property
    def tokens(self) -> int:
        return sum(len(r.completion_ids) for r in self.rollouts)


def request_seed(seed: int, step: int, index: int) -> int:
    """The sampling seed of request `index` of rollout round `step`."""
    return (((seed * 1_000_003) + step) * 1_000_033 + index) % SEED_MODULUS


@dataclass(frozen=True)
class Shares:
    """How the ranks of a run split a batch of problems: rank `rank` of `size` takes the
    problems at `mine(n)`; `gather` hands every rank all the results in the batch's order. The
    default, one process, takes them all."""

    rank: int = 0
    size: int = 1

    @classmethod
    def of(cls, world: World) -> Shares:
        return cls(world.rank, world.layout.world_size) if world.is_distributed else cls()

    def mine(self, n: int) -> list[int]:
        """The indices of this rank's problems in a batch of `n`."""
        return list(range(self.rank, n, self.size))

    def gather(self, local: list[tuple[int, T]]) -> list[T]:
        """Every rank's (index, result) pairs as the results in index order (a collective
        when there are several ranks: every rank must call it)."""
        pairs = local
        if self.size > 1:
            parts: list[Any] = [None] * self.size
            dist.all_gather_object(parts, local)
            pairs = [pair for part in parts for pair in part]
        return [result for _, result in sorted(pairs, key=lambda pair: pair[0])]


ONE_PROCESS = Shares()
"""The shares of a run on one process: all of every batch."""


class _Weights:
    """A state dict where `Engine.load_weights` expects a module."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        self.state = state

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.state


class RolloutEngine:
    """An inference engine over a copy of `policy`, with the chat template's prompts."""

    def __init__(
        self,
        policy: Transformer,
        template: ChatTemplate,
        max_new_tokens: int,
        max_batch_size: int = 64,
        compile: bool = False,
    ) -> None:
        self.template = template
        self.max_new_tokens = max_new_tokens
        model = copy.deepcopy(policy).eval()
        for p in model.parameters():
            p.requires_grad_(False)
        self.engine = Engine(
            model, template.tokenizer, max_batch_size=max_batch_size, compile=compile
        )

    def prompt_ids(self, problem: Problem) -> list[int]:
        return self.template.prompt_ids([Message("user", problem.prompt)])

    def sync(self, policy: nn.Module) -> None:
        """Load the policy's current weights into the engine's copy. Weights that FSDP
        shards are gathered whole first: then every rank must call this (a collective)."""
        if any(hasattr(p, "device_mesh") for p in policy.parameters()):
            from lmforge.parallel.state import full_state_dict

            policy = _Weights(full_state_dict(policy))
        self.engine.load_weights(policy)

    def sample(
        self,
        problems: Sequence[Problem],
        group_size: int,
        temperature: float,
        top_k: int,
        seed: int,
        step: int,
        indices: Sequence[int] | None = None,
    ) -> RolloutBatch:
        """`group_size` completions of each problem, laid out group after group. `indices`:
        the problems' places in the whole batch when these are a share of it (default: their
        places here); the sampling seeds and each rollout's `group` follow them."""
        prompts = [self.prompt_ids(p) for p in problems]
        indices = range(len(prompts)) if indices is None else indices
        requests, params, groups = [], [], []
        for i, ids in zip(indices, prompts, strict=True):
            for j in range(group_size):
                groups.append(i)
                requests.append(ids)
                params.append(
                    SamplingParams(
                        max_tokens=self.max_new_tokens,
                        temperature=temperature,
                        top_k=top_k or None,
                        stop=self.template.stop,
                        stop_ids=self.template.stop_ids,
                        seed=request_seed(seed, step, i * group_size + j),
                        logprobs=True,
                    )
                )
        start = time.perf_counter()
        completions = self.engine.generate(requests, params)
        seconds = time.perf_counter() - start
        rollouts = [
            Rollout(
                group=groups[k],
                prompt_ids=requests[k],
                completion_ids=c.token_ids,
                logprobs=c.logprobs or [],
                text=c.text,
                finish_reason=c.finish_reason,
            )
            for k, c in enumerate(completions)
        ]
        return RolloutBatch(rollouts, seconds)

    def answers(self, problems: Sequence[Problem]) -> list[str]:
        """Each problem's greedy reply."""
        params = SamplingParams(
            max_tokens=self.max_new_tokens,
            temperature=0.0,
            stop=self.template.stop,
            stop_ids=self.template.stop_ids,
        )
        return [
            c.text for c in self.engine.generate([self.prompt_ids(p) for p in problems], params)
        ]

    def close(self) -> None:
        self.engine.close()


EVAL_ROUND = -1  # the sampling seeds' round for held-out evaluation: the same at every stage


@dataclass
class Accuracy:
    """Held-out accuracy two ways: pass@1 at the rollout temperature, the mean over `samples`
    completions per problem (what RL optimises, and how nanochat's RL stage is evaluated),
    and the greedy reply's. Standard errors are over problems."""

    scores: list[float]  # per problem: the fraction of its sampled completions that are right
    greedy: list[bool]  # per problem: whether its greedy reply is right
    samples: int
    examples: list[dict]  # the first problems' prompts and greedy replies, for the report

    @property
    def value(self) -> float:
        return _mean(self.scores)

    @property
    def stderr(self) -> float:
        return _stderr(self.scores)

    @property
    def greedy_value(self) -> float:
        return _mean(self.greedy)

    @property
    def greedy_stderr(self) -> float:
        return _stderr(self.greedy)

    @property
    def total(self) -> int:
        return len(self.scores)

    def record(self) -> dict:
        return {
            "accuracy": self.value, "stderr": self.stderr, "samples": self.samples,
            "greedy_accuracy": self.greedy_value, "greedy_stderr": self.greedy_stderr,
            "total": self.total, "examples": self.examples, "scores": self.scores,
        }  # fmt: skip


def paired_gain(before: dict, after: dict) -> tuple[float, float]:
    """(after - before, its standard error) of two `Accuracy.record()`s on the same problems,
    from the per-problem differences (the pairing removes the problems' own difficulty)."""
    diffs = [b - a for a, b in zip(before["scores"], after["scores"], strict=True)]
    return _mean(diffs), _stderr(diffs)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / max(len(values), 1)


def _stderr(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = _mean(values)
    variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return math.sqrt(variance / len(values))


def held_out_accuracy(
    engine: RolloutEngine,
    problems: Sequence[Problem],
    reward,
    samples: int = 4,
    temperature: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    keep_replies: int = 3,
    shares: Shares = ONE_PROCESS,
) -> Accuracy:
    """`reward` (exact answer: 1 when right) of each problem's greedy reply and of `samples`
    sampled completions (seeded by `seed` alone, so every stage draws alike). With `shares`,
    each rank answers its share of the problems and every rank gets the whole result."""

    def right(problem: Problem, reply: str) -> bool:
        return reward(problem.prompt, reply, **problem.reward_fields()) >= 1.0

    mine = shares.mine(len(problems))
    local = [problems[i] for i in mine]
    replies = engine.answers(local)
    greedy = [right(p, reply) for p, reply in zip(local, replies, strict=True)]
    scores = [float(g) for g in greedy]
    if samples:
        batch = engine.sample(local, samples, temperature, top_k, seed, EVAL_ROUND, mine)
        hits = [right(problems[r.group], r.text) for r in batch.rollouts]
        scores = [_mean(hits[k * samples : (k + 1) * samples]) for k in range(len(local))]
    rows = zip(replies, greedy, scores, strict=True)
    results = shares.gather(list(zip(mine, rows, strict=True)))
    replies = [reply for reply, _, _ in results]
    greedy = [hit for _, hit, _ in results]
    scores = [score for _, _, score in results]
    examples = [
        {"prompt": p.prompt, "reply": reply, "right": hit}
        for p, reply, hit in zip(problems[:keep_replies], replies, greedy, strict=False)
    ]
    return Accuracy(scores, greedy, samples, examples)


def batch_tensors(
    rollouts: Sequence[Rollout], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(inputs, targets, mask), each (B, T): prompt + completion right-padded, targets shifted
    by one, and the mask 1 where the target is a completion token."""
    rows = [r.prompt_ids + r.completion_ids for r in rollouts]
    width = max(len(row) for row in rows) - 1
    inputs = torch.zeros(len(rows), width, dtype=torch.long)
    targets = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width)
    for i, (row, r) in enumerate(zip(rows, rollouts, strict=True)):
        n = len(row) - 1
        inputs[i, :n] = torch.tensor(row[:-1])
        targets[i, :n] = torch.tensor(row[1:])
        mask[i, len(r.prompt_ids) - 1 : n] = 1
    return inputs.to(device), targets.to(device), mask.to(device)
