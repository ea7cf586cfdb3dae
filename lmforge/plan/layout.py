"""The parallel layout: dp, fsdp and tp degrees, the expert-parallel degree ep, plus (for the
planner) the ZeRO stage of the dp dimension and sequence parallelism, which training sets
through its own options.

The one definition, torch-free: parallel/ builds its device mesh from it (parallel/layout.py
parses `--parallel` into it) and the planner prices it.

Three mesh dimensions, outermost first:
  dp    replicated data parallel: DDP when it is the only one, else FSDP2's replicate dimension
  fsdp  sharded data parallel (FSDP2 / ZeRO-3): parameters, gradients and optimizer state sharded
  tp    tensor parallel (Megatron style), the innermost so its collectives stay within a node

Expert parallelism is not a fourth factor of the world size: like torchtitan's, it borrows from
the data-parallel ranks. Each group of `ep` consecutive data ranks splits a mixture of experts'
experts between them (an all-to-all sends each token to its expert's rank); everything else is
laid out by dp/fsdp as without it, and the experts are replicated over the data_parallel/ep
groups ("edp").

Mesh dimensions are laid out innermost first, tp → fsdp → dp, as torchtitan does: tensor
parallelism, the most talkative, stays inside a node when it fits. A dimension crosses nodes
when the ranks it spans (its size times the sizes inside it) exceed the GPUs of one node.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from lmforge.errors import LmforgeError

DIMS = ("dp", "fsdp", "tp")


@dataclass(frozen=True)
class Layout:
    dp: int = 1  # replicas (DDP, or the replicate dimension of HSDP)
    fsdp: int = 1  # shards of parameters, gradients and optimizer state (ZeRO-3)
    tp: int = 1  # tensor-parallel degree
    ep: int = 1  # expert-parallel degree: ranks (out of dp·fsdp) that split the experts
    zero: int = 0  # ZeRO stage of the dp dimension: 0 DDP, 1 optimizer, 2 + gradients, 3 all
    sp: bool = False  # sequence parallel across the tp dimension

    def __post_init__(self) -> None:
        for name in ("dp", "fsdp", "tp", "ep"):
            if getattr(self, name) < 1:
                raise LmforgeError(f"--parallel {name}={getattr(self, name)}: use 1 or more")
        if self.data_parallel % self.ep:
            raise LmforgeError(
                f"--parallel ep={self.ep} does not divide the {self.data_parallel} data-parallel "
                "ranks (dp·fsdp): expert parallelism splits those, so pick ep dividing dp·fsdp"
            )
        if self.zero not in (0, 1, 2, 3):
            raise LmforgeError(f"--parallel zero={self.zero}: choose a ZeRO stage 0, 1, 2 or 3")

    @property
    def world_size(self) -> int:
        return self.dp * self.fsdp * self.tp

    @property
    def data_parallel(self) -> int:
        """Ranks that see different rows of the global batch."""
        return self.dp * self.fsdp

    @property
    def expert_data_parallel(self) -> int:
        """Replicas of each expert: the data ranks that hold the same experts."""
        return self.data_parallel // self.ep

    def sizes(self) -> tuple[int, ...]:
        return tuple(getattr(self, d) for d in DIMS)

    def __str__(self) -> str:
        named = [f"{d}={getattr(self, d)}" for d in (*DIMS, "ep") if getattr(self, d) > 1]
        return ",".join(named) or "single process"

    def normalized(self) -> Layout:
        """ZeRO-3 on the dp dimension is FSDP: fold it in."""
        if self.zero == 3 and self.dp > 1:
            return dataclasses.replace(self, fsdp=self.fsdp * self.dp, dp=1, zero=0)
        return self

    def shards(self) -> tuple[int, int, int]:
        """How many ways parameters, gradients and optimizer state are split (TP aside)."""
        lay = self.normalized()
        return (
            lay.fsdp,
            lay.fsdp * (lay.dp if lay.zero >= 2 else 1),
            lay.fsdp * (lay.dp if lay.zero >= 1 else 1),
        )

    def dims(self) -> list[tuple[str, int, int]]:
        """(name, size, ranks spanned) of every dimension above size 1, innermost first."""
        out, span = [], 1
        lay = self.normalized()
        for name in ("tp", "fsdp", "dp"):
            size = getattr(lay, name)
            span *= size
            if size > 1:
                out.append((name, size, span))
        if lay.ep > 1:  # within the data ranks, tp innermost: ep consecutive ones, then the rest
            out.append(("ep", lay.ep, lay.ep * lay.tp))
            if lay.expert_data_parallel > 1:
                out.append(("edp", lay.expert_data_parallel, lay.world_size))
        return out

    def describe(self) -> str:
        lay = self.normalized()
        parts = [f"{n}={getattr(lay, n)}" for n in ("dp", "fsdp", "tp") if getattr(lay, n) > 1]
        if lay.dp > 1 and lay.zero:
            parts.append(f"zero={lay.zero}")
        if lay.ep > 1:
            parts.append(f"ep={lay.ep}")
        if lay.sp:
            parts.append("sp")
        return ",".join(parts) or "single device"
