"""A user's own program using lmforge.parallel as a library, as test_library.py runs it.

Usage: python library_user.py OUT
Starts 2 gloo processes with torch.multiprocessing.spawn; each calls dist.init_process_group
itself, builds a World from that group and trains a toy two-layer module (not lmforge's
Transformer) for a few steps, each rank on its half of the batch:
  fsdp   FSDP2 with fc1 as its own unit, torch.optim.Adam (not fused) over the shards
  zero1  DDP with ZeRO-1 of torch.optim.SGD (momentum), then one step that step_unless skips
         and one it takes
Rank 0 saves `full_state_dict(model)` of each to OUT/parallel.pt; the parent then trains the
same module in one process on the whole batch and saves OUT/reference.pt.
"""

import os
import socket
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD = 2
STEPS = 3
ROWS = 8


class TwoLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(6, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(ROWS, 6, generator=g), torch.randn(ROWS, 3, generator=g)


def train(model: nn.Module, optimizer: torch.optim.Optimizer, rows: slice) -> None:
    x, y = batch()
    for _ in range(STEPS):
        loss = nn.functional.mse_loss(model(x[rows]), y[rows])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


SGD = dict(lr=0.1, momentum=0.9)


def adam(params) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=0.05)


def sgd(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, **SGD)


def rank_main(rank: int, port: int, out: str) -> None:
    from lmforge.parallel import World, apply_ddp, apply_fsdp, build_zero1, full_state_dict
    from lmforge.train.adamw import step_unless

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    rows = slice(rank * ROWS // WORLD, (rank + 1) * ROWS // WORLD)
    results = {}

    world = World.from_group("fsdp=2")
    model = TwoLayer()
    apply_fsdp(model, world.data_mesh, units=[model.fc1])
    train(model, adam(model.parameters()), rows)
    results["fsdp"] = full_state_dict(model)
    results["fsdp_sharded"] = type(model.fc1.weight).__name__

    world = World.from_group("dp=2")
    model = apply_ddp(TwoLayer(), world.mesh["dp"])
    optimizer = build_zero1(model.parameters(), world.mesh["dp"], torch.optim.SGD, **SGD)
    train(model, optimizer, rows)
    results["zero1"] = full_state_dict(model)
    results["zero1_local_params"] = sum(
        p.numel() for group in optimizer.optim.param_groups for p in group["params"]
    )
    model(batch()[0][rows]).sum().backward()
    step_unless(optimizer, torch.tensor(True))  # SGD cannot skip on the device: the host skips
    results["zero1_after_skip"] = full_state_dict(model)
    step_unless(optimizer, torch.tensor(False))
    results["zero1_after_step"] = full_state_dict(model)

    if rank == 0:
        torch.save(results, Path(out) / "parallel.pt")
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # gloo sometimes aborts at interpreter teardown after a clean run


def main(out: str) -> None:
    with socket.socket() as s:  # a free port for the group's rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(port, out), nprocs=WORLD, join=True)
    reference = {}
    for name, make in (("fsdp", adam), ("zero1", sgd)):
        model = TwoLayer()
        train(model, make(model.parameters()), slice(None))
        reference[name] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    reference["init"] = TwoLayer().state_dict()
    torch.save(reference, Path(out) / "reference.pt")


if __name__ == "__main__":
    main(sys.argv[1])
