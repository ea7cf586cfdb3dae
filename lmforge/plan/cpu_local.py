"""`cpu-local`: this machine as a planner device, measured once and cached.

Matmul FLOP/s come from `train.mfu.peak_flops` (the same cached measurement MFU uses); memory
bandwidth is the best read rate over a 256 MiB buffer (a sum: decoding streams weights the same
way), cached in `$LMFORGE_CACHE/cpu_local.json` under the processor, thread count and torch
version. torch is imported only here, and only when `cpu-local` is asked for.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from lmforge.plan.hardware import Device

BUFFER_BYTES = 256 * 2**20
REPEATS = 5


def cpu_local_device() -> Device:
    import torch

    from lmforge.train.mfu import _cache_dir, _processor_name, peak_flops

    cpu = torch.device("cpu")
    key = f"{_processor_name(cpu)}|{torch.get_num_threads()}|{torch.__version__}"
    bandwidth = _cached(_cache_dir() / "cpu_local.json", key, measure_read_bandwidth)
    return Device(
        key="cpu-local",
        name=f"this machine ({_processor_name(cpu)}, {torch.get_num_threads()} threads)",
        flops={dtype: peak_flops(cpu, dtype) for dtype in ("fp32", "bf16")},
        memory_bytes=float(_total_memory()),
        memory_bandwidth=bandwidth,
        source=f"measured here: timed matmuls and a {BUFFER_BYTES // 2**20} MiB read (cached)",
    )


def measure_read_bandwidth(clock: Callable[[], float] = time.perf_counter) -> float:
    """Best bytes/s of summing a buffer too large for the caches, timed by `clock`."""
    import torch

    x = torch.ones(BUFFER_BYTES // 4)
    x.sum()  # warm-up: page faults
    best = float("inf")
    for _ in range(REPEATS):
        t0 = clock()
        x.sum()
        best = min(best, clock() - t0)
    return BUFFER_BYTES / best


def _cached(path: Path, key: str, measure) -> float:
    try:
        cache = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        cache = {}
    if key not in cache:
        cache[key] = measure()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1) + "\n")
        os.replace(tmp, path)
    return float(cache[key])


def _total_memory() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
