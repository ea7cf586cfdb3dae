"""The `data run` and `data train-classifier` commands: the document pipeline."""

from __future__ import annotations

import argparse


def add_commands(commands: argparse._SubParsersAction) -> None:
    data = commands.add_parser("data", help="data pipeline: clean, filter, deduplicate documents")
    data_commands = data.add_subparsers(dest="data_command", required=True, metavar="COMMAND")
    p = data_commands.add_parser(
        "run",
        help="run a data pipeline over files, folders, stdlib or hf:NAME",
        description="Read the inputs, run the steps in order (extract, langid, quality, "
        "toxicity, pii, classifier, exact_dedup, line_dedup, minhash_dedup) and write shards, "
        "stats.json and summary.md. Flags override the --config file; a rerun resumes.",
    )
    p.add_argument("--config", metavar="FILE.toml", help="pipeline TOML (see examples/)")
    p.add_argument("--input", nargs="+", metavar="PATH", help="files, folders, stdlib or hf:NAME")
    p.add_argument("--output", metavar="DIR", help="output folder (new or a run to resume)")
    p.add_argument("--steps", metavar="A,B,...", help="comma-separated steps, run in order")
    p.add_argument("--workers", type=int, help="worker processes (0: all cores; default 1)")
    p.add_argument("--executor", choices=["local", "ray"], help="where tasks run (default local)")
    p.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="STEP.KEY=VALUE",
        help="override one setting, e.g. langid.min_confidence=0.8 (repeatable)",
    )
    p.set_defaults(func=cmd_data_run)

    p = data_commands.add_parser(
        "train-classifier",
        help="train the hashed n-gram quality classifier: target (positive) vs raw (negative)",
    )
    p.add_argument("--positive", nargs="+", required=True, metavar="PATH", help="target data T")
    p.add_argument("--negative", nargs="+", required=True, metavar="PATH", help="raw data R")
    p.add_argument("--out", required=True, metavar="FILE", help="model file to write")
    p.set_defaults(func=cmd_data_train_classifier)


def cmd_data_run(args: argparse.Namespace) -> int:
    from lmforge.data.pipeline.commands import data_run

    flags = {
        "input": args.input,
        "output": args.output,
        "steps": args.steps,
        "workers": args.workers,
        "executor": args.executor,
        "address": args.address,
    }
    data_run(args.config, flags, args.set)
    return 0


def cmd_data_train_classifier(args: argparse.Namespace) -> int:
    from lmforge.data.pipeline.commands import train_classifier_files

    train_classifier_files(args.positive, args.negative, args.out)
    return 0
