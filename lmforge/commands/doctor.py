"""The `doctor` command: what this machine can do, and the paths lmforge chooses here."""

from __future__ import annotations

import argparse


def add_commands(commands: argparse._SubParsersAction) -> None:
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


def cmd_doctor(args: argparse.Namespace) -> int:
    from lmforge.doctor import run_doctor

    print(run_doctor(as_json=args.json))
    return 0
