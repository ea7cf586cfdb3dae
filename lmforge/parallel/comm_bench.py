"""The collectives benchmark: latency, algorithm and bus bandwidth per op and message size.

    torchrun --nproc-per-node N -m lmforge bench comm --sizes 1K..64M --json comm.json

Without a launcher it runs on one process, where nothing crosses a link. Conventions follow
nccl-tests: an op's size is its logical payload (comm_count's byte convention: the full buffer
of all-reduce, broadcast and all-to-all, the gathered output of all-gather, the unscattered
input of reduce-scatter), algbw = size / time, and busbw = algbw × the ring algorithm's factor,
which makes every op comparable with the link's peak bandwidth:
  all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n, broadcast 1, all_to_all (n-1)/n.
A time is the median over iterations of the slowest rank's time, each iteration started
together after a barrier and, on CUDA, ended by a device synchronisation.
"""

from __future__ import annotations

import contextlib
import os
import re
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

from lmforge.atomic import write_json
from lmforge.errors import LmforgeError

BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "all_to_all": lambda n: (n - 1) / n,
}
OPS = tuple(BUS_FACTORS)
DTYPE = torch.float32

# Each op as a call on `full`, a buffer of its whole payload; shards are 1/n of it.
_CALLS: dict[str, Callable[[torch.Tensor, int], Callable[[], object]]] = {
    "all_reduce": lambda full, n: partial(dist.all_reduce, full),
    "all_gather": lambda full, n: partial(dist.all_gather_single, full, _shard(full, n)),
    "reduce_scatter": lambda full, n: partial(dist.reduce_scatter_single, _shard(full, n), full),
    "broadcast": lambda full, n: partial(dist.broadcast, full, 0),
    "all_to_all": lambda full, n: partial(dist.all_to_all_single, torch.empty_like(full), full),
}

_UNITS = {"": 0, "K": 10, "M": 20, "G": 30}


@dataclass
class Setup:
    world_size: int
    backend: str
    device: str
    iters: int
    warmup: int


@dataclass
class Measurement:
    op: str
    bytes: int
    latency_us: float
    algbw_gbps: float  # GB/s, 1e9 bytes
    busbw_gbps: float


def parse_sizes(spec: str) -> list[int]:
    """Byte sizes from "1K..256M" (every power of two in between) or a single "4M"."""
    low, sep, high = spec.partition("..")
    first = _parse_size(low)
    last = _parse_size(high) if sep else first
    if last < first:
        raise LmforgeError(f"--sizes {spec!r} runs backwards: write the smaller size first")
    return [2**k for k in range(first.bit_length() - 1, last.bit_length())]


def parse_ops(spec: str) -> list[str]:
    """Op names from "all" or a comma-separated list."""
    names = list(OPS) if spec == "all" else [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [name for name in names if name not in BUS_FACTORS]
    if unknown or not names:
        raise LmforgeError(
            f"--ops {spec!r}: unknown op {', '.join(unknown) or '(none)'}; "
            f"choose from {','.join(OPS)} or all"
        )
    return names


def bench_comm(
    sizes: list[int],
    ops: list[str],
    iters: int = 20,
    warmup: int = 5,
    device_name: str = "auto",
    json_path: str | Path | None = None,
) -> list[Measurement]:
    """Measure every op at every size; rank 0 prints the table and writes the JSON."""
    if iters < 1 or warmup < 0:
        raise LmforgeError(f"--iters {iters} --warmup {warmup}: need iters ≥ 1 and warmup ≥ 0")
    device = _device(device_name)
    with _process_group(device):
        setup = Setup(dist.get_world_size(), dist.get_backend(), device.type, iters, warmup)
        results = [measure(op, size, setup, device) for op in ops for size in sizes]
        if dist.get_rank() == 0:
            print(format_table(results, setup))
            if json_path is not None:
                _write_json(json_path, results, setup)
    return results


def measure(op: str, size: int, setup: Setup, device: torch.device) -> Measurement:
    """One op at one size; the payload is `size` bytes rounded down to n equal shards."""
    n = setup.world_size
    numel = max(size // DTYPE.itemsize // n, 1) * n
    call = _CALLS[op](torch.zeros(numel, dtype=DTYPE, device=device), n)
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    for _ in range(setup.warmup):
        call()
    times = []
    for _ in range(setup.iters):
        dist.barrier()
        sync()
        start = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - start)
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # an op ends when its slowest rank does
    seconds = statistics.median(slowest.tolist())
    nbytes = numel * DTYPE.itemsize
    algbw = nbytes / seconds / 1e9
    return Measurement(op, nbytes, seconds * 1e6, algbw, algbw * BUS_FACTORS[op](n))


def format_table(results: list[Measurement], setup: Setup) -> str:
    n = setup.world_size
    lines = [
        f"collectives on {n} process{'es' * (n > 1)}, {setup.backend} on {setup.device}, "
        f"float32, median of {setup.iters} iterations after {setup.warmup} warm-up",
        f"{'op':<15}{'size':>8}{'time (us)':>12}{'algbw (GB/s)':>14}{'busbw (GB/s)':>14}",
    ]
    lines += [
        f"{m.op:<15}{_format_size(m.bytes):>8}{m.latency_us:>12.1f}"
        f"{m.algbw_gbps:>14.3f}{m.busbw_gbps:>14.3f}"
        for m in results
    ]
    if n == 1:
        lines.append(
            "note: one process, nothing crossed a link; launch under "
            "`torchrun --nproc-per-node N -m lmforge bench comm` to measure communication"
        )
    return "\n".join(lines)


def _shard(full: torch.Tensor, n: int) -> torch.Tensor:
    return torch.zeros(full.numel() // n, dtype=full.dtype, device=full.device)


def _parse_size(text: str) -> int:
    match = re.fullmatch(r"(\d+)([KMG]?)", text.strip(), re.IGNORECASE)
    value = int(match.group(1)) << _UNITS[match.group(2).upper()] if match else 0
    if value <= 0 or value & (value - 1):
        raise LmforgeError(
            f"size {text.strip()!r} is not a power of two in bytes: write e.g. 1K, 64M or 1K..256M"
        )
    return value


def _format_size(nbytes: int) -> str:
    for unit, shift in reversed(_UNITS.items()):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return str(nbytes)


def _device(name: str) -> torch.device:
    if name not in ("auto", "cpu", "cuda"):
        raise LmforgeError(f"--device {name}: collectives run on cpu (gloo) or cuda (nccl)")
    if name == "cuda" and not torch.cuda.is_available():
        raise LmforgeError("--device cuda, but CUDA is not available here: use --device cpu")
    cuda = name == "cuda" or (name == "auto" and torch.cuda.is_available())
    return torch.device("cuda" if cuda else "cpu")


@contextlib.contextmanager
def _process_group(device: torch.device) -> Iterator[None]:
    """Join torchrun's group (or a one-process group without a launcher), and leave it."""
    if dist.is_initialized():
        yield
        return
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    backend = "nccl" if device.type == "cuda" else "gloo"
    if "RANK" in os.environ:
        dist.init_process_group(backend)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _write_json(path: str | Path, results: list[Measurement], setup: Setup) -> None:
    record = {
        **asdict(setup),
        "dtype": "float32",
        "torch": torch.__version__,
        "bus_factor": {op: BUS_FACTORS[op](setup.world_size) for op in OPS},
        "results": [asdict(m) for m in results],
    }
    write_json(path, record)
