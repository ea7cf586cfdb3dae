"""The `tokenizer train`, `tokenizer stats` and `tokenize` commands: documents to a tokenizer,
and documents to token shards, through lmforge.prepare."""

from __future__ import annotations

import argparse

from lmforge.run_flags import add_doc_separator_option


def add_commands(commands: argparse._SubParsersAction) -> None:
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
    add_doc_separator_option(p)
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
    add_doc_separator_option(p)
    p.set_defaults(func=cmd_tokenize)


def cmd_tokenizer_train(args: argparse.Namespace) -> int:
    from lmforge.prepare import DOC_SEPARATOR, TokenizerConfig, train_tokenizer

    specials = args.special_token or ["<|endoftext|>"]
    tok = TokenizerConfig(vocab_size=args.vocab_size, pattern=args.pattern, special_tokens=specials)
    separator = DOC_SEPARATOR if args.doc_separator is None else args.doc_separator
    tokenizer = train_tokenizer(
        args.input,
        tok,
        args.out,
        workers=args.workers,
        invalid_utf8=args.invalid_utf8,
        doc_separator=separator,
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
    if args.doc_separator is not None:
        data.doc_separator = args.doc_separator
    meta = tokenize_inputs(args.tokenizer, args.input, args.out, data)
    counts = ", ".join(f"{name} {s['tokens']:,} tokens" for name, s in meta.shards.items())
    print(f"shards: {counts} in {args.out}")
    return 0
