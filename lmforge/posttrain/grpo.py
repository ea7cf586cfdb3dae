"""GRPO: reinforcement learning on a verifiable task, with rollouts from lmforge's own engine.

Each step draws `prompts_per_step` problems from the task's train split, samples `group_size`
completions of each through the engine (rollout.py), scores them with the task's reward, turns
the rewards into group-relative advantages and takes `num_iterations` optimizer steps on the
clipped policy loss (grpo_loss.py), then syncs the new weights into the engine. Groups whose
completions all score the same carry no signal: `dynamic_sampling="drop"` (DAPO) replaces them
with fresh prompts, up to `max_refills` extra rounds; `"count"` keeps and counts them.

A step is a pure function of the seed, the step and the weights (problems and sampling seeds are
drawn from them), so a run resumed from a checkpoint repeats the steps the first run took.
Held-out accuracy (exact answer) on `eval_problems` fixed test problems, pass@1 over
`eval_samples` completions at the rollout temperature and greedy, is measured at the start,
every `eval_every` steps and at the end. The policy may carry LoRA adapters (then only they
train, and the checkpoints load merged).

What GRPO shares with pretraining and SFT (train/): the policy is composed for its device and
layout by `train.compose` (precision, activation checkpointing, compile, and DDP or FSDP under
torchrun with `rl.parallel`, as `lmforge train --parallel`); every update goes through
`train.step.optimizer_step` (unscale, clip, and the non-finite guard, which skips an update
whose loss or gradient norm is not finite and stops the run after `max_bad_steps` in a row,
naming the last good checkpoint); the optimizer is `train.optimizers.build_optimizer`'s, its
betas `rl.beta1`/`rl.beta2`; checkpoints are the common `Checkpointer`'s (sharded under
torchrun, resumed through `restore`); and the run has the same MetricsLog, stop signals (agreed
by every rank), and a BudgetClock for `minutes` that counts a resumed run's earlier sessions.
GRPO's own are the rollouts, rewards, advantages, dynamic sampling, held-out evaluation and
its constant learning rate after a linear warmup (`warmup_lr`).

Under torchrun each rank samples its share of a round's problems (`rollout.Shares`) with the
seeds of their places in the whole round, and the ranks gather the scored groups, so every rank
holds the batch one process samples, in its order, and decides dynamic sampling alike. Each data
rank trains on its slice of the rows with the whole batch's normalisers, its loss multiplied by
the number of data ranks so that the average DDP and FSDP take of the gradients is the one
process's gradient; ranks with fewer rows pad with rows that weigh nothing, so every rank runs
as many forwards as the others. After each step every rank's engine gets the new weights
(gathered whole under FSDP); held-out evaluation is shared out like the rollouts.
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from lmforge.budget_clock import BudgetClock
from lmforge.device import pick_device
from lmforge.errors import LmforgeError
from lmforge.model import Transformer
from lmforge.model.lora import apply_lora, count_trainable
from lmforge.model.lora_spec import LoraSpec
from lmforge.parallel.layout import ParallelOptions
from lmforge.parallel.world import World, distributed
from lmforge.posttrain.grpo_loss import LossOptions, group_advantages, policy_loss, token_logprobs
from lmforge.posttrain.rl_config import RlConfig, recorded, width_scaled_lr
from lmforge.posttrain.rollout import (
    ONE_PROCESS,
    Accuracy,
    Rollout,
    RolloutEngine,
    Shares,
    batch_tensors,
    held_out_accuracy,
)
from lmforge.posttrain.tasks import Reward, exact_answer, get_task
from lmforge.posttrain.tasks.problem import Problem
from lmforge.progress import bar
from lmforge.run_dir import RunDir, RunKind
from lmforge.threads import requested_threads
from lmforge.tokenizer.chat_template import ChatTemplate
from lmforge.train.checkpoint import load_checkpoint
from lmforge.train.checkpoint_dir import read_model_config, resolve_checkpoint
from lmforge.train.checkpointer import Checkpointer
from lmforge.train.compose import compose
from lmforge.train.guard import NonFiniteGuard
from lmforge.train.metrics import MetricsLog
from lmforge.train.optimizers import build_optimizer
from lmforge.train.precision import make_precision
from lmforge.train.signals import StopRequest, stop_requests
from lmforge.train.step import optimizer_step, set_lr

SUMMARY = "rl.json"  # the run's outcome: held-out accuracy at its start and end
CONFIG = "rl_config.json"
RL_FOLDER = RunKind(
    "an rl run",
    CONFIG,
    resumable=frozenset({"steps", "minutes", "eval_every", "checkpoint_every"}),
    change="a new length or cadence",
)
"""An rl run's folder: `RunDir(out, RL_FOLDER)`; a resumed run may change its length."""

