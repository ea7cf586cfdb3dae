"""Ranks forked from a process that has already imported torch, for the parallel tests.

A rank started as `python script.py` spends about 3.5 s of CPU importing torch, torch.distributed
and DTensor before it trains for a second; the suite starts 14 such ranks. Here they fork from
multiprocessing's forkserver, which imports `PRELOAD` once, and then run their script as
`__main__` with the environment torchrun would give them. Only torch is preloaded: lmforge is
imported fresh in each rank, so nothing of it is shared between ranks or tests.
"""

import os
import runpy
import sys

PRELOAD = [
    "torch",
    "torch.distributed",
    "torch.distributed.tensor",
    "torch.distributed.fsdp",
    "torch.distributed.checkpoint",
]


def run_script(script: str, args: list[str], env: dict[str, str], log: str) -> None:
    """Run `script args` as `__main__` with `env` as the whole environment and its output
    (stdout and stderr) in the file `log`; the process's exit code is the script's."""
    os.environ.clear()
    os.environ.update(env)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    import torch

    # The server's OpenMP read its environment when torch loaded; the rank's asks again.
    torch.set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(script))  # as `python script.py` would
    runpy.run_path(script, run_name="__main__")
