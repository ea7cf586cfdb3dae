"""The `lmforge` command: parse arguments, then call one stage function.

User errors (LmforgeError) print as one line on stderr with exit code 2; Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from lmforge import __version__
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
  ddp_bucket_mb=25          --parallel dp: gradient all-reduce bucket size (MB)
  zero1=true                --parallel dp: shard the optimizer state over the ranks (ZeRO-1)
  reshard_after_forward=false  --parallel fsdp: keep gathered weights until backward (ZeRO-2)
  sequence_parallel=false   --parallel tp: all-reduce instead of sequence-sharded norms
  collective_timeout_s=N    fail when a collective waits N s (a rank died or hung; default 600)
"""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        from lmforge.threads import apply_env_threads

        apply_env_threads()  # LMFORGE_THREADS, for every command
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
    parser.add_argument("--version", action="version", version=f"lmforge {__version__}")
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
    p.add_argument(
        "--parallel",
        metavar="LAYOUT",
        help="under torchrun: data/tensor parallel degrees, e.g. dp=8, fsdp=4, fsdp=2,tp=2 "
        "(the world size left over goes to dp; default: plain DDP over all processes)",
    )
    _speed_options(p)
    _run_options(p)
    p.set_defaults(func=cmd_train)

    p = commands.add_parser(
        "generate",
        help="complete a prompt (or a file of prompts) with a trained model",
        description="One --prompt streams its completion; --prompts-file, --logprobs or "
        "--beams print one JSON line per prompt.",
    )
    p.add_argument("--checkpoint", required=True, help="checkpoint or run folder")
    prompts = p.add_mutually_exclusive_group(required=True)
    prompts.add_argument("--prompt", help="text to continue")
    prompts.add_argument(
        "--prompts-file", metavar="FILE", help="one prompt per line, or JSON lines with 'prompt'"
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=128,
        help="most tokens to generate (default 128; more than the context holds: the rest of "
        "the context after the prompt)",
    )
    # Sampling flags default to None so that --beams can refuse the ones the user passed;
    # generate_options fills in the defaults the help texts give.
    p.add_argument("--temperature", type=float, help="0 for greedy decoding (default 0.8)")
    p.add_argument("--top-k", type=int, help="sample among the k most likely tokens")
    p.add_argument("--top-p", type=float, help="nucleus sampling mass (default 0.95)")
    p.add_argument("--min-p", type=float, help="drop tokens below this fraction of the top one")
    p.add_argument("--repetition-penalty", type=float, help=">1 avoids repeats (default 1)")
    p.add_argument("--frequency-penalty", type=float, help="OpenAI style, -2..2 (default 0)")
    p.add_argument("--presence-penalty", type=float, help="OpenAI style, -2..2 (default 0)")
    p.add_argument(
        "--stop",
        action="append",
        default=[],
        help="stop string (repeatable); backslash escapes are decoded: \\n, \\t, \\r, \\0, "
        "\\uXXXX, and \\\\ for a backslash",
    )
    p.add_argument("--seed", type=int, help="random seed for reproducible samples")
    p.add_argument("--logprobs", action="store_true", help="print each token's log-probability")
    p.add_argument(
        "--beams",
        type=int,
        help="beam search with this many beams (2 or more; deterministic, so the sampling "
        "flags, --seed, --stop and --logprobs are refused with it)",
    )
    p.add_argument(
        "--length-penalty", type=float, help="with --beams: score = sum/len**this (default 1)"
    )
    p.add_argument("--batch-size", type=int, default=8, help="requests decoded together")
    p.add_argument("--compile", action="store_true", help="torch.compile the decode step")
    p.add_argument("--device", default="cpu", help="cpu, cuda or mps")
    p.set_defaults(func=cmd_generate)

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
    _data_commands(commands)
    _hf_commands(commands)
    _bench_commands(commands)
    _serve_commands(commands)
    _plan_command(commands)
    _doctor_command(commands)
    return parser


