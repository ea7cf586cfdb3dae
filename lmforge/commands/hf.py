"""The `export` and `import` commands: a checkpoint to a Hugging Face Llama folder and back, or
to one llama.cpp GGUF file.

They need the converters (model/hf.py, quant/gguf.py) and checkpoint loading (train/), so they
live above them all.
"""

from __future__ import annotations

import argparse

from lmforge.errors import LmforgeError

# quant/gguf.py's TYPES, spelled here to keep --help light
GGUF_TYPES = ("f32", "f16", "q8_0", "q4_0")


def add_commands(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "export",
        help="write a checkpoint as a Hugging Face LlamaForCausalLM folder or a GGUF file",
        description="--format hf: write config.json, generation_config.json, model.safetensors "
        "and the tokenizer files, loadable with transformers' from_pretrained. --format gguf: "
        "write one llama.cpp 'llama' file (weights, config and BPE tokenizer).",
    )
    p.add_argument("--checkpoint", required=True, help="checkpoint or run folder")
    p.add_argument(
        "--format",
        default="hf",
        choices=["hf", "gguf"],
        help="output format: hf (a folder, the default) or gguf (one file for llama.cpp)",
    )
    p.add_argument(
        "--type",
        choices=GGUF_TYPES,
        help="GGUF tensor type of the 2-D weights (default f16; norms stay f32); gguf only",
    )
    p.add_argument("--out", required=True, help="new folder (hf) or file (gguf) to write")
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

    if args.format == "gguf":
        check_checkpoint(args.checkpoint)
        return _export_gguf(args)
    if args.type is not None:
        raise LmforgeError("--type sets a GGUF file's tensor type: pass --format gguf or drop it")
    check_checkpoint(args.checkpoint)
    from lmforge.model.hf import export_hf
    from lmforge.train.checkpoint import load_checkpoint

    model, tokenizer = load_checkpoint(args.checkpoint)
    print(f"exported {export_hf(model, tokenizer, args.out)} ({args.format})")
    return 0


def _export_gguf(args: argparse.Namespace) -> int:
    from lmforge.quant.gguf import export_checkpoint_gguf

    result = export_checkpoint_gguf(args.checkpoint, args.out, args.type or "f16")
    print(f"exported {result.path} (gguf, {result.file_type}, {len(result.tensor_types)} tensors)")
    if result.fallbacks:
        print(
            f"{len(result.fallbacks)} tensors written f16, their rows not a multiple of the "
            f"{result.file_type} block: {', '.join(result.fallbacks)}"
        )
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from lmforge.model.hf import import_checkpoint

    print(f"imported {args.source} as checkpoint {import_checkpoint(args.source, args.out)}")
    return 0
