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
every `eval_every` steps and at the end. One process; the policy may carry LoRA
adapters (then only they train, and the checkpoints load merged).
"""

from __future__ import annotations

import copy
import json
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from lmforge.device import pick_device
from lmforge.model import Transformer
from lmforge.model.lora import apply_lora, count_trainable
from lmforge.model.lora_spec import LoraSpec
from lmforge.posttrain.grpo_loss import LossOptions, group_advantages, policy_loss, token_logprobs
from lmforge.posttrain.rl_config import RlConfig, width_scaled_lr
from lmforge.posttrain.rollout import (
    Accuracy,
    Rollout,
    RolloutEngine,
    batch_tensors,
    held_out_accuracy,
)
from lmforge.posttrain.tasks import Reward, exact_answer, get_task
from lmforge.posttrain.tasks.problem import Problem
from lmforge.progress import bar
from lmforge.run_dir import RunDir, RunKind
from lmforge.threads import requested_threads
from lmforge.tokenizer.chat_template import ChatTemplate
from lmforge.train.checkpoint import (
    load_checkpoint,
    load_model_weights,
    load_training_state,
    save_checkpoint,
)
from lmforge.train.checkpoint_dir import list_checkpoints, read_model_config, resolve_checkpoint
from lmforge.train.clip import clip_grad_norm
from lmforge.train.metrics import MetricsLog
from lmforge.train.optimizers import build_optimizer
from lmforge.train.precision import make_precision
from lmforge.train.signals import stop_requests

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
    seconds: float
    interrupted: bool = False
    stop_signal: str | None = None


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
    """Problems for each step's rounds, and their scored, grouped rollouts."""

    def __init__(self, cfg: RlConfig, pool: list[Problem], reward, engine: RolloutEngine) -> None:
        self.cfg, self.pool, self.reward, self.engine = cfg, pool, reward, engine

    def draw(self, step: int, round_: int) -> list[Problem]:
        rng = random.Random(f"{self.cfg.seed}:{step}:{round_}")
        return rng.sample(self.pool, min(self.cfg.prompts_per_step, len(self.pool)))

    def collect(self, step: int) -> Collected:
        cfg, G = self.cfg, self.cfg.group_size
        kept: list[tuple[list[Rollout], list[float], list[float]]] = []
        drawn = zero = rounds = generated = 0
        seconds = 0.0
        while len(kept) < cfg.prompts_per_step and rounds <= cfg.max_refills:
            problems = self.draw(step, rounds)
            batch = self.engine.sample(
                problems, G, cfg.temperature, cfg.top_k, cfg.seed, step * 1000 + rounds
            )
            seconds += batch.seconds
            generated += batch.tokens
            rounds += 1
            for i, problem in enumerate(problems):
                group = batch.rollouts[i * G : (i + 1) * G]
                fields = problem.reward_fields()
                rewards = [self.reward(problem.prompt, r.text, **fields) for r in group]
                correct = [exact_answer(problem.prompt, r.text, **fields) for r in group]
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


