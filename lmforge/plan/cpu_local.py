"""`cpu-local`: this machine as a planner device, measured once and cached.

Matmul FLOP/s come from `device.peak` (the same cached measurement MFU uses); memory
bandwidth is the best read rate over a 256 MiB buffer (a sum: decoding streams weights the same
way), cached in `$LMFORGE_CACHE/cpu_local.json` under the processor, thread count and torch
version. torch is imported only here, and only when `cpu-local` is asked for.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from lmforge.plan.hardware import Device

BUFFER_BYTES = 256 * 2**20
REPEATS = 5


def cpu_local_device() -> Device:
    import torch

    from lmforge.device.peak import (
        cache_dir,
        cached,
        machine_key,
        measured_peak_flops,
        processor_name,
    )

    cpu = torch.device("cpu")
    bandwidth = cached(cache_dir() / "cpu_local.json", machine_key(cpu), measure_read_bandwidth)
    return Device(
        key="cpu-local",
        name=f"this machine ({processor_name(cpu)}, {torch.get_num_threads()} threads)",
        flops={dtype: measured_peak_flops(cpu, dtype) for dtype in ("fp32", "bf16")},
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


def _total_memory() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
