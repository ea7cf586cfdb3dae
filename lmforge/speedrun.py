"""The speedrun: raw text to a trained, evaluated model with samples and a report, in one command.

Stages (each reused when its output is already in the run directory, so a rerun resumes):
documents → dedup → split → tokenizer → token shards → pretraining → evaluation → samples → report.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from lmforge.atomic import write_text
from lmforge.budget_clock import BudgetClock
from lmforge.config import RUN_FOLDER, RunConfig, config_text, to_dict
from lmforge.device import load
from lmforge.errors import LmforgeError
from lmforge.eval.run_tasks import describe, evaluate_checkpoint_tasks
from lmforge.infer import complete
from lmforge.parallel.world import world_size_from_env
from lmforge.prepare import Prepared, prepare_corpus
from lmforge.progress import bar, bar_per_call
from lmforge.recipe.sizing import Sizing, size_run
from lmforge.report.report import ReportData, Sample, warn_if_behind_baseline, write_report
from lmforge.run_dir import RunDir
from lmforge.threads import requested_threads, using_threads
from lmforge.tokens import load_tokens
from lmforge.train import TrainResult, train
from lmforge.train.bpb import EvalResult, eval_batches, evaluate, token_byte_lengths, unigram_bpb
from lmforge.train.checkpoint import load_checkpoint
from lmforge.train.checkpoint_dir import TRAINED_ON, data_record
from lmforge.train.metrics import read_metrics
from lmforge.train.signals import RunStopped, exit_status, stopped_message

SAMPLE_PROMPTS = [
    "def ",
    "import os\n",
    "class Stack:\n    def __init__(self",
    "    for i in range(",
]
SAMPLE_TOKENS = 96
FINAL_EVAL_BATCHES = 64  # the report's evaluation: up to this many batches of the validation split
PREPARE_WAIT_S = 3 * 3600  # under torchrun, how long the other ranks wait for rank 0's data


def cache_root(cfg: RunConfig) -> Path:
    """Where `lmforge train` without --data keeps the prepared built-in corpus, per settings."""
    base = Path(os.environ.get("LMFORGE_CACHE", Path.home() / ".cache" / "lmforge"))
    key = json.dumps([to_dict(cfg)["data"], to_dict(cfg)["tokenizer"], sys.version], sort_keys=True)
    return base / "prepared" / hashlib.sha256(key.encode()).hexdigest()[:16]


def pretrain(
    cfg: RunConfig,
    out_dir: str | Path,
    fresh: bool = False,
    shard_dir: str | Path | None = None,
    threads: int | None = None,
    clock: BudgetClock | None = None,
) -> tuple[TrainResult, Prepared | None]:
    """Train into `out_dir` on `shard_dir`, or on `cfg.data` prepared first.

    Data named by path is prepared inside the run folder; the built-in corpus is prepared once
    into a cache shared by runs with the same data and tokenizer settings; under torchrun rank 0
    prepares it while the others wait (`prepare_once`). `threads` as for `train`.
    The time budget is spent on `clock` (the command's; default: one started now), less the
    data preparation, which is done once and cached: sizing, training and the closing
    validation all spend it.
    """
    clock = clock or BudgetClock()
    out = Path(out_dir)
    cfg.validate()
    requested_threads(threads)  # a bad count fails before any work
    prepared = None
    if shard_dir is None:
        root = out if cfg.data.path else cache_root(cfg)
        with clock.excluded():
            prepared = prepare_once(cfg, out, fresh, root)
        shard_dir = prepared.shard_dir
    elif _rank() == 0:  # under torchrun, rank 0 alone claims the folder
        RunDir(out, RUN_FOLDER).claim(cfg, fresh)
    cfg, sizing = size_run(cfg, shard_dir, out, requested_threads(threads)[0], clock)
    threads = threads or (sizing.threads if sizing else None)
    documents = (cfg.data.path or "stdlib") if prepared else None  # None: shards given ready-made
    run_config = {**to_dict(cfg), TRAINED_ON: data_record(shard_dir, documents)}
    result = train(
        cfg.model,
        cfg.train,
        shard_dir,
        out,
        run_config=run_config,
        threads=threads,
        score_tasks=_task_scorer(cfg, documents, shard_dir),
        clock=clock,
    )
    if prepared is not None:
        _drop_ready_marker(prepared.root)  # every rank read it: they all trained together
    return result, prepared


def _task_scorer(cfg: RunConfig, documents: str | None, shard_dir: str | Path):
    """`train.eval_tasks` as the callback `train` scores its model with (eval/periodic.py)."""
    names = [n.strip() for n in cfg.train.eval_tasks.split(",") if n.strip()]
    if not names:
        return None
    from lmforge.eval.periodic import task_evaluator
    from lmforge.eval.run_tasks import RunDocuments

    run_docs = RunDocuments(documents, cfg.data.val_fraction) if documents else None
    return task_evaluator(names, run_docs, Path(shard_dir) / "tokenizer")


def prepare_once(cfg: RunConfig, out: Path, fresh: bool, root: Path) -> Prepared:
    """Claim the run folder and prepare `cfg.data` into `root` (or reuse it there).

    Under torchrun, rank 0 alone claims and prepares while the other ranks wait for its
    marker file (the process group is not up yet: training starts it), then read the same
    prepared folder; a failure on rank 0 is written into the marker so the others stop too.
    """
    if world_size_from_env() == 1:
        RunDir(out, RUN_FOLDER).claim(cfg, fresh)
        return prepare_corpus(cfg.data, cfg.tokenizer, root)
    marker = _ready_marker(root)
    if _rank() == 0:
        try:
            RunDir(out, RUN_FOLDER).claim(cfg, fresh)
            prepared = prepare_corpus(cfg.data, cfg.tokenizer, root)
        except BaseException as e:
            _write_marker(marker, f"failed: {type(e).__name__}: {e}")
            raise
        _write_marker(marker, "ready")
        return prepared
    deadline = time.monotonic() + PREPARE_WAIT_S
    while not marker.is_file():
        if time.monotonic() > deadline:
            raise LmforgeError(
                f"rank {_rank()}: rank 0 did not prepare the data in {root} within "
                f"{PREPARE_WAIT_S} s: check rank 0's output, or prepare it first with one process"
            )
        time.sleep(0.2)
    state = marker.read_text()
    if state != "ready":
        raise LmforgeError(f"rank {_rank()}: rank 0 could not prepare the data ({state})")
    return Prepared(root, json.loads((root / "data" / "stats.json").read_text()))


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _ready_marker(root: Path) -> Path:
    """This launch's marker: torchrun's run id (or the rendezvous address) names it, so a
    marker left by an earlier launch is never mistaken for this one's."""
    launch = os.environ.get("TORCHELASTIC_RUN_ID") or "{}-{}".format(
        os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    )
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in launch)
    return root / f".prepared-{safe}"


