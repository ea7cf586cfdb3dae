"""The `speedrun` and `train` commands: a RunConfig from the shared run flags, then a run;
`speedrun --chat` goes on to the chat speedrun."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmforge.run_flags import (
    TRAIN_KEYS,
    add_config_options,
    add_doc_separator_option,
    add_run_options,
    add_speed_options,
    run_config,
    with_data,
)


def add_commands(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "speedrun",
        help="raw text to a trained, evaluated model and report.md, end to end",
        description="Documents → dedup → tokenizer → shards → pretraining → eval → samples → "
        "report, into one run folder; stages already done there are reused.",
        epilog=TRAIN_KEYS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_options(p)
    p.add_argument("--minutes", type=float, help="training time budget (default: the preset's)")
    p.add_argument(
        "--data",
        help=".txt file, folder of .txt/.jsonl, or JSONL with 'text' "
        "(default: the Python standard library's source)",
    )
    add_doc_separator_option(p)
    p.add_argument(
        "--chat",
        action="store_true",
        help="then SFT on arithmetic conversations and GRPO into RUN_DIR/chat, with held-out "
        "accuracy after each stage (lmforge/chat_speedrun.py)",
    )
    add_speed_options(p)
    add_run_options(p)
    p.set_defaults(func=cmd_speedrun)

    p = commands.add_parser(
        "train",
        help="pretrain a model",
        epilog=TRAIN_KEYS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_options(p)
    p.add_argument(
        "--data",
        help="token shard folder, or raw data as for speedrun "
        "(default: the built-in corpus, prepared once into a cache)",
    )
    add_doc_separator_option(p)
    p.add_argument("--max-steps", type=int, help="optimizer steps (overrides the time budget)")
    p.add_argument(
        "--minutes",
        type=float,
        help="time budget of the whole command: start-up, sizing, training and the closing "
        "validation (the one-off data preparation aside)",
    )
    p.add_argument("--seed", type=int, help="random seed")
    p.add_argument("--device", help="cpu, cuda, mps or auto")
    p.add_argument(
        "--parallel",
        metavar="LAYOUT",
        help="under torchrun: data/tensor/expert parallel degrees, e.g. dp=8, fsdp=4, "
        "fsdp=2,tp=2, fsdp=4,ep=2 (the world size left over goes to dp; ep splits the data "
        "ranks' experts; default: plain DDP over all processes)",
    )
    add_speed_options(p)
    add_run_options(p)
    p.set_defaults(func=cmd_train)


def cmd_speedrun(args: argparse.Namespace) -> int:
    cfg = run_config(args)

    from lmforge.speedrun import speedrun
    from lmforge.stages import command_status, is_rank_zero

    if args.data:
        cfg = with_data(cfg, args.data)
    run = speedrun(cfg, args.out or Path("runs") / cfg.name, fresh=args.fresh, threads=args.threads)
    status = command_status(run.result)
    if status or not is_rank_zero():  # under torchrun, rank 0 alone writes the report
        return status
    print(f"done: {run.report}")
    if args.chat:
        from lmforge.chat_speedrun import chat_speedrun

        out = run.report.parent
        print(f"done: {chat_speedrun(out, out / 'chat', fresh=args.fresh)}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from lmforge.budget_clock import BudgetClock

    clock = BudgetClock()  # the time budget holds the command's start-up too
    cfg = run_config(args)  # a bad config is reported before torch is imported

    from lmforge.stages import command_status, is_rank_zero, train_run

    shard_dir = None
    if args.data and (Path(args.data) / "meta.json").exists():
        shard_dir = args.data
    elif args.data:
        cfg = with_data(cfg, args.data)
    out = args.out or Path("runs") / cfg.name
    result = train_run(cfg, out, args.fresh, shard_dir, args.threads, clock)
    status = command_status(result)
    if status == 0 and is_rank_zero():  # under torchrun, one summary line, not one per rank
        print(
            f"done: step {result.step}, periodic validation ({result.final_eval.tokens:,} "
            f"tokens): loss {result.final_eval.loss:.4f}, {result.final_eval.bpb:.4f} "
            f"bits/byte; checkpoint {result.checkpoint}"
        )
    return status