class PolicyTrainer:
    """The optimizer steps on one step's rollouts: micro-batched forward and backward of the
    clipped loss, each micro-batch normalised by the whole batch's denominators."""

    def __init__(self, policy: Transformer, cfg: RlConfig, device: torch.device) -> None:
        self.policy, self.cfg, self.device = policy, cfg, device
        self.precision = make_precision(cfg.precision, device)
        self.optimizer = build_optimizer(policy, cfg.lr, (0.9, 0.99), cfg.weight_decay)
        self.reference = None
        if cfg.beta > 0:
            self.reference = copy.deepcopy(policy).eval().requires_grad_(False)
        self.options = LossOptions(
            cfg.eps_low, cfg.eps_high, cfg.beta, cfg.loss_norm, cfg.max_new_tokens
        )

    def _logprobs(self, model: Transformer, inputs, targets) -> tuple[torch.Tensor, torch.Tensor]:
        with self.precision.autocast():
            logits = model(inputs)
        return token_logprobs(logits, targets, self.cfg.temperature)

    def _micro(self, n: int) -> list[slice]:
        size = self.cfg.micro_batch
        return [slice(i, min(i + size, n)) for i in range(0, n, size)]

    def _no_grad_logprobs(self, model: Transformer, tensors) -> list[torch.Tensor]:
        inputs, targets, _ = tensors
        with torch.no_grad():
            return [
                self._logprobs(model, inputs[s], targets[s])[0] for s in self._micro(len(inputs))
            ]

    def lr_at(self, step: int) -> float:
        return self.cfg.lr * min(1.0, (step + 1) / max(self.cfg.warmup_steps, 1))

    def train(self, step: int, collected: Collected) -> dict:
        """num_iterations optimizer steps on `collected`; the step's training metrics."""
        cfg = self.cfg
        tensors = batch_tensors(collected.rollouts, self.device)
        inputs, targets, mask = tensors
        advantages = collected.advantages.to(self.device)
        micro = self._micro(len(inputs))
        total_tokens, total_rows = int(mask.sum()), len(inputs)
        old = self._no_grad_logprobs(self.policy, tensors) if cfg.num_iterations > 1 else None
        ref = self._no_grad_logprobs(self.reference, tensors) if self.reference else None
        engine = _padded([r.logprobs for r in collected.rollouts], mask)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr_at(step)
        sums = dict.fromkeys(("loss", "clip_fraction", "kl", "entropy", "engine_gap"), 0.0)
        for iteration in range(cfg.num_iterations):
            first = iteration == 0
            for k, s in enumerate(micro):
                logp, entropy = self._logprobs(self.policy, inputs[s], targets[s])
                old_k = logp.detach() if old is None else old[k]
                loss, stats = policy_loss(
                    logp, old_k, advantages[s], mask[s], self.options,
                    ref[k] if ref else None, total_tokens, total_rows,
                )  # fmt: skip
                self.precision.scale_loss(loss).backward()
                if first:
                    m = mask[s]
                    sums["loss"] += float(loss.detach())
                    sums["clip_fraction"] += stats.clip_fraction * stats.active_tokens
                    sums["kl"] += stats.kl * stats.active_tokens
                    sums["entropy"] += float((entropy.detach() * m).sum())
                    gap = (logp.detach() - engine[s]).abs() * m
                    sums["engine_gap"] += float(gap.sum())
            params = [p for p in self.policy.parameters() if p.grad is not None]
            self.precision.unscale_([p.grad for p in params])
            grad_norm = float(clip_grad_norm(params, cfg.grad_clip))
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        n = max(total_tokens, 1)
        record = {
            "loss": sums["loss"],
            "grad_norm": grad_norm,
            "clip_fraction": sums["clip_fraction"] / n,
            "entropy": sums["entropy"] / n,
            "lr": self.lr_at(step),
        }
        if cfg.beta > 0:
            record["kl"] = sums["kl"] / n
        if cfg.temperature == 1.0:  # the engine's log-probs are at T = 1
            record["engine_gap"] = sums["engine_gap"] / n
        return record


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
) -> RlResult:
    """Improve the model at `checkpoint` on `cfg.task` by GRPO, into `out_dir`; a run already
    there with the same settings resumes from its newest checkpoint (`fresh` starts over).
    `reward(prompt, completion, **fields)` replaces the task's own (tasks/rewards.py)."""
    cfg.validate()
    out = Path(out_dir)
    base = resolve_checkpoint(checkpoint)
    if not cfg.lr:
        cfg = replace(cfg, lr=width_scaled_lr(read_model_config(base).d_model))
    record = {**asdict(cfg), "base": str(base), "lora": lora.to_dict() if lora else None}
    RunDir(out, RL_FOLDER).claim(record, fresh, quiet=quiet)
    device = pick_device(cfg.device)
    count, _ = requested_threads(threads)
    if count:
        torch.set_num_threads(count)
    torch.manual_seed(cfg.seed)
    policy, tokenizer = load_checkpoint(base, device)
    policy.train()
    if lora is not None:
        apply_lora(policy, lora)
        trainable, total = count_trainable(policy)
        _say(quiet, f"lora: {trainable:,} of {total:,} parameters train ({trainable / total:.2%})")
    template = ChatTemplate(tokenizer)
    task = get_task(cfg.task)
    pool = task.problems(cfg.train_problems, "train", cfg.seed)
    test = task.problems(cfg.eval_problems, "test", cfg.eval_seed)
    trainer = PolicyTrainer(policy, cfg, device)
    engine = RolloutEngine(policy, template, cfg.max_new_tokens, cfg.engine_batch)
    sampler = GroupSampler(cfg, pool, reward or task.reward, engine)
    checkpoints = out / "checkpoints"
    metrics = MetricsLog(out / "metrics.jsonl")

    step, start_accuracy = 0, None
    latest = list_checkpoints(checkpoints)[-1:]
    if latest:
        load_model_weights(policy, latest[0])
        state, _ = load_training_state(latest[0], trainer.optimizer)
        step = state["step"]
        start_accuracy = Accuracy(**state["start_accuracy"])
        engine.sync(policy)
        _say(quiet, f"rl: resuming from {latest[0]} (step {step})")
    metrics.truncate_after(step)
    started = time.perf_counter()

    def evaluate() -> Accuracy:
        accuracy = evaluate_accuracy(engine, test, cfg)
        metrics.write(
            step=step, test_accuracy=accuracy.value, test_stderr=accuracy.stderr,
            test_greedy_accuracy=accuracy.greedy_value,
        )  # fmt: skip
        _say(
            quiet,
            f"rl: step {step}: held-out accuracy {accuracy.value:.3f} ± {accuracy.stderr:.3f} "
            f"(greedy {accuracy.greedy_value:.3f})",
        )
        return accuracy

    def save() -> Path:
        state = {"kind": "rl", "start_accuracy": asdict(start_accuracy)}
        return save_checkpoint(
            checkpoints, step, policy, trainer.optimizer, state, {"kind": "rl"}, {"rl": record},
            tokenizer_dir=base / "tokenizer",
        )  # fmt: skip

    if start_accuracy is None:
        start_accuracy = evaluate()
    total = cfg.steps
    final, stop_signal = None, None
    with (
        stop_requests() as stop,
        bar(total=total, desc="rl", initial=step, disable=quiet) as progress,
    ):
        while step < total and not _out_of_time(cfg, started):
            if stop.signal:
                break
            collected = sampler.collect(step)
            t0 = time.perf_counter()
            trained = trainer.train(step, collected) if collected.rollouts else {}
            train_seconds = time.perf_counter() - t0
            engine.sync(policy)
            step += 1
            metrics.write(step=step, **_step_record(collected, trained, train_seconds))
            progress.update(1)
            if cfg.eval_every and step % cfg.eval_every == 0 and step < total:
                evaluate()
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                save()
        stop_signal = stop.signal
    if stop_signal is None:
        final = evaluate()
    path = save()
    engine.close()
    seconds = time.perf_counter() - started
    if stop_signal is None:
        summary = {
            "task": cfg.task,
            "steps": step,
            "seconds": seconds,
            "eval_seed": cfg.eval_seed,
            "seed": cfg.seed,
            "start_accuracy": start_accuracy.record(),
            "final_accuracy": final.record(),
        }
        (out / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
    return RlResult(
        step, path, start_accuracy, final, seconds, stop_signal is not None, stop_signal
    )


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


def evaluate_accuracy(engine: RolloutEngine, test: list[Problem], cfg: RlConfig) -> Accuracy:
    """Held-out accuracy as every stage of a run (and the chat speedrun) measures it."""
    return held_out_accuracy(
        engine, test, exact_answer, cfg.eval_samples, cfg.temperature, cfg.top_k, cfg.eval_seed
    )


def _out_of_time(cfg: RlConfig, started: float) -> bool:
    return cfg.minutes > 0 and time.perf_counter() - started >= cfg.minutes * 60


def _say(quiet: bool, text: str) -> None:
    if not quiet:
        print(text, flush=True)
