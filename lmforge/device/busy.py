"""How busy the machine is: the share of its CPUs that other processes used over an interval.

Linux only (/proc/stat's busy ticks, less this process's own CPU time from os.times); None
elsewhere. A run's report sets this beside its throughput: a slow run on a busy machine is the
machine, a slow run on a quiet one is the run.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class CpuSample:
    wall: float
    busy: float  # seconds of CPU time all processes spent (None-free: 0 where unknown)
    ours: float  # this process's and its waited-for children's CPU seconds
    known: bool


def sample() -> CpuSample:
    t = os.times()
    ours = t.user + t.system + t.children_user + t.children_system
    busy, known = 0.0, False
    try:
        fields = PROC_STAT.read_text().splitlines()[0].split()[1:]
        ticks = [int(f) for f in fields]
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
        busy = (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")  # guest ticks are in user
        known = True
    except (OSError, ValueError, IndexError):
        pass
    return CpuSample(time.monotonic(), busy, ours, known)


def others_share(start: CpuSample, end: CpuSample, cpus: int | None = None) -> float | None:
    """The fraction of the machine's CPU capacity (0 to 1) that other processes used between
    two samples; None where /proc/stat is unavailable or the interval is empty."""
    wall = end.wall - start.wall
    if not (start.known and end.known) or wall <= 0:
        return None
    cpus = cpus or os.cpu_count() or 1
    others = (end.busy - start.busy) - (end.ours - start.ours)
    return min(1.0, max(0.0, others / (wall * cpus)))
