"""This machine's memory read bandwidth and total memory, as the planner's `cpu-local` uses them.

Bandwidth is the best read rate over a 256 MiB buffer (a sum: decoding streams weights the same
way); `lmforge.planner_inputs` caches it beside the peak FLOP/s of `device.peak`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

BUFFER_BYTES = 256 * 2**20
REPEATS = 5


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


def total_memory() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