def _serve_commands(commands) -> None:
    p = commands.add_parser(
        "serve",
        help="serve a checkpoint over an OpenAI-compatible HTTP API, with a chat page at /",
        description="/v1/models, /v1/completions and /v1/chat/completions (streaming with "
        "stream: true), continuously batched; a web chat page at /. Needs the serve extra: "
        "pip install 'lmforge[serve]'.",
    )
    p.add_argument("--checkpoint", required=True, help="checkpoint or run folder")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    p.add_argument("--max-batch-size", type=int, default=8, help="requests decoded together")
    p.add_argument("--model-name", help="the model's name in the API (default: the folder name)")
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the decode step: faster tokens, after a compile the first time a "
        "step runs 1, 2, 4, ... requests (about 10 s each for the speedrun's model on a CPU)",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda or mps")
    p.set_defaults(func=cmd_serve)

    p = commands.add_parser(
        "chat",
        help="chat with a checkpoint in the terminal",
        description="A conversation through the tokenizer's chat template; the oldest turns "
        "are left out when it outgrows the context. /reset starts over, /exit quits.",
    )
    p.add_argument("--checkpoint", required=True, help="checkpoint or run folder")
    p.add_argument("--max-tokens", type=int, default=128, help="longest reply, in tokens")
    p.add_argument("--temperature", type=float, default=0.8, help="0 for greedy decoding")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass")
    p.add_argument("--seed", type=int, help="random seed for reproducible replies")
    p.add_argument("--system", help="a system message that starts the conversation")
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the decode step: faster replies, after a compile before the first "
        "(about 10 s for the speedrun's model on a CPU)",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda or mps")
    p.set_defaults(func=cmd_chat)


def _hf_commands(commands) -> None:
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


def _plan_command(commands) -> None:
    p = commands.add_parser(
        "plan",
        help="predict memory, FLOPs, communication, step time and inference speed of a run",
        description="Size a run on paper: parameters, FLOPs, memory per device, communication "
        "per step, step time and MFU, and inference speed, for a model on a hardware and "
        "parallel layout. --explain shows the formula behind every line.",
    )
    p.add_argument("--model", required=True, help="preset name or TOML run config")
    p.add_argument(
        "--hardware", default="h100-sxm", help="device of the hardware table or cpu-local"
    )
    p.add_argument("--gpus", type=int, default=1, help="devices in all")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--interconnect", default="nvlink4,ib-ndr", help="INTRA,INTER link names")
    p.add_argument("--parallel", help="e.g. fsdp=8,tp=8 (also dp=, zero=0..3, sp=1); default FSDP")
    p.add_argument(
        "--precision",
        help="fp32, bf16, fp16 or fp8 (default: bf16; on cpu-local, what precision=auto picks)",
    )
    p.add_argument("--seq-len", type=int, help="training sequence and inference context length")
    p.add_argument("--global-batch-tokens", default="4M", help="tokens per step (K/M/B suffixes)")
    p.add_argument("--tokens", help="tokens of the run (default: 20 per active parameter)")
    p.add_argument("--activation-checkpointing", default="none", help="none, full or selective")
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per device per pass")
    p.add_argument("--mfu", type=float, default=0.4, help="assumed MFU of the compute (0.4)")
    p.add_argument("--explain", action="store_true", help="show the formula behind each line")
    p.add_argument("--inference", action="store_true", help="serving only: no training sections")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=cmd_plan)


def _doctor_command(commands) -> None:
    p = commands.add_parser(
        "doctor",
        help="what this machine can do: CPU features, working kernels, their speed, and the "
        "paths lmforge chooses here",
        description="Detect the CPU's ISA and features, try each kernel lmforge relies on "
        "(oneDNN weight packing, int8 weight-only matmul), measure matmul GFLOP/s per dtype "
        "(once, cached), and print the precision and decode layouts chosen from them, the "
        "torch.compile compiler and the GPU. LMFORGE_CPU_PROFILE caps the capabilities used.",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_doctor)


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


