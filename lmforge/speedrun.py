"""The speedrun: raw text to a trained, evaluated model with samples and a report, in one command.

Stages (each reused when its output is already in the run directory, so a rerun resumes):
documents → dedup → split → tokenizer → token shards → pretraining → evaluation → samples → report.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

from lmforge.config import RunConfig, claim_run_dir, to_dict
from lmforge.errors import LmforgeError
from lmforge.eval import evaluate, token_byte_lengths, unigram_bpb
from lmforge.infer import complete
from lmforge.parallel.world import world_size_from_env
from lmforge.prepare import Prepared, prepare_corpus
from lmforge.report import ReportData, Sample, write_report
from lmforge.tokens import load_tokens
from lmforge.train import TrainResult, train
from lmforge.train.checkpoint import load_checkpoint

SAMPLE_PROMPTS = [
    "def ",
    "import os\n",
    "class Stack:\n    def __init__(self",
    "    for i in range(",
]
SAMPLE_TOKENS = 96
FINAL_EVAL_BATCHES = 64  # the report's evaluation: up to this many batches of the validation split


def cache_root(cfg: RunConfig) -> Path:
    """Where `lmforge train` without --data keeps the prepared built-in corpus, per settings."""
    base = Path(os.environ.get("LMFORGE_CACHE", Path.home() / ".cache" / "lmforge"))
    key = json.dumps([to_dict(cfg)["data"], to_dict(cfg)["tokenizer"], sys.version], sort_keys=True)
    return base / "prepared" / hashlib.sha256(key.encode()).hexdigest()[:16]


def pretrain(
    cfg: RunConfig, out_dir: str | Path, fresh: bool = False, shard_dir: str | Path | None = None
) -> tuple[TrainResult, Prepared | None]:
    """Train into `out_dir` on `shard_dir`, or on `cfg.data` prepared first.

    Data named by path is prepared inside the run folder; the built-in corpus is prepared once
    into a cache shared by runs with the same data and tokenizer settings.
    """
    out = Path(out_dir)
    cfg.validate()
    processes = world_size_from_env()
    if processes > 1 and shard_dir is None:
        raise LmforgeError(
            f"training on {processes} processes needs prepared token shards: run "
            "`lmforge tokenize` (or one single-process run) first, then pass --data SHARD_DIR"
        )
    if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 alone claims the folder
        claim_run_dir(cfg, out, fresh)
    prepared = None
    if shard_dir is None:
        prepared = prepare_corpus(
            cfg.data, cfg.tokenizer, out if cfg.data.path else cache_root(cfg)
        )
        shard_dir = prepared.shard_dir
    result = train(cfg.model, cfg.train, shard_dir, out, run_config=to_dict(cfg))
    return result, prepared


def speedrun(cfg: RunConfig, out_dir: str | Path, fresh: bool = False) -> Path:
    """Run every stage into `out_dir`; return the path of `report.md`."""
    out = Path(out_dir)
    cfg.validate()
    claim_run_dir(cfg, out, fresh)
    prepared = prepare_corpus(cfg.data, cfg.tokenizer, out)
    result = train(cfg.model, cfg.train, prepared.shard_dir, out, run_config=to_dict(cfg))
    model, tokenizer = load_checkpoint(result.checkpoint, "cpu")

    train_tokens = load_tokens(prepared.shard_dir, "train")
    val_tokens = load_tokens(prepared.shard_dir, "val")
    byte_lengths = token_byte_lengths(tokenizer)
    final = evaluate(
        model, val_tokens, byte_lengths, cfg.train.seq_len, cfg.train.batch_size, FINAL_EVAL_BATCHES
    )
    baseline = unigram_bpb(train_tokens, val_tokens, byte_lengths)
    print(
        f"evaluation: val loss {final.loss:.4f}, {final.bpb:.4f} bits/byte (unigram {baseline:.4f})"
    )

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
        for i, prompt in enumerate(SAMPLE_PROMPTS)
    ]
    val_text_tokens = int((byte_lengths[np.asarray(val_tokens, dtype=np.int64)] > 0).sum())
    val_bytes = int(byte_lengths[np.asarray(val_tokens, dtype=np.int64)].sum())
    tokens_trained = (
        result.step * cfg.train.batch_size * cfg.train.seq_len * cfg.train.grad_accum_steps
    )
    report = write_report(
        out,
        ReportData(
            name=cfg.name,
            config_toml=(out / "config.toml").read_text(),
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
            },
            evaluation={"val_loss": final.loss, "val_bpb": final.bpb, "unigram_bpb": baseline},
            samples=samples,
        ),
    )
    print(f"report: {report}")
    return report


def _shape(model: torch.nn.Module) -> str:
    c = model.config
    return f"{c.n_layers} layers, d_model {c.d_model}, {c.n_heads} heads, context {c.max_seq_len}"
