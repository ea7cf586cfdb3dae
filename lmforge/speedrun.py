"""The speedrun: raw text to a trained, evaluated model with samples and a report, in one command.

Stages (each reused when its output is already in the run directory, so a rerun resumes):
documents → dedup → split → tokenizer → token shards (`stages.prepare`) → sizing
(`stages.size`) → pretraining (`stages.pretrain`) → evaluation → samples → report. The first
three are `lmforge train`'s (lmforge/stages.py); the last three, this module's, run on rank 0.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from lmforge.atomic import write_text
from lmforge.budget_clock import BudgetClock
from lmforge.config import RunConfig, config_text
from lmforge.device import busy
from lmforge.errors import LmforgeError
from lmforge.eval.run_tasks import describe, evaluate_checkpoint_tasks
from lmforge.infer import complete
from lmforge.progress import bar, bar_per_call
from lmforge.recipe.sizing import Sizing
from lmforge.report.report import ReportData, Sample, warn_if_behind_baseline, write_report
from lmforge.stages import Data, is_rank_zero, prepare, pretrain, size
from lmforge.stages import cache_root as cache_root  # where benchmarks/ find the cached corpus
from lmforge.threads import using_threads
from lmforge.tokens import load_tokens
from lmforge.train import TrainResult
from lmforge.train.bpb import EvalResult, eval_batches, token_byte_lengths, unigram_bpb
from lmforge.train.bpb import evaluate as bits_per_byte
from lmforge.train.checkpoint import load_checkpoint
from lmforge.train.metrics import read_metrics

SAMPLE_PROMPTS = [
    "def ",
    "import os\n",
    "class Stack:\n    def __init__(self",
    "    for i in range(",
]
SAMPLE_TOKENS = 96
FINAL_EVAL_BATCHES = 64  # the report's evaluation: up to this many batches of the validation split


@dataclass
class Speedrun:
    """What a speedrun leaves: its training's result, and the report (None when training was
    stopped, and on every rank but 0 under torchrun)."""

    result: TrainResult
    report: Path | None


@dataclass
class Evaluation:
    """The final evaluation of the trained model: the report's numbers and the code suite's."""

    numbers: dict  # val loss and bpb, the unigram baseline, what was read (_final_evaluation)
    tasks: dict | None  # the code suite's summary (None when the documents cannot be read)
    tokenizer: dict  # its vocabulary size and bytes per token on the validation split


def speedrun(
    cfg: RunConfig, out_dir: str | Path, fresh: bool = False, threads: int | None = None
) -> Speedrun:
    """Run every stage into `out_dir`. A signal that stops training ends the run once the
    checkpoint is saved (`stages.ending` tells how); the stages after training run at the
    thread count training chose (or `threads`). Under torchrun every rank trains; rank 0
    alone prepares the data, evaluates and writes the report."""
    out = Path(out_dir)
    data = prepare(cfg, out, fresh, threads)
    clock = BudgetClock()  # the training budget starts after the data stages: sizing spends it
    cfg, sizing = size(cfg, data, out, threads, clock)
    before = busy.sample()
    result = pretrain(cfg, data, out, clock, sizing, threads)
    machine_load = {
        "calibrated_tokens_per_s": sizing.tokens_per_s if sizing else None,
        "tokens_per_s": result.tokens_per_s,
        "others_cpu_share": busy.others_share(before, busy.sample()),
    }
    if result.interrupted or not is_rank_zero():
        return Speedrun(result, None)
    with using_threads(result.threads):
        model, tokenizer = load_checkpoint(result.checkpoint, "cpu")
        evaluation = evaluate(cfg, data, out, result, model, tokenizer)
        samples = sample(cfg, model, tokenizer)
        path = report(cfg, data, out, result, sizing, machine_load, model, evaluation, samples)
    return Speedrun(result, path)


def evaluate(
    cfg: RunConfig, data: Data, out: Path, result: TrainResult, model, tokenizer
) -> Evaluation:
    """The final evaluation: bits per byte over up to FINAL_EVAL_BATCHES batches of the
    validation split beside the unigram baseline (recorded in metrics.jsonl under `final_`
    names), and the code suite (saved to eval/)."""
    train_tokens = load_tokens(data.shard_dir, "train")
    val_tokens = load_tokens(data.shard_dir, "val")
    byte_lengths = token_byte_lengths(tokenizer)
    batches = eval_batches(
        len(val_tokens), cfg.train.seq_len, cfg.train.batch_size, FINAL_EVAL_BATCHES
    )
    with bar_per_call(model, desc="final evaluation", total=batches, unit="batch"):
        final = bits_per_byte(
            model,
            val_tokens,
            byte_lengths,
            cfg.train.seq_len,
            cfg.train.batch_size,
            FINAL_EVAL_BATCHES,
        )
    baseline = unigram_bpb(train_tokens, val_tokens, byte_lengths)
    numbers = _final_evaluation(cfg, final, baseline, len(val_tokens), result.final_eval.bpb)
    print(
        f"final evaluation: val loss {final.loss:.4f}, {final.bpb:.4f} bits/byte over "
        f"{final.tokens:,} tokens in {batches} batches (unigram {baseline:.4f})"
    )
    warn_if_behind_baseline(final.bpb, baseline)
    _record_final_eval(out / "metrics.jsonl", result.step, numbers)
    tasks = _evaluate_tasks(out, result.checkpoint)
    val_lengths = byte_lengths[np.asarray(val_tokens, dtype=np.int64)]
    bytes_per_token = int(val_lengths.sum()) / int((val_lengths > 0).sum())
    return Evaluation(
        numbers, tasks, {"vocab_size": tokenizer.vocab_size, "bytes_per_token": bytes_per_token}
    )


def sample(cfg: RunConfig, model, tokenizer) -> list[Sample]:
    """The model's continuations of SAMPLE_PROMPTS, seeded from the config."""
    return [
        Sample(
            prompt,
            complete(
                model,
                tokenizer,
                prompt,
                SAMPLE_TOKENS,
                temperature=0.8,
                top_p=0.95,
                seed=cfg.train.seed + i,
            ),
        )
        for i, prompt in enumerate(bar(SAMPLE_PROMPTS, desc="samples", unit="sample"))
    ]


