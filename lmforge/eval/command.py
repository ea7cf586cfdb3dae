"""The `eval` command: bits per byte of a checkpoint (the default), or its scores on tasks."""

from __future__ import annotations

import argparse
import json


def add_commands(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("eval", help="bits per byte and task scores of a checkpoint")
    p.add_argument("--checkpoint", required=True, help="checkpoint or run folder")
    p.add_argument(
        "--tasks",
        default="bpb",
        help="comma-separated: bpb (default), code (the built-in code suite), code_next_line, "
        "code_identifier, code_closing, humaneval, or task spec files (.toml, .yaml; lm-eval's "
        "task YAMLs too)",
    )
    p.add_argument("--limit", type=int, help="evaluate the first N examples of each task")
    p.add_argument("--num-fewshot", type=int, help="few-shot examples (default: each task's own)")
    p.add_argument("--batch-size", type=int, default=8, help="requests generated at once")
    p.add_argument("--out", help="folder for summary.json and <task>.jsonl (one line an example)")
    p.add_argument(
        "--harness",
        choices=("lmforge", "lm-eval"),
        default="lmforge",
        help="run the tasks with lmforge's evaluator, or with lm-evaluation-harness through "
        "lmforge's model class (needs lmforge[eval])",
    )
    p.add_argument(
        "--data",
        help="bpb only: token shard folder (its val shard) or raw data (its held-out split); "
        "default: the validation split of the data the checkpoint's run trained on",
    )
    p.add_argument("--max-batches", type=int, default=64, help="bpb: batches of 8 windows")
    p.add_argument("--device", default="cpu", help="cpu, cuda or mps")
    p.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    from lmforge.train.checkpoint_dir import check_checkpoint

    check_checkpoint(args.checkpoint)
    names = [n.strip() for n in args.tasks.split(",") if n.strip()]
    if "bpb" in names:
        _bpb(args)
        names.remove("bpb")
    if not names:
        return 0
    if args.harness == "lm-eval":
        from lmforge.eval.lm_eval_model import run_lm_eval

        results = run_lm_eval(args.checkpoint, names, args.limit, args.num_fewshot, args.batch_size)
        print(json.dumps(results, indent=1, default=str))
        return 0
    from lmforge.eval.run_tasks import describe, evaluate_checkpoint_tasks

    results = evaluate_checkpoint_tasks(
        args.checkpoint,
        names,
        args.out,
        args.limit,
        args.num_fewshot,
        args.device,
        args.batch_size,
    )
    for result in results:
        print(describe(result))
    if args.out:
        print(f"wrote {args.out}/summary.json and one <task>.jsonl per task")
    return 0


def _bpb(args: argparse.Namespace) -> None:
    from lmforge.eval.heldout_loss import evaluate_checkpoint

    evaluated = evaluate_checkpoint(
        args.checkpoint, args.data, max_batches=args.max_batches, device=args.device
    )
    result = evaluated.result
    print(evaluated.describe())
    print(
        f"val loss {result.loss:.4f} nats/token, {result.bpb:.4f} bits/byte "
        f"({result.tokens:,} tokens, {result.bytes:,} bytes)"
    )
