"""Worker processes for the tokenizer: how many by default, and how they start."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import threading


def default_workers() -> int:
    """The cores this process may use."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def context() -> mp.context.BaseContext:
    """fork on Linux while this process runs no other thread, torch's included (workers start
    in milliseconds and need only plain data); forkserver there once threads may exist (a fork
    copies any lock another thread holds: a child once waited on one forever in CI); spawn
    elsewhere."""
    methods = mp.get_all_start_methods()
    single = threading.active_count() == 1 and "torch" not in sys.modules  # torch: OMP threads
    if sys.platform == "linux" and "fork" in methods and single:
        method = "fork"
    elif sys.platform == "linux" and "forkserver" in methods:
        method = "forkserver"
    else:
        method = "spawn"
    return mp.get_context(method)
