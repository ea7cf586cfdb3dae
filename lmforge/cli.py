"""The `lmforge` command: the list of stages, each adding and running its own subcommands.

A stage's `command.py` (or, for commands that span stages, a module of lmforge.commands) adds
its parsers with `add_commands`; every one is torch-free at import, so `--help` never pays for
torch. User errors (LmforgeError) print as one line on stderr with exit code 2; Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import sys

from lmforge import __version__
from lmforge.commands import doctor, hf, plan, posttrain, prepare, pretrain, quant
from lmforge.data import command as data
from lmforge.errors import LmforgeError
from lmforge.eval import command as evaluation
from lmforge.infer import command as infer
from lmforge.parallel import command as parallel

# In the order `lmforge --help` lists them.
STAGES = (pretrain, prepare, infer, evaluation, posttrain, quant, data, hf, parallel, plan, doctor)


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
    for stage in STAGES:
        stage.add_commands(commands)
    return parser
