"""Python commands forked from a process that has already imported torch, for the tests that
start many: the ranks of the parallel tests and the killed-run tests' commands.

`python -m lmforge train ...` or `python script.py` spends 2-4 s of CPU importing torch (and
torch.distributed) before it does a second of work. Here a command forks from
multiprocessing's forkserver, which imports `PRELOAD` once, and runs its script or module as
`__main__` with the whole environment it is given and its output in files. Only torch is
preloaded: lmforge is imported fresh in each command, so nothing of it is shared. The process
is a real one (a SIGKILL ends it as it would end `python`), in a session of its own when asked,
as `start_new_session=True` would put it.

Not for a test of what a fresh interpreter does: torch's own settings read from the
environment at import (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA) are the server's; the thread
count (OMP_NUM_THREADS) is applied again in the command.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import threading
from pathlib import Path

PRELOAD = [
    "torch",
    "torch.distributed",
    "torch.distributed.tensor",
    "torch.distributed.fsdp",
    "torch.distributed.checkpoint",
]


class Forked:
    """A started command, with the part of `subprocess.Popen`'s interface the tests use."""

    def __init__(self, process: multiprocessing.process.BaseProcess) -> None:
        self._process = process
        self.pid = process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(f"forked command {self.pid}", timeout)
        return self._process.exitcode

    def kill(self) -> None:
        self._process.kill()
        self._process.join()


def start(
    command: list[str], env: dict[str, str], stdout: Path, stderr: Path | None = None,
    new_session: bool = False,
) -> Forked | subprocess.Popen:  # fmt: skip
    """Start `command` ([sys.executable, script, *args] or [sys.executable, "-m", module,
    *args]) with `env` as its whole environment, stdout to the file `stdout` and stderr to
    `stderr` (or the same file). Elsewhere than on Linux, a plain `subprocess.Popen`: macOS's
    system frameworks are not safe to use in a process forked without exec."""
    assert command[0] == sys.executable, command
    if sys.platform != "linux":
        with open(stdout, "w") as out, open(stderr or os.devnull, "w") as err:
            errors = err if stderr else subprocess.STDOUT
            return subprocess.Popen(
                command, env=env, stdout=out, stderr=errors, start_new_session=new_session
            )
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    process = context.Process(
        target=_run,
        args=(command[1:], env, str(stdout), str(stderr or stdout), new_session),
    )
    process.start()
    return Forked(process)


def run(command: list[str], env: dict[str, str], output: Path, timeout: float) -> int:
    """Run `command` (as `start`, stdout and stderr to `output`) to its end and return its exit
    code; killed after `timeout` seconds."""
    forked = start(command, env, output)
    try:
        return forked.wait(timeout)
    except subprocess.TimeoutExpired:
        forked.kill()
        return forked.wait()


def _run(args: list[str], env: dict[str, str], stdout: str, stderr: str, new_session: bool):
    if new_session:
        os.setsid()
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, stdout), (2, stderr)):
        if fd == 2 and path == stdout:
            os.dup2(1, 2)
            continue
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the forkserver ignores it
    import torch

    # The server's OpenMP read its environment when torch loaded; the command's asks again.
    torch.set_num_threads(int(env.get("OMP_NUM_THREADS", str(os.cpu_count() or 1))))
    try:
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(args)
            sys.path.insert(0, os.path.dirname(args[0]))  # as `python script.py` would
            runpy.run_path(args[0], run_name="__main__")
    finally:  # what the interpreter does at exit, which a forked process skips
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()
