"""The training loop: batches in, AdamW steps, periodic validation, metrics and checkpoints out.

One loop serves every command that trains. It runs for `max_steps`, or for a wall-clock budget
(`minutes`): then the first steps are timed once and the step count that fits the budget is
fixed, so the learning-rate schedule stays a pure function of the step and a resumed run
continues the same schedule.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from lmforge.device import pick_device
from lmforge.errors import LmforgeError
from lmforge.eval.bpb import EvalResult, evaluate, token_byte_lengths
from lmforge.model import ModelConfig, Transformer
from lmforge.progress import bar
from lmforge.tokenizer import Tokenizer
from lmforge.tokens import WindowSampler, load_tokens, read_meta
from lmforge.train.checkpoint import (
    list_checkpoints,
    load_model_weights,
    load_training_state,
    save_checkpoint,
)
from lmforge.train.clip import clip_grad_norm
from lmforge.train.metrics import MetricsLog
from lmforge.train.optim import AdamW, param_groups
from lmforge.train.schedule import lr_at

CALIBRATION_STEPS = 5
"""Budgeted runs time this many steps (after the first, which pays one-off costs) to fix their
step count; until then the cosine horizon is open and only warmup applies."""


@dataclass
class TrainConfig:
    batch_size: int = 16
    seq_len: int = 256
    grad_accum_steps: int = 1
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    max_steps: int = 0  # 0: train for `minutes` of wall-clock time instead
    minutes: float = 0.0
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_batches: int = 16
    log_every: int = 10
    checkpoint_every: int = 0  # 0: only at the end (and on Ctrl-C)
    seed: int = 1337
    device: str = "auto"

    def validate(self) -> None:
        if self.max_steps <= 0 and self.minutes <= 0:
            raise LmforgeError("train.max_steps and train.minutes are both 0: set one of them")
        for name in ("batch_size", "seq_len", "grad_accum_steps", "log_every", "eval_batches"):
            if getattr(self, name) < 1:
                raise LmforgeError(f"train.{name} must be at least 1, got {getattr(self, name)}")


@dataclass
class TrainResult:
    step: int
    checkpoint: Path
    final_eval: EvalResult
    tokens_per_s: float
    seconds: float
    interrupted: bool = False


def train(
    model_config: ModelConfig,
    cfg: TrainConfig,
    shard_dir: str | Path,
    out_dir: str | Path,
    run_config: dict | None = None,
    resume: bool = True,
) -> TrainResult:
    """Train on the `train` shard of `shard_dir`, validating on its `val` shard.

    The tokenizer is the copy the shards carry (`shard_dir/tokenizer`); checkpoints carry it on.
        Writes `metrics.jsonl` and `checkpoints/step_N/` under `out_dir`; resumes from the newest
        checkpoint there when `resume` is set.
    """
    cfg.validate()
    out_dir = Path(out_dir)
    device = pick_device(cfg.device)
    torch.manual_seed(cfg.seed)

    meta = read_meta(shard_dir)
    tokenizer_dir = Path(shard_dir) / "tokenizer"
    tokenizer = Tokenizer.load(tokenizer_dir)
    if meta.tokenizer_fingerprint != tokenizer.fingerprint():
        raise LmforgeError(
            f"token shards in {shard_dir} do not match the tokenizer in {tokenizer_dir}: "
            "re-tokenize with `lmforge tokenize`"
        )
    model_config = dataclasses.replace(model_config, vocab_size=meta.vocab_size)
    if cfg.seq_len > model_config.max_seq_len:
        raise LmforgeError(
            f"train.seq_len {cfg.seq_len} exceeds model.max_seq_len {model_config.max_seq_len}: "
            "lower one or raise the other"
        )
    model_config.validate()
    train_tokens = load_tokens(shard_dir, "train")
    val_tokens = load_tokens(shard_dir, "val")
    sampler = WindowSampler(train_tokens, cfg.batch_size, cfg.seq_len, cfg.seed)
    byte_lengths = token_byte_lengths(tokenizer)

    model = Transformer(model_config).to(device)
    optimizer = AdamW(
        param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2)
    )
    metrics = MetricsLog(out_dir / "metrics.jsonl")
    checkpoints_dir = out_dir / "checkpoints"

    step, total_steps, prior_seconds = 0, cfg.max_steps or None, 0.0
    existing = list_checkpoints(checkpoints_dir) if resume else []
    if existing:
        load_model_weights(model, existing[-1])
        state, _ = load_training_state(existing[-1], optimizer)
        step, prior_seconds = state["step"], state["seconds"]
        total_steps = cfg.max_steps or state["total_steps"]  # max_steps may extend a run
        metrics.truncate_after(step)
        print(f"resuming from {existing[-1]} (step {step})")

    session_start = time.perf_counter()

    def elapsed() -> float:
        return prior_seconds + time.perf_counter() - session_start

    def run_eval() -> EvalResult:
        return evaluate(
            model, val_tokens, byte_lengths, cfg.seq_len, cfg.batch_size, cfg.eval_batches, device
        )

    def checkpoint() -> Path:
        trainer_state = {"total_steps": total_steps, "seconds": elapsed()}
        return save_checkpoint(
            checkpoints_dir,
            step,
            model,
            optimizer,
            trainer_state,
            sampler.state_dict(),
            run_config or {},
            tokenizer_dir,
        )

    tokens_per_step = cfg.batch_size * cfg.seq_len * cfg.grad_accum_steps
    budget_s = cfg.minutes * 60 if not cfg.max_steps else math.inf
    min_lr = cfg.lr * cfg.min_lr_ratio
    step_times: list[float] = []
    window_start, window_steps = time.perf_counter(), 0
    interrupted = False
    progress = bar(total=total_steps, initial=step, desc="train", unit="step")
    log = progress.write  # log lines print above the bar
    model.train()
    try:
        while (total_steps is None or step < total_steps) and elapsed() < budget_s:
            t0 = time.perf_counter()
            lr = lr_at(step, cfg.lr, min_lr, cfg.warmup_steps, total_steps or 10**9)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_sum = torch.zeros((), device=device)
            for micro in range(cfg.grad_accum_steps):
                x, y = sampler.batch(step, micro, device)
                loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
                (loss / cfg.grad_accum_steps).backward()
                loss_sum += loss.detach()
            grad_norm = clip_grad_norm(model.parameters(), cfg.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            window_steps += 1
            progress.update()

            if step % cfg.log_every == 0 or step == total_steps:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                window_s = time.perf_counter() - window_start
                record = {
                    "step": step,
                    "loss": round(float(loss_sum) / cfg.grad_accum_steps, 5),
                    "lr": lr,
                    "grad_norm": round(float(grad_norm), 4),
                    "tokens_per_s": round(window_steps * tokens_per_step / window_s, 1),
                    "step_time_s": round(window_s / window_steps, 4),
                }
                metrics.write(**record)
                progress.set_postfix(loss=record["loss"], refresh=False)
                log(
                    f"step {step}/{total_steps or '?'} loss {record['loss']:.4f} lr {lr:.2e} "
                    f"{record['tokens_per_s']:.0f} tok/s {record['step_time_s'] * 1000:.0f} ms/step"
                )
                window_start, window_steps = time.perf_counter(), 0
            step_times.append(time.perf_counter() - t0)

            if total_steps is None and len(step_times) == CALIBRATION_STEPS + 1:
                total_steps = _steps_in_budget(cfg, step_times[1:], budget_s - elapsed(), step)
                log(f"time budget {cfg.minutes:g} min: training for {total_steps} steps")
                progress.total = total_steps
                progress.refresh()
            if cfg.eval_every and step % cfg.eval_every == 0 and step != total_steps:
                result = run_eval()
                metrics.write(
                    step=step, val_loss=round(result.loss, 5), val_bpb=round(result.bpb, 5)
                )
                log(f"step {step} val loss {result.loss:.4f} bpb {result.bpb:.4f}")
                window_start, window_steps = time.perf_counter(), 0
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                checkpoint()
    except KeyboardInterrupt:
        interrupted = True
        log(f"interrupted at step {step}: saving a checkpoint (Ctrl-C again to abandon it)")
    progress.close()

    if step_times or interrupted or not existing:
        path = checkpoint()
        final = run_eval()
        metrics.write(step=step, val_loss=round(final.loss, 5), val_bpb=round(final.bpb, 5))
    else:
        path = existing[-1]
        print(f"training: reusing {path} (already complete)")
        final = run_eval()
    train_seconds = sum(step_times)
    tokens_per_s = len(step_times) * tokens_per_step / train_seconds if step_times else 0.0
    return TrainResult(step, path, final, tokens_per_s, elapsed(), interrupted)


def _steps_in_budget(
    cfg: TrainConfig, step_times: list[float], remaining_s: float, step: int
) -> int:
    """Total steps that fit the remaining budget, counting the periodic evaluations."""
    per_step = sum(step_times) / len(step_times)
    if cfg.eval_every:
        forward_only = per_step / (3 * cfg.grad_accum_steps)  # forward ≈ 1/3 of forward+backward
        per_step += cfg.eval_batches * forward_only / cfg.eval_every
    return step + max(1, int(remaining_s / per_step))
