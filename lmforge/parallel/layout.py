"""The `--parallel` flag: parsing "dp=2,tp=2" (or "fsdp=2,ep=2") into a Layout (plan/layout.py,
the one torch-free definition), and checking it against world size and model.

Pure functions, no process group: a layout is checked before any process starts collectives,
so a bad `--parallel` fails fast with one clear line on every rank.
Whatever the named degrees leave of the world size goes to dp; ep splits the data-parallel
ranks (dp·fsdp) and so is not a factor of the world size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lmforge.errors import LmforgeError
from lmforge.plan.layout import DIMS, Layout

NAMES = (*DIMS, "ep")  # what --parallel may name: the mesh dimensions and expert parallelism

__all__ = [
    "DIMS",
    "Layout",
    "ParallelOptions",
    "check_batch",
    "check_model",
    "parse_layout",
    "resolve_layout",
]


@dataclass
class ParallelOptions:
    """The train.* knobs that shape parallel training (documented on TrainConfig)."""

    bucket_mb: float = 25.0
    zero1: bool = False
    reshard_after_forward: bool = True
    sequence_parallel: bool = True


def parse_layout(text: str) -> dict[str, int]:
    """The degrees named in `text` ("dp=2,tp=2"; "" names none), checked for form only."""
    degrees: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or name not in NAMES or not value.strip().isdigit():
            raise LmforgeError(
                f"--parallel item {item!r} is not of the form DIM=N with DIM one of "
                f"{', '.join(NAMES)} (e.g. --parallel fsdp=2,tp=2)"
            )
        if name in degrees:
            raise LmforgeError(f"--parallel names {name} twice: give each dimension once")
        if int(value) < 1:
            raise LmforgeError(f"--parallel {name}={value}: a degree must be at least 1")
        degrees[name] = int(value)
    return degrees


def resolve_layout(text: str, world_size: int) -> Layout:
    """The layout for `world_size` processes: the named degrees, the rest going to dp."""
    degrees = parse_layout(text)
    ep = degrees.pop("ep", 1)
    named = math.prod(degrees.values())
    if world_size == 1 and max(named, ep) > 1:
        raise LmforgeError(
            f"--parallel {text} needs {max(named, ep)} processes but the world size is 1: launch "
            f"with torchrun --nproc-per-node {max(named, ep)} -m lmforge train ..."
        )
    for name, degree in degrees.items():
        if world_size % degree:
            raise LmforgeError(
                f"{name}={degree} does not divide world size {world_size}: pick degrees whose "
                "product divides the number of processes (torchrun --nproc-per-node)"
            )
    if world_size % named or ("dp" in degrees and named != world_size):
        raise LmforgeError(
            f"--parallel {text} needs {named} processes but the world size is {world_size}: "
            "change --parallel or the number of processes"
        )
    rest = world_size // named
    return Layout(**{**degrees, "dp": degrees.get("dp", 1) * rest, "ep": ep})


def check_model(
    layout: Layout, n_heads: int, n_kv_heads: int, ffn_dim: int, n_experts: int
) -> None:
    """Refuse tensor or expert parallelism the model's shape cannot split evenly."""
    if layout.ep > 1 and (not n_experts or n_experts % layout.ep):
        raise LmforgeError(
            f"ep={layout.ep} splits a mixture of experts' experts, but the model has "
            f"{n_experts or 'no'} experts: set model.n_experts to a multiple of ep, or drop ep"
        )
    if layout.tp == 1:
        return
    for what, count in (("heads", n_heads), ("kv heads", n_kv_heads), ("MLP width", ffn_dim)):
        if count % layout.tp:
            raise LmforgeError(
                f"tp={layout.tp} does not divide {count} {what}: pick tp dividing "
                "model.n_heads, the kv heads and the MLP width"
            )
    if n_experts:
        raise LmforgeError(
            f"tp={layout.tp} with a mixture of experts (model.n_experts={n_experts}) is not "
            "supported: use dp/fsdp for MoE models"
        )


def check_batch(layout: Layout, batch_size: int, seq_len: int, sequence_parallel: bool) -> None:
    """The global batch must split evenly over data-parallel ranks (and tokens over SP ranks)."""
    if batch_size % layout.data_parallel:
        raise LmforgeError(
            f"train.batch_size {batch_size} (the global batch) does not split over "
            f"{layout.data_parallel} data-parallel ranks: make it a multiple of dp*fsdp"
        )
    if sequence_parallel and layout.tp > 1 and seq_len % layout.tp:
        raise LmforgeError(
            f"train.seq_len {seq_len} does not split over tp={layout.tp} sequence-parallel "
            "ranks: make it a multiple of tp, or set train.parallel.sequence_parallel=false"
        )