def _write_marker(marker: Path, state: str) -> None:
    write_text(marker, state)


def _drop_ready_marker(root: Path) -> None:
    if world_size_from_env() > 1 and _rank() == 0:
        _ready_marker(root).unlink(missing_ok=True)


def speedrun(
    cfg: RunConfig, out_dir: str | Path, fresh: bool = False, threads: int | None = None
) -> Path:
    """Run every stage into `out_dir`; return the path of `report.md`.

    A signal that stops training raises RunStopped once the checkpoint is saved; the stages
    after training run at the thread count training chose (or `threads`). Under torchrun every
    rank trains; rank 0 alone prepares the data, evaluates and writes the report.
    """
    out = Path(out_dir)
    cfg.validate()
    requested_threads(threads)
    prepared = prepare_once(cfg, out, fresh, out)
    clock = BudgetClock()  # the training budget's start: sizing spends it too
    cfg, sizing = size_run(cfg, prepared.shard_dir, out, requested_threads(threads)[0], clock)
    trained_on = data_record(prepared.shard_dir, cfg.data.path or "stdlib")
    run_config = {**to_dict(cfg), TRAINED_ON: trained_on}
    before = load.sample()
    threads = threads or (sizing.threads if sizing else None)
    result = train(
        cfg.model,
        cfg.train,
        prepared.shard_dir,
        out,
        run_config=run_config,
        threads=threads,
        score_tasks=_task_scorer(cfg, cfg.data.path or "stdlib", prepared.shard_dir),
        clock=clock,
    )
    machine_load = {
        "calibrated_tokens_per_s": _calibrated(sizing),
        "tokens_per_s": result.tokens_per_s,
        "others_cpu_share": load.others_share(before, load.sample()),
    }
    _drop_ready_marker(prepared.root)
    if result.interrupted:
        message = stopped_message(result.stop_signal, result.step, result.checkpoint)
        raise RunStopped(message, exit_status(result.stop_signal))
    if _rank() != 0:  # under torchrun, rank 0 alone evaluates and writes the report
        return out / "report.md"
    with using_threads(result.threads):
        return _evaluate_and_report(cfg, out, prepared, result, sizing, machine_load)


