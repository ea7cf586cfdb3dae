"""The training loop: batches in, optimizer steps, periodic validation, metrics and checkpoints out.

One loop serves every command that trains. It runs for `max_steps`, or for a wall-clock budget
(`minutes`): then the first steps are timed and the step count that fits the budget is fixed;
a WSD run re-fits it to the time actually left as it goes (budget.py), so a slowed machine still
gets a full decay. Every change is a plan saved with the checkpoints (schedule.py), so the
learning rate stays a pure function of the step and a resumed run repeats it. A resumed run
given more steps (or a new budget) continues on a new schedule tail, finished or not. On a CPU
the first steps also choose the thread count (lmforge.threads) unless one is given. How a step
computes (precision, activation checkpointing, compile) is composed in compose.py and run by
step.py; the host reads values back from the device only on log, evaluation and checkpoint
steps.

Under torchrun, `train.parallel` lays the processes out on a device mesh (lmforge.parallel):
every rank runs this same loop on its share of the global batch, rank 0 alone writes metrics
and prints, and all ranks write their shards of each checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
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
from lmforge.parallel.layout import ParallelOptions
from lmforge.parallel.world import World, any_rank, distributed, from_rank_zero, mean_over_data
from lmforge.progress import bar, bar_per_call
from lmforge.threads import ThreadTrial, requested_threads
from lmforge.train.bpb import EvalResult
from lmforge.train.budget import StepClock, refit, steps_in_budget
from lmforge.train.checkpoint import load_model_weights, load_training_state, save_checkpoint
from lmforge.train.checkpoint_dir import is_distributed, list_checkpoints
from lmforge.train.compose import Objective, compose
from lmforge.train.config import TrainConfig
from lmforge.train.data import TrainingData, as_training_data
from lmforge.train.guard import NonFiniteGuard
from lmforge.train.memory import peak_memory_bytes
from lmforge.train.metrics import MetricsLog
from lmforge.train.mfu import mfu, peak_flops
from lmforge.train.optimizers import build_optimizer
from lmforge.train.precision import make_precision
from lmforge.train.schedule import Schedule, rewarm_steps
from lmforge.train.signals import StopRequest, stop_requests
from lmforge.train.step import train_step
from lmforge.train.throughput import Throughput

COUNTED_STEP = 1
"""Runs on many processes count the bytes of every collective in this step (the first steps
are often special: DDP rebuilds its buckets after the first) and log them as
comm_bytes_per_step."""

CALIBRATION_STEPS = 5
"""Budgeted runs time this many steps (after the first, which pays one-off costs) to fix their
step count; until then the horizon is open and only warmup applies."""

REFIT_EVERY = 10
REFIT_WINDOW = 10
"""A budgeted WSD run re-fits its step count to the time left every REFIT_EVERY steps, from
the wall time of its last REFIT_WINDOW steps (budget.py): on the plateau both ways, in the
decay only shorter (the decay then ends sooner, from the learning rate it has reached)."""


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
    `train.eval_tasks`) scores the model on tasks at each validation, logged as `task_<name>`.
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
        with distributed(cfg.parallel, device, cfg.collective_timeout_s) as world:
            return _train(
                model_config,
                cfg,
                as_training_data(data),
                out_dir,
                run_config,
                resume,
                device,
                world,
                given,
                score_tasks,
                init_model,
                clock,
            )
    finally:
        torch.set_num_threads(previous_threads)


def _train(
    model_config: ModelConfig,
    cfg: TrainConfig,
    data: TrainingData,
    out_dir: str | Path,
    run_config: dict | None,
    resume: bool,
    device: torch.device,
    world: World | None,
    given_threads: tuple[int | None, str],
    score_tasks: Callable[[nn.Module], dict[str, float]] | None = None,
    init_model: Callable[[Transformer], None] | None = None,
    clock: BudgetClock | None = None,
) -> TrainResult:
    out_dir = Path(out_dir)
    if score_tasks is not None and world is not None:
        raise LmforgeError(
            "train.eval_tasks scores tasks in a single-process run: leave it out under "
            "torchrun and score the checkpoints with `lmforge eval --tasks`"
        )
    device = world.device if world is not None else device
    main = world is None or world.is_main
    master_device = torch.device("cpu") if cfg.offload_optimizer else device
    torch.manual_seed(cfg.seed)

    tokenizer_dir = data.tokenizer_dir
    model_config = dataclasses.replace(model_config, vocab_size=data.vocab_size)
    if cfg.seq_len > model_config.max_seq_len:
        raise LmforgeError(
            f"train.seq_len {cfg.seq_len} exceeds model.max_seq_len {model_config.max_seq_len}: "
            "lower one or raise the other"
        )
    model_config.validate()
    if world is not None:
        from lmforge.train import distributed  # heavier: import only when used

        distributed.check_parallel(world, cfg, model_config)
    precision = make_precision(cfg.precision, device, cfg.cast_module)

    model = Transformer(model_config)
    if init_model is not None:
        init_model(model)
    model = model.to(master_device)
    options = ParallelOptions(
        cfg.ddp_bucket_mb, cfg.zero1, cfg.reshard_after_forward, cfg.sequence_parallel
    )
    objective = Objective(cfg.fused_loss)
    composed = compose(
        model, precision, device, cfg.activation_checkpointing, cfg.compile, world, options,
        objective, cfg.kernels,
    )  # fmt: skip
    betas = (cfg.beta1, cfg.beta2)
    choice = (cfg.fused_adamw, cfg.optimizer, cfg.muon_lr, cfg.muon_momentum, cfg.embed_lr)
    if world is None:
        optimizer = build_optimizer(model, cfg.lr, betas, cfg.weight_decay, *choice)
    else:
        optimizer = distributed.build_parallel_optimizer(
            model, world, options, cfg.lr, betas, cfg.weight_decay, *choice
        )
    guard = NonFiniteGuard(master_device, cfg.max_bad_steps)
    data_rank, data_parallel = (world.data_rank, world.layout.data_parallel) if world else (0, 1)
    batches = data.batches(cfg, data_rank, data_parallel)
    metrics = MetricsLog(out_dir / "metrics.jsonl") if main else None
    checkpoints_dir = out_dir / "checkpoints"

    step, total_steps, prior_seconds = 0, cfg.max_steps or None, 0.0
    schedule = Schedule(
        cfg.lr,
        cfg.lr * cfg.min_lr_ratio,
        cfg.warmup_steps,
        cfg.schedule,
        cfg.warmup_frac,
        cfg.decay_frac,
    )
    existing = list_checkpoints(checkpoints_dir) if resume else []
    last_good = existing[-1] if existing else None
    if existing:
        if is_distributed(existing[-1]):
            from lmforge.train.checkpoint_dcp import load_distributed

            load_distributed(existing[-1], model, optimizer, data_rank, data_parallel)
            state, loader_state = load_training_state(existing[-1], None)
        elif world is not None:
            raise LmforgeError(
                f"checkpoint {existing[-1]} was written by a single process: resume it without "
                "--parallel, or start over with --fresh"
            )
        else:
            load_model_weights(model, existing[-1])
            composed.weights_to_compute()
            state, loader_state = load_training_state(existing[-1], optimizer)
        step, prior_seconds = state["step"], state["seconds"]
        saved_total = state["total_steps"]
        schedule.plans = [tuple(p) for p in state.get("plans", ())]
        if not schedule.plans and saved_total:  # written before plans were saved
            schedule.plans = [(0, saved_total)]
        total_steps = _resumed_total(cfg, state)
        precision.load_state_dict(state.get("precision", {}))
        if "guard" in state:
            guard.load_state_dict(state["guard"])
        batches.load_state_dict(loader_state)
        if main:
            metrics.truncate_after(step)
            print(f"resuming from {existing[-1]} (step {step})")
    if total_steps is not None and total_steps > step:
        before = list(schedule.plans)
        schedule.plan(step, total_steps)
        if main and len(schedule.plans) > 1 and schedule.plans != before:
            print(_replanned_message(schedule, step))
    threads, threads_source = given_threads
    if threads is not None:
        torch.set_num_threads(threads)
    trial = None
    if threads is None and device.type == "cpu" and world is None:
        trial = ThreadTrial(torch.get_num_threads())
        threads_source = "" if trial.chosen is None else "torch's default"

    flops_per_token = model.flops_per_token(cfg.seq_len)
    peak = peak_flops(device, precision.matmul)  # measured once per machine, then cached
    loader_state = batches.state_dict()  # as of the last completed step: what a checkpoint saves
    clock = clock or BudgetClock()
    clock.resumed_from(prior_seconds)
    elapsed = clock.elapsed

    def run_eval(leave: bool = False) -> EvalResult:
        evaluator = composed.evaluator or composed.compute
        total = data.validation_batches(cfg)
        shown = bar_per_call(
            evaluator, desc="validation", total=total, unit="batch", leave=leave, disable=not main
        )
        with precision.autocast(), shown:
            return data.validate(evaluator, cfg, device)

    def validate(step: int, leave: bool = False) -> EvalResult:
        """A periodic validation, logged to metrics.jsonl with the batches it read."""
        ev = run_eval(leave)
        if main:
            loss, bpb = round(ev.loss, 5), round(ev.bpb, 5)
            metrics.write(step=step, val_loss=loss, val_bpb=bpb, eval_batches=cfg.eval_batches)
        if score_tasks is not None:
            scores = {f"task_{k}": round(v, 4) for k, v in score_tasks(model).items()}
            metrics.write(step=step, **scores)
            log("tasks: " + ", ".join(f"{k[5:]} {v:.3f}" for k, v in scores.items()))
        return ev

    def checkpoint() -> Path:
        trainer_state = {
            "total_steps": total_steps,
            "plans": [list(p) for p in schedule.plans],
            "minutes": cfg.minutes,
            "seconds": elapsed(),
            "precision": precision.state_dict(),
            "guard": guard.state_dict(),
        }
        return save_checkpoint(
            checkpoints_dir,
            step,
            model,
            optimizer,
            trainer_state,
            loader_state,
            run_config or {},
            tokenizer_dir,
            world=world,
        )

    tokens_per_step = cfg.batch_size * cfg.seq_len * cfg.grad_accum_steps
    budget_s = cfg.minutes * 60 if not cfg.max_steps else math.inf
    refits = cfg.schedule == "wsd" and not cfg.max_steps  # the step count follows the time left

    def in_decay(step: int) -> bool:
        """A refitted decay runs to its end: it was fitted to the time left, and is shortened
        if that runs out (cutting it would end the run above the floor)."""
        return refits and schedule.decaying(step)

    step_times: list[float] = []
    step_clock = StepClock(lambda: time.perf_counter())
    settled: list[float] = []  # step times at the final thread count: what fixes a time budget
    activation_bytes = 0
    throughput = Throughput(tokens_per_step, flops_per_token, peak, device)
    interrupted = False
    progress = bar(total=total_steps, initial=step, desc="train", unit="step")
    log = progress.write if main else _quiet  # log lines print above the bar
    if world is not None:
        log(f"parallel {world.layout} over {world.layout.world_size} processes ({device.type})")
    comm_bytes: dict[str, float] = {}
    log(f"precision {precision.describe()}, {flops_per_token / 1e6:.2f} MFLOP/token")
    if threads_source:
        log(f"threads {torch.get_num_threads()} ({threads_source})")
    composed.compute.train()
    with stop_requests() as stop:
        try:
            # Ranks must stop at the same step: on many processes the step count (fixed by
            # rank 0's timing) ends the run, not each rank's own clock.
            while (total_steps is None or step < total_steps) and (
                world is not None or elapsed() < budget_s or in_decay(step)
            ):
                if stop if world is None else _agreed_stop(stop, step, cfg.log_every, device):
                    raise KeyboardInterrupt
                if trial is not None and trial.chosen is None:
                    torch.set_num_threads(trial.threads)
                t0 = time.perf_counter()
                step_clock.step_started()
                lr = schedule.lr(step)
                counting = world is not None and len(step_times) == COUNTED_STEP
                with distributed.count_collectives() if counting else contextlib.nullcontext() as c:
                    result = train_step(
                        composed,
                        optimizer,
                        guard,
                        batches,
                        step,
                        lr,
                        cfg.grad_accum_steps,
                        cfg.grad_clip,
                        device,
                        measure_memory=not step_times and device.type != "cuda" and not world,
                    )
                if counting:
                    comm_bytes = {"comm_bytes_per_step": c.total_bytes}
                    comm_bytes.update({f"comm/{op}": n for op, (_, n) in c.by_op.items()})
                    log(f"communicated {c.total_bytes / 1e6:.3f} MB in step {step} on rank 0")
                activation_bytes = max(activation_bytes, result.activation_bytes)
                loader_state = batches.state_dict()
                step += 1
                throughput.step()
                progress.update()

                if step % cfg.log_every == 0 or step == total_steps:
                    memory = peak_memory_bytes(
                        device, [model, composed.compute], optimizer, activation_bytes
                    )
                    loss = result.loss if world is None else mean_over_data(result.loss)
                    record = {
                        "step": step,
                        "loss": round(float(loss), 5),
                        "lr": lr,
                        "grad_norm": round(float(result.grad_norm), 4),
                        **throughput.read(),
                        "skipped_steps": int(guard.skipped),
                        "peak_memory_mb": round(memory / 2**20, 1),
                        **{k: float(v) for k, v in precision.log_fields().items()},
                        **batches.log_fields(),
                        **comm_bytes,
                        **moe_metrics(composed.compute),
                        "threads": torch.get_num_threads(),
                    }
                    if main:
                        metrics.write(**record)
                    progress.set_postfix(loss=record["loss"], refresh=False)
                    log(
                        f"step {step}/{total_steps or '?'} loss {record['loss']:.4f} "
                        f"lr {lr:.2e} {record['tokens_per_s']:.0f} tok/s "
                        f"{record['step_time_s'] * 1000:.0f} ms/step mfu {record['mfu']:.1%}"
                        + (f" skipped {record['skipped_steps']}" if record["skipped_steps"] else "")
                    )
                    if guard.diverged():
                        raise LmforgeError(_diverged_message(step, cfg.max_bad_steps, last_good))
                    throughput.reset()
                step_times.append(time.perf_counter() - t0)
                if len(step_times) == 1:
                    pass  # the session's first step pays one-off costs: no timing uses it
                elif trial is not None and trial.chosen is None:
                    trial.record(step_times[-1])
                    if trial.chosen is not None:
                        torch.set_num_threads(trial.chosen)
                        settled = list(trial.times[trial.chosen])
                        peak = throughput.peak = peak_flops(device, precision.matmul)
                        log(f"threads {trial.describe()}")
                        throughput.reset()
                else:
                    settled.append(step_times[-1])

                if total_steps is None and len(settled) >= CALIBRATION_STEPS:
                    remaining = budget_s - elapsed()
                    timed = settled[-CALIBRATION_STEPS:]
                    total_steps = steps_in_budget(cfg, sum(timed) / len(timed), remaining, step)
                    if world is not None:
                        total_steps = from_rank_zero(total_steps)
                    schedule.plan(step, total_steps)
                    log(
                        f"time budget {cfg.minutes:g} min: training for {total_steps} steps "
                        f"({schedule.describe_plan()})"
                    )
                    if existing and len(schedule.plans) > 1:  # resumed with a new budget
                        log(_replanned_message(schedule, step))
                    progress.total = total_steps
                    progress.refresh()
                elif refits and total_steps is not None and step % REFIT_EVERY == 0:
                    # the session's first step paid one-off costs: never in the window
                    per_step = step_clock.recent_step_s(min(REFIT_WINDOW, len(step_times) - 1))
                    remaining = budget_s - elapsed()
                    fitted = refit(cfg, schedule, per_step, step_clock.eval_s(), remaining, step)
                    if world is not None:
                        fitted = from_rank_zero(fitted)
                    if fitted != total_steps:
                        decaying = schedule.decaying(step)
                        schedule.plan(step, fitted)
                        total_steps = progress.total = fitted
                        if decaying:
                            log(f"behind the time budget: the decay ends at step {fitted}")
                if cfg.eval_every and step % cfg.eval_every == 0 and step != total_steps:
                    with step_clock.pause(validation=True):
                        ev = validate(step)
                    log(f"step {step} val loss {ev.loss:.4f} bpb {ev.bpb:.4f}")
                    throughput.reset()
                if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                    with step_clock.pause():
                        path = checkpoint()
                    last_good = path if guard.clean() else last_good
                    throughput.reset()
        except KeyboardInterrupt:
            interrupted = True
            why = f"{stop.signal} received" if stop.signal else "interrupted"
            log(f"{why} at step {step}: saving a checkpoint (Ctrl-C again to abandon it)")
        finally:
            progress.close()
            batches.close()

    final = None
    if step_times or interrupted or not existing:
        path = checkpoint()
        if world is not None and main:
            from lmforge.train.checkpoint_dcp import export_safetensors

            export_safetensors(path)  # the final checkpoint, ready for inference in one file
        if not interrupted:  # a stopped run saves and leaves: it has not ended
            final = validate(step, leave=True)
    else:
        path = existing[-1]
        print(f"training: reusing {path} (already complete)")
        final = run_eval(leave=True)
    train_seconds = sum(step_times)
    tokens_per_s = len(step_times) * tokens_per_step / train_seconds if step_times else 0.0
    return TrainResult(
        step,
        path,
        final,
        tokens_per_s,
        elapsed(),
        interrupted,
        stop.signal if interrupted else None,
        torch.get_num_threads(),
        precision=precision.describe(),
        mfu=mfu(flops_per_token, tokens_per_s, peak),
        peak_memory_bytes=peak_memory_bytes(
            device, [model, composed.compute], optimizer, activation_bytes
        ),
        skipped_steps=int(guard.skipped),
    )


def _quiet(*args: object, **kwargs: object) -> None:
    pass


def _agreed_stop(stop: StopRequest, step: int, every: int, device: torch.device) -> bool:
    """Whether to stop before `step`, agreed by all ranks every `every` steps (at log steps, so
    the hot loop gains no host sync), so that they all stop at the same step.

    A signal may reach one rank only, or reach the ranks while they are at different steps:
    a rank stopping on its own would leave the others waiting in the next step's collectives.
    """
    if step % every or not any_rank(bool(stop), device):
        return False
    stop.signal = stop.signal or "another rank's stop request"
    return True


def _diverged_message(step: int, max_bad_steps: int, last_good: Path | None) -> str:
    where = (
        f"the last good checkpoint is {last_good}"
        if last_good is not None
        else "no checkpoint was saved before it"
    )
    return (
        f"training stopped at step {step}: {max_bad_steps} steps in a row had a non-finite loss "
        f"or gradient norm and were skipped; {where}: lower train.lr or change --precision, "
        "then resume from it (or start over with --fresh)"
    )


def _resumed_total(cfg: TrainConfig, state: dict) -> int | None:
    """The step count a resumed run trains to: `max_steps` when set; else the saved one, or
    None when the time budget changed: the first steps are timed again, as in a new budgeted
    run, and fix how many more steps the remaining time holds."""
    if cfg.max_steps:
        return cfg.max_steps
    if state.get("minutes", cfg.minutes) != cfg.minutes:
        return None
    return state["total_steps"]


def _replanned_message(schedule: Schedule, step: int) -> str:
    start, total = schedule.plans[-1]
    if schedule.decaying(start):
        return f"training to step {total} from step {step}: {schedule.describe_plan()}"
    rewarm = rewarm_steps(start, total, schedule.warmup(total))
    steps = f"{rewarm} step" + ("s" if rewarm > 1 else "")
    return (
        f"training to step {total} from step {step}: the learning rate re-warms over {steps} "
        f"to {schedule.lr(start + rewarm):.2e}, then follows a {total}-step run's schedule"
    )
