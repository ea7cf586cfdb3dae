"""The `bench comm` command: latency and bandwidth of collectives, as nccl-tests reports them."""

from __future__ import annotations

import argparse


def add_commands(commands: argparse._SubParsersAction) -> None:
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


def cmd_bench_comm(args: argparse.Namespace) -> int:
    from lmforge.parallel.comm_bench import bench_comm, parse_ops, parse_sizes

    sizes, ops = parse_sizes(args.sizes), parse_ops(args.ops)
    bench_comm(sizes, ops, args.iters, args.warmup, args.device, args.json)
    return 0
