"""The `lmforge plan` command: flags in, a printed (or JSON) plan out.

It sits above config.py (presets, TOML run configs) and device/ (`cpu-local`), which the
planner in plan/ never imports: lmforge.planner_inputs hands their answers to it as plain data.
"""

from __future__ import annotations

import argparse

from lmforge.errors import LmforgeError
from lmforge.plan import hardware
from lmforge.plan.explain import render_json, render_text
from lmforge.plan.options import parse_count, parse_interconnect, parse_layout
from lmforge.plan.params import param_counts
from lmforge.plan.planner import PlanRequest, build
from lmforge.plan.precision import precision_bytes
from lmforge.planner_inputs import default_precision, device, resolve

AC_MODES = ("none", "full", "selective")
CHINCHILLA_TOKENS_PER_PARAM = 20


def add_commands(commands: argparse._SubParsersAction) -> None:
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
    p.add_argument(
        "--parallel", help="e.g. fsdp=8,tp=8 (also dp=, ep=, zero=0..3, sp=1); default FSDP"
    )
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


def cmd_plan(args: argparse.Namespace) -> int:
    flags = vars(args).copy()
    for key in ("func", "command", "json", "hardware"):
        flags.pop(key)
    print(run_plan(as_json=args.json, hardware_name=args.hardware, **flags), end="")
    return 0


def plan_request(
    model: str,
    hardware_name: str = "h100-sxm",
    gpus: int = 1,
    gpus_per_node: int = 8,
    interconnect: str = "nvlink4,ib-ndr",
    parallel: str | None = None,
    precision: str | None = None,
    seq_len: int | None = None,
    global_batch_tokens: str = "4M",
    tokens: str | None = None,
    activation_checkpointing: str = "none",
    mfu: float = 0.4,
    micro_batch: int = 1,
) -> PlanRequest:
    """A PlanRequest from the command's flags (strings where the command takes suffixes).

    Without `precision`: bf16 on the hardware table's accelerators; on `cpu-local`, what
    training's `precision = "auto"` picks on this CPU (bf16 only where it measured faster).
    Without `tokens`: 20 per active parameter (Chinchilla).
    """
    if gpus < 1 or gpus_per_node < 1 or micro_batch < 1:
        raise LmforgeError("--gpus, --gpus-per-node and --micro-batch must be 1 or more")
    if activation_checkpointing not in AC_MODES:
        raise LmforgeError(
            f"--activation-checkpointing {activation_checkpointing!r}: choose none, full or "
            "selective"
        )
    shape = resolve(model)
    intra, inter = parse_interconnect(interconnect)
    seq_len = seq_len or min(4096, shape.max_seq_len)
    if seq_len < 1:
        raise LmforgeError(f"--seq-len {seq_len} must be 1 or more")
    active = param_counts(shape)["active"]
    tokens_rule = ""
    if tokens is not None:
        run_tokens = parse_count(tokens, "--tokens")
    else:
        run_tokens = CHINCHILLA_TOKENS_PER_PARAM * active
        tokens_rule = (
            f"{CHINCHILLA_TOKENS_PER_PARAM} · {active:,} active parameters (Chinchilla); "
            "set with --tokens"
        )
    precision_rule = ""
    if precision is None:
        precision, precision_rule = default_precision(hardware_name)
    return PlanRequest(
        shape=shape,
        device=device(hardware_name),
        gpus=gpus,
        gpus_per_node=min(gpus_per_node, gpus),
        intra=hardware.link(intra),
        inter=hardware.link(inter),
        layout=parse_layout(parallel, gpus),
        precision=precision_bytes(precision),
        seq_len=seq_len,
        global_batch_tokens=parse_count(global_batch_tokens, "--global-batch-tokens"),
        tokens=run_tokens,
        tokens_rule=tokens_rule,
        precision_rule=precision_rule,
        activation_checkpointing=activation_checkpointing,
        mfu=mfu,
        micro_batch=micro_batch,
    )


def run_plan(explain: bool = False, as_json: bool = False, inference: bool = False, **flags) -> str:
    """The plan as text (with formulas when `explain`) or JSON; `inference`: serving only."""
    sections = build(plan_request(**flags), inference_only=inference)
    return render_json(sections) if as_json else render_text(sections, explain)
