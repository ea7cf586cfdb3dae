"""The flags `train` and `speedrun` share: the config (--preset/--config/--set), precision,
activation checkpointing, compile and threads, the run folder (--out/--fresh), the epilog of
training keys without a flag, and how the parsed flags become one RunConfig.

Torch-free: a bad config is reported before torch is imported.
"""

from __future__ import annotations

import argparse
import dataclasses

from lmforge.config import PRESETS, RunConfig, load_config
from lmforge.train.config import TrainConfig

TRAIN_KEYS = """\
training settings without a flag (--set train.SECTION.KEY=VALUE, or [train.SECTION] in a
TOML file; docs/reference/config.md lists them all):
  precision.cast_module=true       bf16/fp16: cast the model itself, step fp32 master copies
  optimizer.offload=true           keep optimizer state and fp32 master weights on the CPU
  optimizer.fused_adamw=false      lmforge's AdamW instead of PyTorch's fused kernel
  optimizer.name=muon              Muon for the blocks' matrices, AdamW for the rest
  optimizer.muon_lr=0.02           optimizer.name=muon: the matrices' peak learning rate
  optimizer.muon_momentum=0.95     optimizer.name=muon: Nesterov momentum
  optimizer.embed_lr=0.1           the input embedding's AdamW peak learning rate (0: lr)
  max_bad_steps=N                  stop after N non-finite steps in a row (default 25)
  loader.kind=sequential           walk the shards in a seeded order instead of random windows
  checkpoint.every=N               also checkpoint every N steps (always at the end, on
                                   Ctrl-C and on SIGTERM)
  parallel.ddp_bucket_mb=25        --parallel dp: gradient all-reduce bucket size (MB)
  parallel.zero1=true              --parallel dp: shard the optimizer state (ZeRO-1)
  parallel.reshard_after_forward=false  --parallel fsdp: keep gathered weights until
                                   backward (ZeRO-2)
  parallel.sequence_parallel=false --parallel tp: all-reduce instead of sequence-sharded norms
  parallel.collective_timeout_s=N  fail when a collective waits N s (a rank died or hung;
                                   default 600)
  compute.fused_loss=true          the head fused into the cross-entropy: no full logits
  loader.document_mask=true        packed documents attend only to themselves
  compute.kernels=triton           RMSNorm, SwiGLU, RoPE, attention and the fused loss by
                                   Triton (a GPU)
the flat keys of earlier releases (train.lr, train.zero1, ...) still work, with a note
naming the new key
"""

# Flags that set one train key each: (flag attribute, (section or None, field)).
_TRAIN_FLAGS = (
    ("max_steps", (None, "max_steps")),
    ("seed", (None, "seed")),
    ("device", (None, "device")),
    ("parallel", ("parallel", "layout")),
    ("precision", ("precision", "dtype")),
    ("activation_checkpointing", ("compute", "activation_checkpointing")),
)


def add_config_options(p: argparse.ArgumentParser) -> None:
    """--preset, --config and --set."""
    p.add_argument(
        "--preset",
        choices=None,
        metavar="NAME",
        help=f"starting config: {', '.join(PRESETS)} (default: auto, small's recipe at the "
        "shape the time budget buys on this machine)",
    )
    p.add_argument("--config", metavar="FILE.toml", help="TOML file applied over the preset")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one setting, e.g. train.optimizer.lr=1e-3 (repeatable)",
    )


def add_speed_options(p: argparse.ArgumentParser) -> None:
    """Flags for train.precision.dtype, train.compute.activation_checkpointing and
    train.compute.compile, and the CPU threads."""
    p.add_argument(
        "--precision",
        choices=["fp32", "bf16", "fp16", "fp8", "auto"],
        help="compute precision; weights and optimizer stay fp32. bf16: autocast; fp16: "
        "autocast + dynamic loss scaling; fp8: E4M3/E5M2 matmuls in the blocks (real on CUDA "
        "≥ 8.9, simulated elsewhere); auto: bf16 where it is fast (default: the preset's). "
        "train.precision.cast_module=true casts the model itself (fp32 master weights) instead "
        "of autocast",
    )
    p.add_argument(
        "--activation-checkpointing",
        choices=["none", "full", "selective"],
        help="recompute activations in backward per block: full keeps only block inputs, "
        "selective keeps matmul and attention outputs (default: none)",
    )
    p.add_argument("--compile", action="store_true", help="torch.compile each transformer block")
    p.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="CPU threads torch computes with (default: LMFORGE_THREADS, else the fastest of "
        "all cores, half of them, ... timed on the first training steps)",
    )


def add_doc_separator_option(p: argparse.ArgumentParser) -> None:
    """--doc-separator: the .txt line that separates documents (data.doc_separator)."""
    p.add_argument(
        "--doc-separator",
        metavar="TEXT",
        help="a .txt line that is exactly TEXT ends one document and starts the next; it "
        "becomes the end-of-text token ('' : no separator; default <|endoftext|>)",
    )


def add_run_options(p: argparse.ArgumentParser) -> None:
    """--out and --fresh."""
    p.add_argument("--out", metavar="RUN_DIR", help="run folder (default: runs/NAME)")
    p.add_argument("--fresh", action="store_true", help="delete the run folder and start over")


def run_config(args: argparse.Namespace) -> RunConfig:
    """The run's config: preset, TOML file and --set overrides, then the flags given."""
    cfg = load_config(args.preset, args.config, args.set)
    train = with_train_flags(cfg.train, args)
    data = cfg.data
    if getattr(args, "doc_separator", None) is not None:
        data = dataclasses.replace(data, doc_separator=args.doc_separator)
    return dataclasses.replace(cfg, train=train, data=data)


def with_train_flags(train: TrainConfig, args: argparse.Namespace) -> TrainConfig:
    """`train` with the flags given that set train.* keys (--minutes, --max-steps, ...)."""
    if getattr(args, "minutes", None) is not None:
        train = dataclasses.replace(train, minutes=args.minutes, max_steps=0)
    for flag, (section, key) in _TRAIN_FLAGS:
        if getattr(args, flag, None) is not None:
            train = _with(train, section, key, getattr(args, flag))
    if getattr(args, "compile", False):
        train = _with(train, "compute", "compile", True)
    return train


def _with(train: TrainConfig, section: str | None, key: str, value: object) -> TrainConfig:
    """`train` with train.KEY (section None) or train.SECTION.KEY set to `value`."""
    if section is None:
        return dataclasses.replace(train, **{key: value})
    part = dataclasses.replace(getattr(train, section), **{key: value})
    return dataclasses.replace(train, **{section: part})


def with_data(cfg: RunConfig, path: str) -> RunConfig:
    """`cfg` reading its raw documents from `path`."""
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, path=path))
