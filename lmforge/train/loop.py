"""The training loop: batches in, optimizer steps, periodic validation, metrics and checkpoints out.

One training core serves every command that trains: pretraining and SFT run this loop, and GRPO
(posttrain/) builds its policy and updates from the same components. `Trainer` builds them once
from the config: the model composed for its device and layout (compose.py: precision,
activation checkpointing, compile, DDP/FSDP/TP), the optimizer (optimizers.py) and schedule
(schedule.py), the non-finite guard (guard.py), the data's batches (data.py), the metrics log
(metrics.py), the validator (validator.py), the checkpointer (checkpointer.py), the step budget
(budget.py) and the thread tuner (thread_tuner.py). `Trainer.fit` is the loop over them.

A run trains for `max_steps`, or for a wall-clock budget (`minutes`, spent on the command's
`BudgetClock`): then the first steps are timed and fix the step count, and a WSD run re-fits it
to the time actually left, so a slowed machine still gets a full decay. Every change is a plan
saved with the checkpoints, so the learning rate stays a pure function of the step and a
resumed run repeats it; a resumed run given more steps (or a new budget) continues on a new
schedule tail. The host reads values back from the device only on log, evaluation and
checkpoint steps.

A single process trains on `World.single`; under torchrun, `train.parallel.layout` lays the
processes out on a device mesh (lmforge.parallel): every rank runs this same loop on its share of
the global batch, rank 0 alone writes metrics and prints, and all ranks write their shards of each
checkpoint. The loop never asks which: the World's collectives and the components do.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from lmforge.budget_clock import BudgetClock
from lmforge.device import pick_device
from lmforge.errors import LmforgeError
from lmforge.model import ModelConfig, Transformer
from lmforge.model.moe import moe_metrics
from lmforge.parallel.comm_count import count_collectives
from lmforge.parallel.layout import ParallelOptions
from lmforge.parallel.world import World, distributed
from lmforge.progress import bar
from lmforge.threads import requested_threads
from lmforge.train.bpb import EvalResult
from lmforge.train.budget import StepBudget, replanned_message
from lmforge.train.checkpointer import Checkpointer
from lmforge.train.compose import Objective, compose
from lmforge.train.config import TrainConfig
from lmforge.train.data import TrainingData, as_training_data
from lmforge.train.guard import NonFiniteGuard
from lmforge.train.memory import peak_memory_bytes
from lmforge.train.metrics import MetricsLog
from lmforge.train.mfu import mfu, peak_flops
from lmforge.train.optimizers import optimizer_from_config
from lmforge.train.precision import make_precision
from lmforge.train.schedule import Schedule
from lmforge.train.signals import StopRequest, stop_requests
from lmforge.train.step import StepResult, train_step
from lmforge.train.thread_tuner import ThreadTuner
from lmforge.train.throughput import Throughput
from lmforge.train.validator import Validator

COUNTED_STEP = 1
"""Runs on many processes count the bytes of every collective in this step (the first steps
are often special: DDP rebuilds its buckets after the first) and log them as
comm_bytes_per_step."""


@dataclass
class TrainResult:
    step: int
    checkpoint: Path
    final_eval: EvalResult | None  # None when a signal stopped the run: it saves and leaves
    tokens_per_s: float
    seconds: float
    interrupted: bool = False
    stop_signal: str | None = None  # what stopped the run: SIGINT, SIGTERM, ...
    threads: int = 1  # the CPU threads it computed with (chosen or given)
    precision: str = "fp32"
    mfu: float = 0.0
    peak_memory_bytes: int = 0
    skipped_steps: int = 0


def train(
    model_config: ModelConfig,
    cfg: TrainConfig,
    data: str | Path | TrainingData,
    out_dir: str | Path,
    run_config: dict | None = None,
    resume: bool = True,
    threads: int | None = None,
    score_tasks: Callable[[nn.Module], dict[str, float]] | None = None,
    init_model: Callable[[Transformer], None] | None = None,
    clock: BudgetClock | None = None,
) -> TrainResult:
    """Train on `data`: a token shard folder (its `train` shard, validating on its `val` shard)
    or another TrainingData (train/data.py), such as post-training's conversations.

    The tokenizer is the copy the data carries (`data.tokenizer_dir`); checkpoints carry it on.
    Writes `metrics.jsonl` and `checkpoints/step_N/` under `out_dir`; resumes from the newest
    checkpoint there when `resume` is set. Under torchrun, every rank calls this.
    `threads` (else LMFORGE_THREADS) fixes the CPU threads; without either, a run on the CPU
    times its first steps at a few counts and keeps the fastest (lmforge.threads). The
    process's thread count is restored on return. `score_tasks` (from eval/periodic.py, for
    `train.eval.tasks`) scores the model on tasks at each validation, logged as `task_<name>`.
    `init_model` prepares the new fp32 model before anything else sees it (fine-tuning loads
    its base weights there and may add LoRA adapters); a resumed run then loads its checkpoint
    over it. `clock` is the command's budget clock (`cfg.minutes` is spent on it): by default one
    started just before the first step; `lmforge train` passes its own, started with the
    command, so that start-up and sizing are inside the budget.
    """
    cfg.validate()
    given = requested_threads(threads)
    device = pick_device(cfg.device)
    previous_threads = torch.get_num_threads()
    try:
        with distributed(cfg.parallel.layout, device, cfg.parallel.collective_timeout_s) as world:
            data = as_training_data(data)
            trainer = Trainer(
                model_config, cfg, data, Path(out_dir), world, run_config or {}, score_tasks,
                init_model,
            )  # fmt: skip
            return trainer.fit(given, resume, clock)
    finally:
        torch.set_num_threads(previous_threads)


class Trainer:
    """A run's components, built once from its config: the model composed for its device and
    layout (compose.py), the optimizer and schedule, the non-finite guard, the data, the metrics
    log, the validator and the checkpointer. `fit` is the loop over them."""

    def __init__(
        self,
        model_config: ModelConfig,
        cfg: TrainConfig,
        data: TrainingData,
        out_dir: Path,
        world: World,
        run_config: dict,
        score_tasks: Callable[[nn.Module], dict[str, float]] | None = None,
        init_model: Callable[[Transformer], None] | None = None,
    ) -> None:
        if score_tasks is not None and world.is_distributed:
            raise LmforgeError(
                "train.eval.tasks scores tasks in a single-process run: leave it out under "
                "torchrun and score the checkpoints with `lmforge eval --tasks`"
            )
        self.cfg, self.data, self.world, self.device = cfg, data, world, world.device
        master_device = torch.device("cpu") if cfg.optimizer.offload else world.device
        torch.manual_seed(cfg.seed)
        model_config = _checked_model(model_config, cfg, data, world)
        self.precision = make_precision(
            cfg.precision.dtype, world.device, cfg.precision.cast_module
        )
        model = Transformer(model_config)
        if init_model is not None:
            init_model(model)
        self.model = model.to(master_device)
        options = ParallelOptions(
            cfg.parallel.ddp_bucket_mb,
            cfg.parallel.zero1,
            cfg.parallel.reshard_after_forward,
            cfg.parallel.sequence_parallel,
        )
        self.composed = compose(
            self.model,
            self.precision,
            world.device,
            cfg.compute.activation_checkpointing,
            cfg.compute.compile,
            world,
            options,
            Objective(cfg.compute.fused_loss),
            cfg.compute.kernels,
        )
        self.optimizer = optimizer_from_config(self.model, cfg, world)
        self.guard = NonFiniteGuard(master_device, cfg.max_bad_steps)
        self.batches = data.batches(cfg, world.data_rank, world.layout.data_parallel)
        self.metrics = MetricsLog(out_dir / "metrics.jsonl", enabled=world.is_main)
        self.validator = Validator(data, cfg, self.composed, self.metrics, score_tasks)
        self.checkpointer = Checkpointer(
            out_dir, world, run_config, data.tokenizer_dir, cfg.checkpoint.every
        )
        self.schedule = Schedule(
            cfg.optimizer.lr,
            cfg.optimizer.lr * cfg.schedule.min_lr_ratio,
            cfg.schedule.warmup_steps,
            cfg.schedule.kind,
            cfg.schedule.warmup_frac,
            cfg.schedule.decay_frac,
        )
        self.step, self.total_steps, self.prior_seconds = 0, cfg.max_steps or None, 0.0
        self.resumed_from: Path | None = None
        self.loader_state = self.batches.state_dict()  # as of the last completed step
        self.lr, self.activation_bytes, self.comm_bytes = 0.0, 0, {}
        self.session_steps, self.step_seconds = 0, 0.0

    def resume(self) -> None:
        """Continue from the newest checkpoint in the run folder, if there is one."""
        path = self.checkpointer.find()
        if path is None:
            return
        state, loader_state = self.checkpointer.restore(path, self.model, self.optimizer)
        self.composed.weights_to_compute()
        self.step, self.prior_seconds = state["step"], state["seconds"]
        self.schedule.horizons = [tuple(p) for p in state.get("plans", ())]
        if not self.schedule.horizons and state["total_steps"]:  # written before plans were saved
            self.schedule.horizons = [(0, state["total_steps"])]
        self.total_steps = _resumed_total(self.cfg, state)
        self.precision.load_state_dict(state.get("precision", {}))
        if "guard" in state:
            self.guard.load_state_dict(state["guard"])
        self.batches.load_state_dict(loader_state)
        self.loader_state = loader_state
        self.metrics.truncate_after(self.step)
        self.resumed_from = path
        if self.world.is_main:
            print(f"resuming from {path} (step {self.step})")
        if self.total_steps is not None and self.total_steps > self.step:
            before = list(self.schedule.horizons)
            self.schedule.run_to(self.step, self.total_steps)
            if (
                self.world.is_main
                and len(self.schedule.horizons) > 1
                and self.schedule.horizons != before
            ):
                print(replanned_message(self.schedule, self.step))

    def fit(
        self,
        given_threads: tuple[int | None, str] = (None, ""),
        resume: bool = True,
        clock: BudgetClock | None = None,
    ) -> TrainResult:
        """Train to the end of the run (or until a signal stops it); the closing validation."""
        if resume:
            self.resume()
        if self.total_steps is not None and self.total_steps > self.step:
            before = list(self.schedule.horizons)
            self.schedule.run_to(self.step, self.total_steps)
            replanned = len(self.schedule.horizons) > 1 and self.schedule.horizons != before
            if replanned and self.world.is_main:
                print(replanned_message(self.schedule, self.step))
        cfg = self.cfg
        tuner = ThreadTuner(given_threads, self.device, self.world)
        flops_per_token = self.model.flops_per_token(cfg.seq_len)
        throughput = Throughput(
            cfg.batch_size * cfg.seq_len * cfg.grad_accum_steps,
            flops_per_token,
            peak_flops(self.device, self.precision.matmul),  # measured once per machine
            self.device,
        )
        clock = clock or BudgetClock()
        clock.resumed_from(self.prior_seconds)
        resumed = self.resumed_from is not None
        budget = StepBudget(cfg, self.schedule, self.world, clock, self.total_steps, resumed)
        progress = bar(total=budget.total, initial=self.step, desc="train", unit="step")
        log = progress.write if self.world.is_main else _quiet  # log lines print above the bar
        self._announce(log, tuner, flops_per_token)
        self.composed.compute.train()
        with stop_requests() as stop:
            try:
                while budget.continues(self.step):
                    if self._stop_agreed(stop):
                        raise KeyboardInterrupt
                    tuner.before_step()
                    t0 = clock.now()
                    budget.step_clock.step_started()
                    result = self._train_step(log)
                    throughput.step()
                    progress.update()
                    if self.step % cfg.log_every == 0 or self.step == budget.total:
                        self._log_step(result, budget.total, throughput, log, progress)
                    seconds = clock.now() - t0
                    self.step_seconds += seconds
                    if tuner.after_step(seconds):
                        throughput.peak = peak_flops(self.device, self.precision.matmul)
                        log(f"threads {tuner.describe()}")
                        throughput.reset()
                    replanned = budget.after_step(self.step, tuner.settled, tuner.steps)
                    if replanned:
                        log(replanned)
                    if progress.total != budget.total:
                        progress.total = budget.total
                        progress.refresh()
                    if self.validator.due(self.step, budget.total):
                        with budget.step_clock.pause(validation=True):
                            ev = self.validator.validate(self.step, log)
                        log(f"step {self.step} val loss {ev.loss:.4f} bpb {ev.bpb:.4f}")
                        throughput.reset()
                    if self.checkpointer.due(self.step):
                        with budget.step_clock.pause():
                            self._save(budget)
                        throughput.reset()
            except KeyboardInterrupt:
                why = f"{stop.signal} received" if stop.signal else "interrupted"
                log(f"{why} at step {self.step}: saving a checkpoint (Ctrl-C again to abandon it)")
                stop.signal = stop.signal or "SIGINT"
            finally:
                progress.close()
                self.batches.close()
        return self._finish(stop, budget, throughput, log)

    def _announce(self, log: Callable[[str], None], tuner: ThreadTuner, flops: float) -> None:
        layout = self.world.layout
        if self.world.is_distributed:
            log(f"parallel {layout} over {layout.world_size} processes ({self.device.type})")
        log(f"precision {self.precision.describe()}, {flops / 1e6:.2f} MFLOP/token")
        if tuner.source:
            log(f"threads {torch.get_num_threads()} ({tuner.source})")

    def _stop_agreed(self, stop: StopRequest) -> bool:
        if not self.world.is_distributed:
            return bool(stop)
        return _agreed_stop(stop, self.step, self.cfg.log_every, self.world)

    def _train_step(self, log: Callable[[str], None]) -> StepResult:
        """One optimizer step; on many processes the COUNTED_STEP-th also counts collectives."""
        cfg, world = self.cfg, self.world
        counting = world.is_distributed and self.session_steps == COUNTED_STEP
        measure = self.session_steps == 0 and self.device.type != "cuda" and not counting
        self.lr = self.schedule.lr(self.step)
        with count_collectives() if counting else contextlib.nullcontext() as counted:
            result = train_step(
                self.composed, self.optimizer, self.guard, self.batches, self.step, self.lr,
                cfg.grad_accum_steps, cfg.optimizer.grad_clip, self.device,
                measure_memory=measure and not world.is_distributed,
            )  # fmt: skip
        if counting:
            self.comm_bytes = {"comm_bytes_per_step": counted.total_bytes}
            self.comm_bytes.update({f"comm/{op}": n for op, (_, n) in counted.by_op.items()})
            log(f"communicated {counted.total_bytes / 1e6:.3f} MB in step {self.step} on rank 0")
        self.activation_bytes = max(self.activation_bytes, result.activation_bytes)
        self.loader_state = self.batches.state_dict()
        self.step += 1
        self.session_steps += 1
        return result

    def _log_step(
        self,
        result: StepResult,
        total: int | None,
        throughput: Throughput,
        log: Callable[[str], None],
        progress,
    ) -> None:
        """A metrics.jsonl record and a log line; stops a run that keeps skipping steps."""
        record = {
            "step": self.step,
            "loss": round(float(self.world.mean_over_data(result.loss)), 5),
            "lr": self.lr,
            "grad_norm": round(float(result.grad_norm), 4),
            **throughput.read(),
            "skipped_steps": int(self.guard.skipped),
            "peak_memory_mb": round(self._peak_memory() / 2**20, 1),
            **{k: float(v) for k, v in self.precision.log_fields().items()},
            **self.batches.log_fields(),
            **self.comm_bytes,
            **moe_metrics(self.composed.compute),
            "threads": torch.get_num_threads(),
        }
        self.metrics.write(**record)
        progress.set_postfix(loss=record["loss"], refresh=False)
        log(
            f"step {self.step}/{total or '?'} loss {record['loss']:.4f} "
            f"lr {self.lr:.2e} {record['tokens_per_s']:.0f} tok/s "
            f"{record['step_time_s'] * 1000:.0f} ms/step mfu {record['mfu']:.1%}"
            + (f" skipped {record['skipped_steps']}" if record["skipped_steps"] else "")
        )
        self.guard.stop_if_diverged(self.step, self.checkpointer.last_good)
        throughput.reset()

    def _peak_memory(self) -> int:
        modules = [self.model, self.composed.compute]
        return peak_memory_bytes(self.device, modules, self.optimizer, self.activation_bytes)

    def _save(self, budget: StepBudget) -> Path:
        trainer_state = {
            "total_steps": budget.total,
            "plans": [list(p) for p in self.schedule.horizons],
            "minutes": self.cfg.minutes,
            "seconds": budget.clock.elapsed(),
            "precision": self.precision.state_dict(),
            "guard": self.guard.state_dict(),
        }
        return self.checkpointer.save(
            self.step, self.model, self.optimizer, trainer_state, self.loader_state,
            good=self.guard.clean(),
        )  # fmt: skip

    def _finish(
        self, stop: StopRequest, budget: StepBudget, throughput: Throughput, log
    ) -> TrainResult:
        """The closing checkpoint and validation (a stopped run saves and leaves: it has not
        ended), and what the run did."""
        final, interrupted = None, bool(stop)
        if self.session_steps or interrupted or self.resumed_from is None:
            path = self._save(budget)
            if self.world.is_distributed and self.world.is_main:
                from lmforge.train.checkpoint_dcp import export_safetensors

                export_safetensors(path)  # the final checkpoint, ready for inference in one file
            if not interrupted:
                final = self.validator.validate(self.step, log, leave=True)
        else:
            path = self.resumed_from
            print(f"training: reusing {path} (already complete)")
            final = self.validator.run(leave=True)
        tokens = self.session_steps * throughput.tokens_per_step
        tokens_per_s = tokens / self.step_seconds if self.step_seconds else 0.0
        return TrainResult(
            self.step,
            path,
            final,
            tokens_per_s,
            budget.clock.elapsed(),
            interrupted,
            stop.signal if interrupted else None,
            torch.get_num_threads(),
            precision=self.precision.describe(),
            mfu=mfu(throughput.flops_per_token, tokens_per_s, throughput.peak),
            peak_memory_bytes=self._peak_memory(),
            skipped_steps=int(self.guard.skipped),
        )


def _checked_model(
    model_config: ModelConfig, cfg: TrainConfig, data: TrainingData, world: World
) -> ModelConfig:
    """`model_config` with the data's vocabulary, refused where the run cannot train it."""
    model_config = dataclasses.replace(model_config, vocab_size=data.vocab_size)
    cfg.check_model(model_config)
    model_config.validate()
    if world.is_distributed:
        from lmforge.train.distributed import check_parallel

        check_parallel(world, cfg, model_config)
    return model_config


def _quiet(*args: object, **kwargs: object) -> None:
    pass


def _agreed_stop(stop: StopRequest, step: int, every: int, world: World) -> bool:
    """Whether to stop before `step`, agreed by all ranks every `every` steps (at log steps, so
    the hot loop gains no host sync), so that they all stop at the same step.

    A signal may reach one rank only, or reach the ranks while they are at different steps:
    a rank stopping on its own would leave the others waiting in the next step's collectives.
    """
    if step % every or not world.any_rank(bool(stop)):
        return False
    stop.signal = stop.signal or "another rank's stop request"
    return True


def _resumed_total(cfg: TrainConfig, state: dict) -> int | None:
    """The step count a resumed run trains to: `max_steps` when set; else the saved one, or
    None when the time budget changed: the first steps are timed again, as in a new budgeted
    run, and fix how many more steps the remaining time holds."""
    if cfg.max_steps:
        return cfg.max_steps
    if state.get("minutes", cfg.minutes) != cfg.minutes:
        return None
    return state["total_steps"]