Group = tuple[list[Rollout], list[float], list[float]]  # a problem's rollouts, rewards, correct


@dataclass
class RlResult:
    step: int
    checkpoint: Path
    start_accuracy: Accuracy
    final_accuracy: Accuracy | None  # None when a signal stopped the run
    seconds: float  # spent on the run's budget: this session's and, resumed, the earlier ones'
    interrupted: bool = False
    stop_signal: str | None = None
    skipped_steps: int = 0  # optimizer steps the non-finite guard skipped


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


def grpo(
    checkpoint: str | Path,
    out_dir: str | Path,
    cfg: RlConfig,
    lora: LoraSpec | None = None,
    fresh: bool = False,
    threads: int | None = None,
    quiet: bool = False,
    reward: Reward | None = None,
    clock: BudgetClock | None = None,
) -> RlResult:
    """Improve the model at `checkpoint` on `cfg.task` by GRPO, into `out_dir`; a run already
    there with the same settings resumes from its newest checkpoint (`fresh` starts over).
    `reward(prompt, completion, **fields)` replaces the task's own (tasks/rewards.py). `clock`
    is the command's budget clock for `cfg.minutes` (default: one started now). `threads`
    (else LMFORGE_THREADS) fixes the CPU threads, restored on return. Under torchrun every rank
    calls this (`cfg.parallel` lays them out)."""
    cfg.validate()
    clock = clock or BudgetClock()
    out = Path(out_dir)
    base = resolve_checkpoint(checkpoint)
    if not cfg.lr:
        cfg = replace(cfg, lr=width_scaled_lr(read_model_config(base).d_model))
    record = {**recorded(cfg), "base": str(base), "lora": lora.to_dict() if lora else None}
    if int(os.environ.get("RANK", "0")) == 0:  # before the others join the group: they wait
        RunDir(out, RL_FOLDER).claim(record, fresh, quiet=quiet)
    device = pick_device(cfg.device)
    count, _ = requested_threads(threads)
    previous_threads = torch.get_num_threads()
    if count:
        torch.set_num_threads(count)
    try:
        with distributed(cfg.parallel, device, cfg.collective_timeout_s) as world:
            run = RlRun(base, out, cfg, record, world, lora, reward, quiet)
            try:
                return run.fit(clock)
            finally:
                run.engine.close()
    finally:
        torch.set_num_threads(previous_threads)


