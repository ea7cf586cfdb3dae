"""Worker processes for the tokenizer: how many by default, and how they start."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys


def default_workers() -> int:
    """The cores this process may use."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def context() -> mp.context.BaseContext:
    """fork on Linux (workers start in milliseconds and need only plain data, no threads or
    devices), spawn elsewhere, where fork is unsafe or missing."""
    method = "fork" if sys.platform == "linux" and "fork" in mp.get_all_start_methods() else "spawn"
    return mp.get_context(method)
