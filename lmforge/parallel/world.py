"""The process group and device mesh of a run, set up from torchrun's environment.

torchrun (or any launcher) sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; a
run without them is a single process: it gets no process group, and a World of one rank whose
collectives return their input, so code that trains on a World never asks how many there are.
A program that starts its own group (e.g. under torch.multiprocessing.spawn) gets its World
from `World.from_group`. Collectives time out after `timeout_s`, and a failed collective (a rank
died, or hung past the timeout) becomes one clear LmforgeError on every surviving rank instead
of a hang or a page of backend traces.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from lmforge.errors import LmforgeError
from lmforge.parallel.layout import DIMS, Layout, resolve_layout


@dataclass
class World:
    """Where this process stands in a run: the layout, the device mesh over every rank (dims
    dp, fsdp, tp), this rank and the device it computes on; with expert parallelism also the
    experts' mesh over the same ranks (dims edp, ep: groups of ep consecutive data ranks split
    the experts, and the edp ranks of one ep position hold the same ones)."""

    layout: Layout
    mesh: DeviceMesh | None  # None: a single process
    rank: int
    device: torch.device
    expert_mesh: DeviceMesh | None = None

    @classmethod
    def single(cls, device: torch.device) -> World:
        """The World of a process that trains alone: rank 0 of one, no process group."""
        return cls(resolve_layout("", 1), None, 0, device)

    @property
    def is_distributed(self) -> bool:
        """Whether this run spans several processes (a process group and a device mesh)."""
        return self.mesh is not None

    @classmethod
    def from_group(cls, parallel: str | Layout = "", device: torch.device | None = None) -> World:
        """The World of the process group this process already joined (its own
        `dist.init_process_group`, or torchrun's), its ranks laid out as `parallel` ("fsdp=2",
        "dp=2,tp=2"; what the named degrees leave goes to dp). `device` defaults to the
        current CUDA device on NCCL, else the CPU. A collective: every rank must call it."""
        if not dist.is_initialized():
            raise LmforgeError(
                "World.from_group needs a process group: call dist.init_process_group first"
            )
        if not isinstance(parallel, Layout):
            parallel = resolve_layout(parallel, dist.get_world_size())
        elif parallel.world_size != dist.get_world_size():
            raise LmforgeError(
                f"layout {parallel} needs {parallel.world_size} processes but the group has "
                f"{dist.get_world_size()}"
            )
        if device is None:
            device = _default_device()
        mesh = init_device_mesh(device.type, parallel.sizes(), mesh_dim_names=DIMS)
        return cls(parallel, mesh, dist.get_rank(), device, _expert_mesh(parallel, device))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def data_mesh(self) -> DeviceMesh:
        """The ranks that see different rows: dp × fsdp (HSDP's 2-D mesh) when dp > 1, else
        fsdp; what `apply_fsdp` shards over."""
        return self.mesh["dp", "fsdp"] if self.layout.dp > 1 else self.mesh["fsdp"]

    @property
    def data_rank(self) -> int:
        """This rank's slice of the global batch: ranks of one TP group share it."""
        if self.mesh is None:
            return 0
        return (
            self.mesh["dp"].get_local_rank() * self.layout.fsdp + self.mesh["fsdp"].get_local_rank()
        )

    def mean_over_data(self, value: torch.Tensor) -> torch.Tensor:
        """`value` averaged over the data-parallel ranks (`mean_over_data`); itself alone."""
        return mean_over_data(value) if self.is_distributed else value

    def from_main(self, value: int) -> int:
        """Rank 0's `value` on every rank (`from_rank_zero`)."""
        return from_rank_zero(value) if self.is_distributed else value

    def any_rank(self, flag: bool) -> bool:
        """Whether `flag` is set on any rank (`any_rank`)."""
        return any_rank(flag, self.device) if self.is_distributed else flag


def _expert_mesh(layout: Layout, device: torch.device) -> DeviceMesh | None:
    if layout.ep == 1:
        return None
    if layout.tp > 1:
        raise LmforgeError(
            f"--parallel {layout}: expert parallelism does not combine with tp; use dp/fsdp"
        )
    ranks = torch.arange(layout.world_size).view(layout.expert_data_parallel, layout.ep)
    return DeviceMesh(device.type, ranks, mesh_dim_names=("edp", "ep"))


def _default_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def mean_over_data(value: torch.Tensor) -> torch.Tensor:
    """`value` (e.g. the loss of this rank's rows) averaged over the data-parallel ranks.

    The ranks of one tensor-parallel group hold the same value, so the mean over all ranks is
    the mean over the data-parallel ones.
    """
    value = value.detach().clone()
    dist.all_reduce(value, dist.ReduceOp.AVG)
    return value


def from_rank_zero(value: int) -> int:
    """Rank 0's `value` on every rank (e.g. a step count derived from rank 0's timing)."""
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return int(box[0])


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank if `flag` is true on any (e.g. a stop signal that reached only one)."""
    box = torch.tensor([int(flag)], device=device)
    dist.all_reduce(box, dist.ReduceOp.MAX)
    return bool(box.item())


def world_size_from_env() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


@contextlib.contextmanager
def distributed(parallel: str, device: torch.device, timeout_s: float) -> Iterator[World]:
    """Join the process group for the `parallel` layout (`World.single` for a single process).

    Yields the World; on exit leaves the group. A collective that fails inside the block is
    re-raised as LmforgeError naming the rank and the likely cause.
    """
    world_size = world_size_from_env()
    layout = resolve_layout(parallel, world_size)
    if world_size == 1:
        yield World.single(device)
        return
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if rank != 0:
        os.environ["LMFORGE_PROGRESS"] = "0"  # one progress bar per run, rank 0's
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    owns_group = not dist.is_initialized()
    if owns_group:
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    try:
        yield World.from_group(layout, device)
    except (dist.DistError, RuntimeError) as e:
        if isinstance(e, LmforgeError) or not _is_collective_failure(e):
            raise
        raise LmforgeError(
            f"rank {rank}: a collective failed ({type(e).__name__}: {_first_line(e)}): "
            f"another rank probably died or stalled past train.parallel.collective_timeout_s="
            f"{timeout_s:g}; check the other ranks' output, fix it, and resume"
        ) from e
    finally:
        if owns_group:
            with contextlib.suppress(Exception):
                dist.barrier()  # no rank tears the group down while another still uses it
                dist.destroy_process_group()


def _is_collective_failure(e: BaseException) -> bool:
    if isinstance(e, dist.DistError):
        return True
    text = str(e).lower()
    return any(w in text for w in ("gloo", "nccl", "connection", "timed out", "timeout", "peer"))


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:200]
