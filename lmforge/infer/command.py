"""The `generate`, `serve` and `chat` commands: a checkpoint's completions, its HTTP API, and
a conversation with it in the terminal."""

from __future__ import annotations

import argparse


def add_commands(commands: argparse._SubParsersAction) -> None:
    _add_generate(commands)
    _add_serve(commands)
    _add_chat(commands)


def _add_generate(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "generate",
        help="complete a prompt (or a file of prompts) with a trained model",
        description="One --prompt streams its completion; --prompts-file, --logprobs or "
        "--beams print one JSON line per prompt.",
    )
    p.add_argument("--checkpoint", required=True, help="checkpoint or run folder")
    p.add_argument("--adapter", help="a LoRA adapter folder (PEFT format) merged in on load")
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
    _add_speculative(p)
    p.add_argument("--device", default="cpu", help="cpu, cuda or mps")
    p.set_defaults(func=cmd_generate)


def _add_speculative(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--speculative",
        metavar="ngram|CHECKPOINT",
        help="draft tokens and check them in one forward, output unchanged: 'ngram' (prompt "
        "lookup, best where the output repeats its context) or a smaller checkpoint with the "
        "same tokenizer as the draft model",
    )


def _add_serve(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "serve",
        help="serve a checkpoint over an OpenAI-compatible HTTP API, with a chat page at /",
        description="/v1/models, /v1/completions and /v1/chat/completions (streaming with "
        "stream: true), continuously batched; a web chat page at /. Needs the serve extra: "
        "pip install 'lmforge[serve]'.",
    )
    p.add_argument("--checkpoint", required=True, help="checkpoint or run folder")
    p.add_argument("--adapter", help="a LoRA adapter folder (PEFT format) merged in on load")
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
    _add_speculative(p)
    p.add_argument("--device", default="cpu", help="cpu, cuda or mps")
    guard = p.add_argument_group("access and limits")
    guard.add_argument(
        "--api-key",
        help="require 'Authorization: Bearer KEY' on every /v1 route (default: the "
        "LMFORGE_API_KEY environment variable, else none); the chat page asks for it",
    )
    guard.add_argument(
        "--max-body-bytes",
        type=int,
        default=4 * 2**20,
        help="largest request body; a larger one gets 413 (default 4 MiB)",
    )
    guard.add_argument(
        "--max-prompt-tokens",
        type=int,
        help="longest prompt in tokens; a longer one gets 400 (default: the context window)",
    )
    guard.add_argument(
        "--max-tokens",
        type=int,
        help="highest max_tokens a request may ask for; more gets 400 (default: the context "
        "window); also the reply limit of a chat request that names none",
    )
    guard.add_argument(
        "--max-queue",
        type=int,
        default=256,
        help="requests that may wait for a batch slot; one more gets 429 with Retry-After "
        "(default 256)",
    )
    guard.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="on Ctrl-C, seconds the requests in flight get to finish before they are "
        "cancelled (default 30)",
    )
    p.set_defaults(func=cmd_serve)


def _add_chat(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "chat",
        help="chat with a checkpoint in the terminal",
        description="A conversation through the tokenizer's chat template; the oldest turns "
        "are left out when it outgrows the context. /reset starts over, /exit quits.",
    )
    p.add_argument("--checkpoint", required=True, help="checkpoint or run folder")
    p.add_argument("--adapter", help="a LoRA adapter folder (PEFT format) merged in on load")
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


def cmd_generate(args: argparse.Namespace) -> int:
    from lmforge.infer import generate_command as command

    params, beams, length_penalty = command.generate_options(vars(args))
    prompts = (
        [args.prompt] if args.prompts_file is None else command.read_prompts(args.prompts_file)
    )
    command.run_generate(
        args.checkpoint,
        prompts,
        params,
        stream=args.prompts_file is None and not args.logprobs and not beams,
        beams=beams,
        length_penalty=length_penalty,
        batch_size=args.batch_size,
        compile=args.compile,
        device=args.device,
        adapter=args.adapter,
        speculative=args.speculative,
    )
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from lmforge.extras import require

    require("lmforge serve", "serve", "fastapi", "uvicorn")
    from lmforge.infer.server import serve  # checks the port, then the checkpoint
    from lmforge.infer.server_limits import ServerLimits

    limits = ServerLimits.from_env(
        args.api_key,
        max_body_bytes=args.max_body_bytes,
        max_prompt_tokens=args.max_prompt_tokens,
        max_tokens=args.max_tokens,
        max_queue=args.max_queue,
    )
    serve(
        args.checkpoint,
        args.host,
        args.port,
        args.max_batch_size,
        args.model_name,
        args.device,
        compile=args.compile,
        adapter=args.adapter,
        limits=limits,
        shutdown_timeout=args.shutdown_timeout,
        speculative=args.speculative,
    )
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from lmforge.train.checkpoint_dir import check_checkpoint

    check_checkpoint(args.checkpoint)
    from lmforge.infer.chat import run_chat
    from lmforge.infer.engine import SamplingParams

    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed
    )
    options = {"compile": args.compile, "adapter": args.adapter}
    run_chat(args.checkpoint, params, args.system, args.device, **options)
    return 0
