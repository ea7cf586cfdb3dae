"""The `quantize` command: a checkpoint to an int8 or int4 checkpoint that every decoding
command loads.

Calibration (AWQ and GPTQ) reads the validation split through eval's reader, so it lives above
eval/ and quant/.
"""

from __future__ import annotations

import argparse

from lmforge.errors import LmforgeError


def add_commands(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "quantize",
        help="write an int8 or int4 weight-only copy of a checkpoint",
        description="Quantize every block's Linear weights (int8 per output channel, or int4 "
        "per group with a zero point, two codes a byte) and write a checkpoint that chat, "
        "serve, generate and eval load. The embedding and output head keep their dtype.",
    )
    p.add_argument("--checkpoint", required=True, help="checkpoint or run folder")
    p.add_argument("--scheme", required=True, choices=["int8", "int4"])
    p.add_argument("--group-size", type=int, default=128, choices=[32, 64, 128], help="int4")
    p.add_argument(
        "--method",
        default="rtn",
        choices=["rtn", "awq", "gptq"],
        help="round to nearest; AWQ's activation-aware scales; GPTQ's error feedback",
    )
    p.add_argument(
        "--calibration",
        metavar="PATH",
        help="documents or token shards for awq/gptq (default: the validation split of the "
        "data the checkpoint trained on)",
    )
    p.add_argument("--calibration-sequences", type=int, default=128, metavar="N")
    p.add_argument("--quantize-head", action="store_true", help="quantize the output head too")
    p.add_argument("--out", required=True, help="new checkpoint folder to write")
    p.set_defaults(func=cmd_quantize)


def cmd_quantize(args: argparse.Namespace) -> int:
    from lmforge.train.checkpoint_dir import check_checkpoint

    check_checkpoint(args.checkpoint)
    if args.calibration_sequences < 1:
        raise LmforgeError("--calibration-sequences must be at least 1")
    from lmforge.quant.checkpoint import quantize_checkpoint

    calibration = None
    if args.method != "rtn":
        calibration = calibration_ids(args.checkpoint, args.calibration, args.calibration_sequences)
    out = quantize_checkpoint(
        args.checkpoint,
        args.out,
        args.scheme,
        args.group_size,
        args.method,
        calibration,
        args.quantize_head,
    )
    from lmforge.quant.checkpoint import read_quantization

    group_size = read_quantization(out)["group_size"]
    group = f"-g{group_size}" if group_size else ""
    print(f"quantized {args.checkpoint} to {args.scheme}{group} ({args.method}): {out}")
    return 0


def calibration_ids(checkpoint: str, data: str | None, sequences: int):
    """(N, T) token ids: up to `sequences` consecutive windows of the validation split, T the
    model's context (at most 512)."""
    import torch

    from lmforge.eval.heldout_loss import validation_tokens
    from lmforge.tokenizer import Tokenizer
    from lmforge.train.bpb import eval_windows
    from lmforge.train.checkpoint_dir import read_model_config, resolve_checkpoint

    found = resolve_checkpoint(checkpoint)
    tokenizer = Tokenizer.load(found / "tokenizer")
    tokens, _, _, _ = validation_tokens(found, tokenizer, data)
    seq_len = min(read_model_config(found).max_seq_len, 512)
    starts = eval_windows(tokens, seq_len, sequences)
    return torch.stack([torch.from_numpy(tokens[s : s + seq_len].astype("int64")) for s in starts])
