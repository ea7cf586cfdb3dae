"""GRPO: reinforcement learning on a verifiable task, with rollouts from lmforge's own engine.

Each step draws `prompts_per_step` problems from the task's train split, samples `group_size`
completions of each through the engine (rollout.py), scores them with the task's reward and
keeps the groups with signal (groups.py: dynamic sampling), turns the rewards into group-relative
advantages and takes `num_iterations` optimizer steps on the clipped policy loss
(policy_update.py, grpo_loss.py), then syncs the new weights into the engine.

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
its constant learning rate after a linear warmup (`policy_update.warmup_lr`).

Under torchrun each rank samples its share of a round's problems and the ranks gather the
scored groups, so every rank holds the batch one process samples (groups.py); each data rank
trains on its slice of the rows so that the averaged gradient is one process's
(policy_update.py); after each step every rank's engine gets the new weights (gathered whole
under FSDP), and held-out evaluation is shared out like the rollouts. Rank 0 alone claims the
run folder, writes metrics and the summary, and prints.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from lmforge.budget_clock import BudgetClock
from lmforge.device import pick_device
from lmforge.model.lora import apply_lora, count_trainable
from lmforge.model.lora_spec import LoraSpec
from lmforge.parallel.world import World, distributed
from lmforge.posttrain.groups import Collected, GroupSampler
from lmforge.posttrain.policy_update import PolicyTrainer
from lmforge.posttrain.rl_config import RlConfig, recorded, width_scaled_lr
from lmforge.posttrain.rollout import (
    ONE_PROCESS,
    Accuracy,
    RolloutEngine,
    Shares,
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
from lmforge.train.metrics import MetricsLog
from lmforge.train.signals import StopRequest, stop_requests

__all__ = ["RL_FOLDER", "SUMMARY", "GroupSampler", "PolicyTrainer", "RlResult", "grpo"]

SUMMARY = "rl.json"  # the run's outcome: held-out accuracy at its start and end
CONFIG = "rl_config.json"
RL_FOLDER = RunKind(
    "an rl run",
    CONFIG,
    resumable=frozenset({"steps", "minutes", "eval_every", "checkpoint_every"}),
    change="a new length or cadence",
)
"""An rl run's folder: `RunDir(out, RL_FOLDER)`; a resumed run may change its length."""


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
        guard.stop_if_diverged(self.step, self.checkpointer.last_good, "rl", "rl.lr")

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


def _say(text: str) -> None:
    print(text, flush=True)


def _quiet(text: str) -> None:
    pass