def _calibrated(sizing: Sizing | None) -> float | None:
    """The chosen shape's tokens/s timed before training, when the run was sized."""
    if sizing is None:
        return None
    return sizing.tokens_per_s


def _evaluate_and_report(
    cfg: RunConfig,
    out: Path,
    prepared: Prepared,
    result: TrainResult,
    sizing: Sizing | None,
    machine_load: dict,
) -> Path:
    """The stages after training: evaluation, samples and the report."""
    model, tokenizer = load_checkpoint(result.checkpoint, "cpu")

    train_tokens = load_tokens(prepared.shard_dir, "train")
    val_tokens = load_tokens(prepared.shard_dir, "val")
    byte_lengths = token_byte_lengths(tokenizer)
    batches = eval_batches(
        len(val_tokens), cfg.train.seq_len, cfg.train.batch_size, FINAL_EVAL_BATCHES
    )
    with bar_per_call(model, desc="final evaluation", total=batches, unit="batch"):
        final = evaluate(
            model,
            val_tokens,
            byte_lengths,
            cfg.train.seq_len,
            cfg.train.batch_size,
            FINAL_EVAL_BATCHES,
        )
    baseline = unigram_bpb(train_tokens, val_tokens, byte_lengths)
    evaluation = _final_evaluation(cfg, final, baseline, len(val_tokens), result.final_eval.bpb)
    print(
        f"final evaluation: val loss {final.loss:.4f}, {final.bpb:.4f} bits/byte over "
        f"{final.tokens:,} tokens in {batches} batches (unigram {baseline:.4f})"
    )
    warn_if_behind_baseline(final.bpb, baseline)
    _record_final_eval(out / "metrics.jsonl", result.step, evaluation)
    tasks = _evaluate_tasks(out, result.checkpoint)

    samples = [
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
    val_text_tokens = int((byte_lengths[np.asarray(val_tokens, dtype=np.int64)] > 0).sum())
    val_bytes = int(byte_lengths[np.asarray(val_tokens, dtype=np.int64)].sum())
    tokens_trained = (
        result.step * cfg.train.batch_size * cfg.train.seq_len * cfg.train.grad_accum_steps
    )
    writing = bar(total=1, desc="report", unit="file")  # plots, then report.md
    report = write_report(
        out,
        ReportData(
            name=cfg.name,
            config_toml=config_text(cfg),  # as trained: the sized shape and minutes
            data_stats=prepared.stats,
            tokenizer={
                "vocab_size": tokenizer.vocab_size,
                "bytes_per_token": val_bytes / val_text_tokens,
            },
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
            evaluation=evaluation,
            samples=samples,
            sizing={**asdict(sizing), "reason": sizing.reason} if sizing else None,
            machine_load=machine_load,
            tasks=tasks,
        ),
    )
    writing.update()
    writing.close()
    print(f"report: {report}")
    return report


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
    validation (metrics.jsonl's `val_bpb`, over train.eval_batches batches)."""
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
        "periodic_batches": cfg.train.eval_batches,
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