def _bench_commands(commands) -> None:
    bench = commands.add_parser("bench", help="benchmarks of the machine lmforge runs on")
    bench_commands = bench.add_subparsers(dest="bench_command", required=True, metavar="COMMAND")
    p = bench_commands.add_parser(
        "comm",
        help="latency and bandwidth of collectives (run under torchrun)",
        description="Latency, algorithm and bus bandwidth of each collective per message size, "
        "as nccl-tests reports them. Launch with `torchrun --nproc-per-node N -m lmforge bench "
        "comm`; without torchrun it runs on one process.",
    )
    p.add_argument(
        "--sizes", default="1K..64M", help="message sizes: powers of two from..to (default 1K..64M)"
    )
    p.add_argument(
        "--ops",
        default="all",
        help="all, or a comma list of all_reduce,all_gather,reduce_scatter,broadcast,all_to_all",
    )
    p.add_argument(
        "--iters", type=int, default=20, help="timed iterations per op and size (default 20)"
    )
    p.add_argument("--warmup", type=int, default=5, help="untimed iterations first (default 5)")
    p.add_argument(
        "--device",
        default="auto",
        choices=["auto", "cpu", "cuda"],
        help="cpu (gloo) or cuda (nccl); auto: cuda when available",
    )
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.set_defaults(func=cmd_bench_comm)


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
    p.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="CPU threads torch computes with (default: LMFORGE_THREADS, else the fastest of "
        "all cores, half of them, ... timed on the first training steps)",
    )


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
    if getattr(args, "parallel", None) is not None:
        train = dataclasses.replace(train, parallel=args.parallel)
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
    cfg = _load_config(args)

    from lmforge.speedrun import speedrun

    if args.data:
        cfg = _with_data(cfg, args.data)
    from lmforge.train.signals import RunStopped

    try:
        report = speedrun(
            cfg, args.out or Path("runs") / cfg.name, fresh=args.fresh, threads=args.threads
        )
    except RunStopped as e:  # training checkpointed on Ctrl-C or SIGTERM: exit 130 or 143
        print(e.message, file=sys.stderr)
        return e.exit_status
    print(f"done: {report}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    cfg = _load_config(args)  # a bad config is reported before torch is imported

    from lmforge.speedrun import pretrain

    shard_dir = None
    if args.data and (Path(args.data) / "meta.json").exists():
        shard_dir = args.data
    elif args.data:
        cfg = _with_data(cfg, args.data)
    out = args.out or Path("runs") / cfg.name
    result, _ = pretrain(cfg, out, args.fresh, shard_dir, threads=args.threads)
    rank_zero = int(os.environ.get("RANK", "0")) == 0
    if result.interrupted:  # checkpointed on Ctrl-C or SIGTERM: exit 130 or 143, so `&&` stops
        from lmforge.train.signals import exit_status, stopped_message

        if rank_zero:
            message = stopped_message(result.stop_signal, result.step, result.checkpoint)
            print(message, file=sys.stderr)
        return exit_status(result.stop_signal)
    if rank_zero:  # under torchrun, one summary line, not one per rank
        print(
            f"done: step {result.step}, periodic validation ({result.final_eval.tokens:,} "
            f"tokens): loss {result.final_eval.loss:.4f}, {result.final_eval.bpb:.4f} "
            f"bits/byte; checkpoint {result.checkpoint}"
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


def _check_checkpoint(path: str) -> None:
    """Refuse a wrong checkpoint path (missing, a Hugging Face folder, no lmforge config) in one
    line before torch is imported."""
    from lmforge.train.checkpoint_dir import read_model_config, resolve_checkpoint

    read_model_config(resolve_checkpoint(path))


def cmd_generate(args: argparse.Namespace) -> int:
    from lmforge.infer import run

    params, beams, length_penalty = run.generate_options(vars(args))
    prompts = [args.prompt] if args.prompts_file is None else run.read_prompts(args.prompts_file)
    run.run_generate(
        args.checkpoint,
        prompts,
        params,
        stream=args.prompts_file is None and not args.logprobs and not beams,
        beams=beams,
        length_penalty=length_penalty,
        batch_size=args.batch_size,
        compile=args.compile,
        device=args.device,
    )
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from lmforge.plan_command import run_plan

    flags = vars(args).copy()
    for key in ("func", "command", "json", "hardware"):
        flags.pop(key)
    print(run_plan(as_json=args.json, hardware_name=args.hardware, **flags), end="")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from lmforge.doctor import run_doctor

    print(run_doctor(as_json=args.json))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    _check_checkpoint(args.checkpoint)
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


def cmd_serve(args: argparse.Namespace) -> int:
    from lmforge.extras import require

    require("lmforge serve", "serve", "fastapi", "uvicorn")
    from lmforge.infer.server import serve  # checks the port, then the checkpoint

    serve(
        args.checkpoint,
        args.host,
        args.port,
        args.max_batch_size,
        args.model_name,
        args.device,
        compile=args.compile,
    )
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    _check_checkpoint(args.checkpoint)
    from lmforge.infer.chat import run_chat
    from lmforge.infer.engine import SamplingParams

    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed
    )
    run_chat(args.checkpoint, params, args.system, args.device, compile=args.compile)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    _check_checkpoint(args.checkpoint)
    from lmforge.model.hf import export_hf
    from lmforge.train.checkpoint import load_checkpoint

    model, tokenizer = load_checkpoint(args.checkpoint)
    print(f"exported {export_hf(model, tokenizer, args.out)} ({args.format})")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from lmforge.model.hf import import_checkpoint

    print(f"imported {args.source} as checkpoint {import_checkpoint(args.source, args.out)}")
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


def cmd_bench_comm(args: argparse.Namespace) -> int:
    from lmforge.parallel.comm_bench import bench_comm, parse_ops, parse_sizes

    sizes, ops = parse_sizes(args.sizes), parse_ops(args.ops)
    bench_comm(sizes, ops, args.iters, args.warmup, args.device, args.json)
    return 0
