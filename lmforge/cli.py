"""The `lmforge` command: parse arguments, then call one stage function.

User errors (LmforgeError) print as one line on stderr with exit code 2; Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from lmforge.errors import LmforgeError

TRAIN_KEYS = """\
training settings without a flag (--set train.KEY=VALUE, or [train] in a TOML file):
  cast_module=true          bf16/fp16: cast the model itself, step fp32 master copies
  offload_optimizer=true    keep optimizer state and fp32 master weights on the CPU
  fused_adamw=false         lmforge's AdamW instead of PyTorch's fused kernel
  max_bad_steps=N           stop after N non-finite steps in a row (default 25)
  loader=sequential         walk the shards in a seeded order instead of random windows
  checkpoint_every=N        also checkpoint every N steps (always at the end, on Ctrl-C
                            and on SIGTERM)
"""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except LmforgeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lmforge",
        description="A complete LLM system: data, tokenizer, training, evaluation, inference.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = commands.add_parser(
        "speedrun",
        help="raw text to a trained, evaluated model and report.md, end to end",
        description="Documents → dedup → tokenizer → shards → pretraining → eval → samples → "
        "report, into one run folder; stages already done there are reused.",
        epilog=TRAIN_KEYS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _config_options(p)
    p.add_argument("--minutes", type=float, help="training time budget (default: the preset's)")
    p.add_argument(
        "--data",
        help=".txt file, folder of .txt/.jsonl, or JSONL with 'text' "
        "(default: the Python standard library's source)",
    )
    _speed_options(p)
    _run_options(p)
    p.set_defaults(func=cmd_speedrun)

    tokenizer = commands.add_parser("tokenizer", help="tokenizer commands")
    tok_commands = tokenizer.add_subparsers(
        dest="tokenizer_command", required=True, metavar="COMMAND"
    )
    p = tok_commands.add_parser(
        "train",
        help="train a byte-level BPE tokenizer",
        description="Train a byte-level BPE tokenizer on files streamed from disk (.txt: one "
        "text per file; .jsonl: each line's 'text'). The result is the same for any --workers.",
    )
    p.add_argument(
        "--input", nargs="+", required=True, metavar="PATH", help="text/JSONL files or folders"
    )
    p.add_argument(
        "--vocab-size", type=int, default=4096, help="total vocabulary incl. special tokens"
    )
    p.add_argument(
        "--special-token",
        action="extend",
        nargs="+",
        metavar="TOKEN",
        help="special token(s) (repeatable; default <|endoftext|>)",
    )
    p.add_argument(
        "--pattern", default="gpt2", choices=["gpt2", "gpt4"], help="pre-tokenization regex"
    )
    p.add_argument("--out", required=True, help="tokenizer folder to write")
    p.add_argument(
        "--workers", type=int, default=0, help="pre-tokenization processes (0: all cores)"
    )
    p.add_argument(
        "--invalid-utf8",
        default="replace",
        choices=["replace", "skip"],
        help="bytes that are not UTF-8: replace by U+FFFD or skip (counted either way)",
    )
    p.set_defaults(func=cmd_tokenizer_train)

    p = tok_commands.add_parser(
        "stats",
        help="bytes per token of tokenizers side by side on the same text",
        description="Compression of each tokenizer (UTF-8 bytes per token) on the same documents.",
    )
    p.add_argument(
        "--tokenizer",
        nargs="+",
        required=True,
        metavar="DIR",
        help="tokenizer folders, .tiktoken files, or 'gpt2' (tiktoken's GPT-2)",
    )
    p.add_argument(
        "--input", nargs="*", default=[], metavar="PATH", help="documents (default: the stdlib)"
    )
    p.set_defaults(func=cmd_tokenizer_stats)

    p = commands.add_parser("tokenize", help="encode documents into train/val token shards")
    p.add_argument("--tokenizer", required=True, help="tokenizer folder")
    p.add_argument(
        "--input", nargs="+", required=True, metavar="PATH", help="text/JSONL files or folders"
    )
    p.add_argument("--out", required=True, help="shard folder to write")
    p.add_argument(
        "--val-fraction", type=float, default=0.01, help="documents held out (by id hash)"
    )
    p.add_argument("--workers", type=int, default=0, help="encoding processes (0: all cores)")
    p.set_defaults(func=cmd_tokenize)

    p = commands.add_parser(
        "train",
        help="pretrain a model",
        epilog=TRAIN_KEYS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _config_options(p)
    p.add_argument(
        "--data",
        help="token shard folder, or raw data as for speedrun "
        "(default: the built-in corpus, prepared once into a cache)",
    )
    p.add_argument("--max-steps", type=int, help="optimizer steps (overrides the time budget)")
    p.add_argument("--minutes", type=float, help="training time budget")
    p.add_argument("--seed", type=int, help="random seed")
    p.add_argument("--device", help="cpu, cuda, mps or auto")
    _speed_options(p)
    _run_options(p)
    p.set_defaults(func=cmd_train)

    p = commands.add_parser("generate", help="complete a prompt with a trained model")
    p.add_argument("--checkpoint", required=True, help="checkpoint or run folder")
    p.add_argument("--prompt", required=True, help="text to continue")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.8, help="0 for greedy decoding")
    p.add_argument("--top-k", type=int, help="sample among the k most likely tokens")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass")
    p.add_argument("--seed", type=int, help="random seed for reproducible samples")
    p.add_argument("--device", default="cpu", help="cpu, cuda or mps")
    p.set_defaults(func=cmd_generate)

    p = commands.add_parser("eval", help="validation loss and bits per byte of a checkpoint")
    p.add_argument("--checkpoint", required=True, help="checkpoint or run folder")
    p.add_argument(
        "--data",
        help="token shard folder (its val shard) or raw data "
        "(its held-out split; default: the built-in corpus)",
    )
    p.add_argument("--max-batches", type=int, default=64, help="evaluation batches of 8 windows")
    p.add_argument("--device", default="cpu", help="cpu, cuda or mps")
    p.set_defaults(func=cmd_eval)
    _data_commands(commands)
    return parser


def _data_commands(commands) -> None:
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


def _config_options(p: argparse.ArgumentParser) -> None:
    from lmforge.config import PRESETS

    p.add_argument(
        "--preset",
        choices=None,
        metavar="NAME",
        help=f"starting config: {', '.join(PRESETS)} (default: small)",
    )
    p.add_argument("--config", metavar="FILE.toml", help="TOML file applied over the preset")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one setting, e.g. train.lr=1e-3 (repeatable)",
    )


def _speed_options(p: argparse.ArgumentParser) -> None:
    """Flags for train.precision, train.activation_checkpointing and train.compile."""
    p.add_argument(
        "--precision",
        choices=["fp32", "bf16", "fp16", "fp8", "auto"],
        help="compute precision; weights and optimizer stay fp32. bf16: autocast; fp16: "
        "autocast + dynamic loss scaling; fp8: E4M3/E5M2 matmuls in the blocks (real on CUDA "
        "≥ 8.9, simulated elsewhere); auto: bf16 where it is fast (default: the preset's). "
        "train.cast_module=true casts the model itself (fp32 master weights) instead of autocast",
    )
    p.add_argument(
        "--activation-checkpointing",
        choices=["none", "full", "selective"],
        help="recompute activations in backward per block: full keeps only block inputs, "
        "selective keeps matmul and attention outputs (default: none)",
    )
    p.add_argument("--compile", action="store_true", help="torch.compile each transformer block")


def _run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", metavar="RUN_DIR", help="run folder (default: runs/NAME)")
    p.add_argument("--fresh", action="store_true", help="delete the run folder and start over")


def _load_config(args: argparse.Namespace):
    from lmforge.config import load_config

    cfg = load_config(args.preset, args.config, args.set)
    train = cfg.train
    if getattr(args, "minutes", None) is not None:
        train = dataclasses.replace(train, minutes=args.minutes, max_steps=0)
    if getattr(args, "max_steps", None) is not None:
        train = dataclasses.replace(train, max_steps=args.max_steps)
    if getattr(args, "seed", None) is not None:
        train = dataclasses.replace(train, seed=args.seed)
    if getattr(args, "device", None) is not None:
        train = dataclasses.replace(train, device=args.device)
    if getattr(args, "precision", None) is not None:
        train = dataclasses.replace(train, precision=args.precision)
    if getattr(args, "activation_checkpointing", None) is not None:
        train = dataclasses.replace(train, activation_checkpointing=args.activation_checkpointing)
    if getattr(args, "compile", False):
        train = dataclasses.replace(train, compile=True)
    return dataclasses.replace(cfg, train=train)


def _with_data(cfg, path: str):
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, path=path))


def cmd_speedrun(args: argparse.Namespace) -> int:
    from lmforge.speedrun import speedrun

    cfg = _load_config(args)
    if args.data:
        cfg = _with_data(cfg, args.data)
    report = speedrun(cfg, args.out or Path("runs") / cfg.name, fresh=args.fresh)
    print(f"done: {report}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from lmforge.speedrun import pretrain

    cfg = _load_config(args)
    shard_dir = None
    if args.data and (Path(args.data) / "meta.json").exists():
        shard_dir = args.data
    elif args.data:
        cfg = _with_data(cfg, args.data)
    result, _ = pretrain(cfg, args.out or Path("runs") / cfg.name, args.fresh, shard_dir)
    print(
        f"done: step {result.step}, val loss {result.final_eval.loss:.4f}, "
        f"{result.final_eval.bpb:.4f} bits/byte; checkpoint {result.checkpoint}"
    )
    return 0


def cmd_tokenizer_train(args: argparse.Namespace) -> int:
    from lmforge.prepare import TokenizerConfig, train_tokenizer

    specials = args.special_token or ["<|endoftext|>"]
    tok = TokenizerConfig(vocab_size=args.vocab_size, pattern=args.pattern, special_tokens=specials)
    tokenizer = train_tokenizer(
        args.input, tok, args.out, workers=args.workers, invalid_utf8=args.invalid_utf8
    )
    print(f"tokenizer: vocab {tokenizer.vocab_size} written to {args.out}")
    return 0


def cmd_tokenizer_stats(args: argparse.Namespace) -> int:
    from lmforge.prepare import read_inputs
    from lmforge.tokenizer.stats import compression, format_table, load_named

    tokenizers = {name: load_named(name) for name in args.tokenizer}
    texts = (doc.text for doc in read_inputs(args.input))
    print(format_table(compression(tokenizers, texts)))
    return 0


def cmd_tokenize(args: argparse.Namespace) -> int:
    from lmforge.prepare import DataConfig, tokenize_inputs

    data = DataConfig(val_fraction=args.val_fraction, workers=args.workers)
    meta = tokenize_inputs(args.tokenizer, args.input, args.out, data)
    counts = ", ".join(f"{name} {s['tokens']:,} tokens" for name, s in meta.shards.items())
    print(f"shards: {counts} in {args.out}")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from lmforge.infer import stream_text
    from lmforge.train.checkpoint import load_checkpoint

    model, tokenizer = load_checkpoint(args.checkpoint, args.device)
    sys.stdout.write(args.prompt)
    for piece in stream_text(
        model,
        tokenizer,
        args.prompt,
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
    ):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from lmforge.eval.run import evaluate_checkpoint

    result = evaluate_checkpoint(
        args.checkpoint, args.data, max_batches=args.max_batches, device=args.device
    )
    print(
        f"val loss {result.loss:.4f} nats/token, {result.bpb:.4f} bits/byte "
        f"({result.tokens:,} tokens, {result.bytes:,} bytes)"
    )
    return 0


def cmd_data_run(args: argparse.Namespace) -> int:
    from lmforge.data.pipeline.run import data_run

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
    from lmforge.data.pipeline.run import train_classifier_files

    train_classifier_files(args.positive, args.negative, args.out)
    return 0
