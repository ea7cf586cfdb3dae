"""The `eval` command: validation loss and bits per byte of a checkpoint."""

from __future__ import annotations

import argparse


def add_commands(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("eval", help="validation loss and bits per byte of a checkpoint")
    p.add_argument("--checkpoint", required=True, help="checkpoint or run folder")
    p.add_argument(
        "--data",
        help="token shard folder (its val shard) or raw data (its held-out split); default: "
        "the validation split of the data the checkpoint's run trained on",
    )
    p.add_argument("--max-batches", type=int, default=64, help="evaluation batches of 8 windows")
    p.add_argument("--device", default="cpu", help="cpu, cuda or mps")
    p.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    from lmforge.train.checkpoint_dir import check_checkpoint

    check_checkpoint(args.checkpoint)
    from lmforge.eval.run import evaluate_checkpoint

    evaluated = evaluate_checkpoint(
        args.checkpoint, args.data, max_batches=args.max_batches, device=args.device
    )
    result = evaluated.result
    print(evaluated.describe())
    print(
        f"val loss {result.loss:.4f} nats/token, {result.bpb:.4f} bits/byte "
        f"({result.tokens:,} tokens, {result.bytes:,} bytes)"
    )
    return 0