def report(
    cfg: RunConfig,
    data: Data,
    out: Path,
    result: TrainResult,
    sizing: Sizing | None,
    machine_load: dict,
    model: torch.nn.Module,
    evaluation: Evaluation,
    samples: list[Sample],
) -> Path:
    """report.md and its plots, from every stage's output; returns its path."""
    tokens_trained = (
        result.step * cfg.train.batch_size * cfg.train.seq_len * cfg.train.grad_accum_steps
    )
    writing = bar(total=1, desc="report", unit="file")  # plots, then report.md
    path = write_report(
        out,
        ReportData(
            name=cfg.name,
            config_toml=config_text(cfg),  # as trained: the sized shape and minutes
            data_stats=data.prepared.stats,
            tokenizer=evaluation.tokenizer,
            model={
                "parameters": sum(p.numel() for p in model.parameters()),
                "shape": _shape(model),
            },
            training={
                "steps": result.step,
                "seconds": result.seconds,
                "tokens": tokens_trained,
                "tokens_per_s": result.tokens_per_s,
                "precision": result.precision,
                "mfu": result.mfu,
                "peak_memory_bytes": result.peak_memory_bytes,
                "skipped_steps": result.skipped_steps,
                "threads": result.threads,
            },
            evaluation=evaluation.numbers,
            samples=samples,
            sizing={**asdict(sizing), "reason": sizing.reason} if sizing else None,
            machine_load=machine_load,
            tasks=evaluation.tasks,
        ),
    )
    writing.update()
    writing.close()
    print(f"report: {path}")
    return path


def _evaluate_tasks(out: Path, checkpoint: Path) -> dict | None:
    """The code suite on the final checkpoint, saved to eval/ as `lmforge eval --tasks code
    --out RUN/eval` saves it; None, with a note, where the run's documents cannot be read."""
    try:
        results = evaluate_checkpoint_tasks(checkpoint, ["code"], out / "eval")
    except LmforgeError as e:
        print(f"tasks: skipped ({e})")
        return None
    for result in results:
        print(f"tasks: {describe(result)}")
    return json.loads((out / "eval" / "summary.json").read_text())


def _final_evaluation(
    cfg: RunConfig, final: EvalResult, baseline: float, val_tokens: int, periodic_bpb: float
) -> dict:
    """The report's evaluation: the final one and how much it read, beside the last periodic
    validation (metrics.jsonl's `val_bpb`, over train.eval.batches batches)."""
    seq_len, batch_size = cfg.train.seq_len, cfg.train.batch_size
    windows = min(math.ceil((val_tokens - seq_len) / seq_len), batch_size * FINAL_EVAL_BATCHES)
    return {
        "val_loss": final.loss,
        "val_bpb": final.bpb,
        "unigram_bpb": baseline,
        "batches": math.ceil(windows / batch_size),
        "windows": windows,
        "seq_len": seq_len,
        "tokens": final.tokens,
        "periodic_val_bpb": periodic_bpb,
        "periodic_batches": cfg.train.eval.batches,
    }


def _record_final_eval(metrics_path: Path, step: int, evaluation: dict) -> None:
    """Append the final evaluation to metrics.jsonl under its own `final_` names (replacing one
    an earlier run in the folder recorded), so it is never read as a periodic `val_bpb`."""
    kept = [r for r in read_metrics(metrics_path) if "final_val_bpb" not in r]
    kept.append(
        {
            "step": step,
            "final_val_loss": round(evaluation["val_loss"], 5),
            "final_val_bpb": round(evaluation["val_bpb"], 5),
            "final_eval_batches": evaluation["batches"],
            "final_eval_tokens": evaluation["tokens"],
        }
    )
    write_text(metrics_path, "".join(json.dumps(r) + "\n" for r in kept))


def _shape(model: torch.nn.Module) -> str:
    c = model.config
    return f"{c.n_layers} layers, d_model {c.d_model}, {c.n_heads} heads, context {c.max_seq_len}"
