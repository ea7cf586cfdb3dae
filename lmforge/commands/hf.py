"""The `export` and `import` commands: a checkpoint to a Hugging Face Llama folder and back.

They need both the converter (model/hf.py) and checkpoint loading (train/), so they live above
both.
"""

from __future__ import annotations

import argparse


def add_commands(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "export",
        help="write a checkpoint as a Hugging Face LlamaForCausalLM folder",
        description="Write config.json, generation_config.json, model.safetensors and the "
        "tokenizer files, loadable with transformers' from_pretrained.",
    )
    p.add_argument("--checkpoint", required=True, help="checkpoint or run folder")
    p.add_argument("--format", default="hf", choices=["hf"], help="output format")
    p.add_argument("--out", required=True, help="new folder to write")
    p.set_defaults(func=cmd_export)

    p = commands.add_parser(
        "import",
        help="read a Hugging Face Llama folder into an lmforge checkpoint",
        description="Read config.json, model.safetensors (or its sharded index) and "
        "tokenizer.json (or vocab.json + merges.txt) of a LlamaForCausalLM folder.",
    )
    p.add_argument("--from", dest="source", required=True, metavar="DIR", help="HF model folder")
    p.add_argument("--out", required=True, help="new checkpoint folder to write")
    p.set_defaults(func=cmd_import)


def cmd_export(args: argparse.Namespace) -> int:
    from lmforge.train.checkpoint_dir import check_checkpoint

    check_checkpoint(args.checkpoint)
    from lmforge.model.hf import export_hf
    from lmforge.train.checkpoint import load_checkpoint

    model, tokenizer = load_checkpoint(args.checkpoint)
    print(f"exported {export_hf(model, tokenizer, args.out)} ({args.format})")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from lmforge.model.hf import import_checkpoint

    print(f"imported {args.source} as checkpoint {import_checkpoint(args.source, args.out)}")
    return 0