class RlRun:
    """An rl run's components, built once: the policy (with its engine, built from the plain
    policy before it is composed), the trainer, the sampler, the metrics log and the
    checkpointer. `fit` is the loop over them."""

    def __init__(
        self,
        base: Path,
        out: Path,
        cfg: RlConfig,
        record: dict,
        world: World,
        lora: LoraSpec | None,
        reward: Reward | None,
        quiet: bool,
    ) -> None:
        self.cfg, self.out, self.world = cfg, out, world
        self.say = _say if world.is_main and not quiet else _quiet
        self.quiet = quiet
        torch.manual_seed(cfg.seed)
        policy, tokenizer = load_checkpoint(base, world.device)
        policy.train()
        if lora is not None:
            apply_lora(policy, lora)
            trainable, total = count_trainable(policy)
            self.say(f"lora: {trainable:,} of {total:,} parameters train ({trainable / total:.2%})")
        self.policy = policy
        task = get_task(cfg.task)
        pool = task.problems(cfg.train_problems, "train", cfg.seed)
        self.test = task.problems(cfg.eval_problems, "test", cfg.eval_seed)
        self.shares = Shares.of(world)
        template = ChatTemplate(tokenizer)
        self.engine = RolloutEngine(policy, template, cfg.max_new_tokens, cfg.engine_batch)
        try:
            self.trainer = PolicyTrainer(policy, cfg, world.device, world)
        except BaseException:
            self.engine.close()
            raise
        self.sampler = GroupSampler(cfg, pool, reward or task.reward, self.engine, self.shares)
        self.metrics = MetricsLog(out / "metrics.jsonl", enabled=world.is_main)
        self.checkpointer = Checkpointer(
            out, world, {"rl": record}, base / "tokenizer", cfg.checkpoint_every
        )
        self.step, self.prior_seconds = 0, 0.0
        self.start_accuracy: Accuracy | None = None

    def resume(self) -> None:
        """Continue from the newest checkpoint in the run folder, if there is one."""
        path = self.checkpointer.find()
        if path is None:
            return
        state, _ = self.checkpointer.restore(path, self.policy, self.trainer.optimizer)
        self.trainer.composed.weights_to_compute()
        self.trainer.load_state_dict(state)
        self.step, self.prior_seconds = state["step"], state.get("seconds", 0.0)
        self.start_accuracy = Accuracy(**state["start_accuracy"])
        self.engine.sync(self.policy)
        self.say(f"rl: resuming from {path} (step {self.step})")

    def evaluate(self) -> Accuracy:
        accuracy = evaluate_accuracy(self.engine, self.test, self.cfg, self.shares)
        self.metrics.write(
            step=self.step, test_accuracy=accuracy.value, test_stderr=accuracy.stderr,
            test_greedy_accuracy=accuracy.greedy_value,
        )  # fmt: skip
        self.say(
            f"rl: step {self.step}: held-out accuracy {accuracy.value:.3f} ± "
            f"{accuracy.stderr:.3f} (greedy {accuracy.greedy_value:.3f})"
        )
        return accuracy

    def save(self, clock: BudgetClock) -> Path:
        state = {
            "kind": "rl",
            "start_accuracy": asdict(self.start_accuracy),
            "seconds": clock.elapsed(),
            **self.trainer.state_dict(),
        }
        return self.checkpointer.save(
            self.step, self.policy, self.trainer.optimizer, state, {"kind": "rl"},
            good=self.trainer.guard.clean(),
        )  # fmt: skip

    def fit(self, clock: BudgetClock) -> RlResult:
        """Train to the end of the run (or until a signal stops it); the closing evaluation."""
        cfg = self.cfg
        self.resume()
        self.metrics.truncate_after(self.step)
        clock.resumed_from(self.prior_seconds)
        if self.start_accuracy is None:
            self.start_accuracy = self.evaluate()
        quiet = self.quiet or not self.world.is_main
        with (
            stop_requests() as stop,
            bar(total=cfg.steps or None, desc="rl", initial=self.step, disable=quiet) as progress,
        ):
            while self._continues(clock) and not self._stop_agreed(stop):
                self._train_step()
                progress.update(1)
                if self._evaluation_due():
                    self.evaluate()
                if self.checkpointer.due(self.step):
                    self.save(clock)
            stopped = self._stop_agreed(stop)  # a signal in the last step, on any rank
        return self._finish(stop.signal if stopped else None, clock)

    def _evaluation_due(self) -> bool:
        """Every `eval_every` steps, but not at the last (the closing evaluation follows)."""
        every, steps = self.cfg.eval_every, self.cfg.steps
        return bool(every) and self.step % every == 0 and (not steps or self.step < steps)

    def _continues(self, clock: BudgetClock) -> bool:
        """Whether to take another step: steps left, and budget left by rank 0's clock."""
        if self.cfg.steps and self.step >= self.cfg.steps:
            return False
        spent = self.cfg.minutes > 0 and clock.remaining(self.cfg.minutes) <= 0
        return not self.world.from_main(int(spent))

    def _stop_agreed(self, stop: StopRequest) -> bool:
        """Whether a stop signal reached any rank (then they all stop at this step)."""
        if not self.world.any_rank(bool(stop)):
            return False
        stop.signal = stop.signal or "another rank's stop request"
        return True

    def _train_step(self) -> None:
        """Rollouts, the updates, the weights synced into the engine, the step's metrics; a
        run whose updates keep coming out non-finite stops here."""
        collected = self.sampler.collect(self.step)
        t0 = time.perf_counter()
        trained = self.trainer.train(self.step, collected) if collected.rollouts else {}
        train_seconds = time.perf_counter() - t0
        self.engine.sync(self.policy)
        self.step += 1
        guard = self.trainer.guard
        record = _step_record(collected, trained, train_seconds)
        self.metrics.write(step=self.step, **record, skipped_steps=int(guard.skipped))
        if guard.diverged():
            raise LmforgeError(
                _diverged_message(self.step, guard.max_bad_steps, self.checkpointer.last_good)
            )

    def _finish(self, stop_signal: str | None, clock: BudgetClock) -> RlResult:
        """The closing evaluation (a stopped run only saves), checkpoint and summary."""
        final = self.evaluate() if stop_signal is None else None
        path = self.save(clock)
        if self.world.is_distributed and self.world.is_main:
            from lmforge.train.checkpoint_dcp import export_safetensors

            export_safetensors(path)  # the final checkpoint, ready for inference in one file
        seconds = clock.elapsed()
        if final is not None and self.world.is_main:
            summary = {
                "task": self.cfg.task,
                "steps": self.step,
                "seconds": seconds,
                "eval_seed": self.cfg.eval_seed,
                "seed": self.cfg.seed,
                "start_accuracy": self.start_accuracy.record(),
                "final_accuracy": final.record(),
            }
            (self.out / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
        skipped = int(self.trainer.guard.skipped)
        return RlResult(
            self.step, path, self.start_accuracy, final, seconds, stop_signal is not None,
            stop_signal, skipped,
        )  # fmt: skip


def _step_record(collected: Collected, trained: dict, train_seconds: float) -> dict:
    lengths = [len(r.completion_ids) for r in collected.rollouts]
    rewards = collected.rewards
    trained_tokens = sum(len(r.prompt_ids) + len(r.completion_ids) for r in collected.rollouts)
    record = {
        "reward_mean": float(rewards.mean()) if len(rewards) else 0.0,
        "reward_std": float(rewards.std()) if len(rewards) > 1 else 0.0,
        "accuracy": float(collected.correct.mean()) if len(rewards) else 0.0,
        "response_length": sum(lengths) / max(len(lengths), 1),
        "groups": len(collected.rollouts) // collected.group_size,
        "groups_drawn": collected.groups_drawn,
        "zero_variance_groups": collected.zero_variance,
        "rollout_rounds": collected.rounds,
        "rollout_tokens_per_s": collected.generated_tokens / max(collected.rollout_seconds, 1e-9),
        "train_tokens_per_s": trained_tokens / max(train_seconds, 1e-9) if trained else 0.0,
        **trained,
    }
    return record


def evaluate_accuracy(
    engine: RolloutEngine, test: list[Problem], cfg: RlConfig, shares: Shares = ONE_PROCESS
) -> Accuracy:
    """Held-out accuracy as every stage of a run (and the chat speedrun) measures it."""
    return held_out_accuracy(
        engine, test, exact_answer, cfg.eval_samples, cfg.temperature, cfg.top_k, cfg.eval_seed,
        shares=shares,
    )  # fmt: skip


def _diverged_message(step: int, max_bad_steps: int, last_good: Path | None) -> str:
    where = (
        f"the last good checkpoint is {last_good}"
        if last_good is not None
        else "no checkpoint was saved before it"
    )
    return (
        f"rl stopped at step {step}: {max_bad_steps} optimizer steps in a row had a non-finite "
        f"loss or gradient norm and were skipped; {where}: lower rl.lr or change --precision, "
        "then resume from it (or start over with --fresh)"
    )


def _say(text: str) -> None:
    print(text, flush=True)


def _quiet(text: str) -> None:
    pass
