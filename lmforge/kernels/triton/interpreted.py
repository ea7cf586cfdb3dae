"""Runs code that calls Triton kernels under the interpreter, from any process.

The interpreter needs TRITON_INTERPRET=1 before triton's first import: triton.language's own
helpers (tl.sum, tl.max, tl.cdiv, ...) become interpretable or compiled at that moment, for
the rest of the process. A process that imported triton without it cannot interpret kernels,
and torch imports triton early (torch._dynamo, torch.compile and torch.utils.flop_counter do),
so a test suite cannot rely on setting the variable itself. `run_interpreted` runs a function
of a Python file in one long-lived child process started with the variable set (or in this
process when its triton is already interpreted) and returns the result by pickle. Pickles
cross only the pipe between this process and the child it started; no file is unpickled.
"""

from __future__ import annotations

import os
import pickle
import runpy
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import torch

from lmforge.errors import LmforgeError

_child: subprocess.Popen | None = None
_namespaces: dict[str, dict] = {}


def triton_interpreted() -> bool | None:
    """Whether this process's triton was imported under the interpreter; None: not imported."""
    if "triton" not in sys.modules:
        return None
    from triton.language import standard
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(standard.sum, InterpretedFunction)


def _call(path: str, function: str, kwargs: dict) -> Any:
    if path not in _namespaces:
        _namespaces[path] = runpy.run_path(path)
    return _namespaces[path][function](**kwargs)


def _start() -> subprocess.Popen:
    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return subprocess.Popen(
        [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )


def start() -> None:
    """Start the child now, without waiting: it spends seconds importing torch, which can
    overlap whatever this process does before its first run_interpreted."""
    global _child
    if not triton_interpreted() and (_child is None or _child.poll() is not None):
        _child = _start()


def run_interpreted(path: str | Path, function: str, /, **kwargs: Any) -> Any:
    """`function(**kwargs)` from the Python file at `path`, with every Triton kernel it calls
    interpreted. The file runs once per process, as a script (so it must not start work at
    the top level); arguments and result must pickle."""
    global _child
    path = str(Path(path).resolve())
    if triton_interpreted():
        return _call(path, function, kwargs)
    start()
    try:
        pickle.dump((path, function, kwargs), _child.stdin)
        _child.stdin.flush()
        ok, result = pickle.load(_child.stdout)
    except (EOFError, BrokenPipeError) as e:
        _child = None
        raise LmforgeError(
            "the Triton interpreter's child process died (its error is above): fix it and rerun"
        ) from e
    if not ok:
        raise RuntimeError(f"in the interpreter's child process:\n{result}")
    return result


def forward_backward(
    kernel: str, function: str, /, *inputs: Any, grad: Any = None, **options: Any
) -> tuple[Any, list]:
    """lmforge.kernels.triton.<kernel>.<function>(*inputs, **options) run interpreted: its
    output and, when `grad` is given, the gradients of the inputs that require grad."""
    return run_interpreted(
        __file__, "_forward_backward", kernel=kernel, function=function, inputs=inputs,
        grad=grad, options=options,
    )  # fmt: skip


def _forward_backward(kernel: str, function: str, inputs: tuple, grad: Any, options: dict):
    from lmforge.kernels.triton import load

    out = getattr(load(kernel), function)(*inputs, **options)
    if grad is None:
        return out.detach(), []
    out.backward(grad)
    return out.detach(), [t.grad for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]


def _serve() -> None:
    """The child: answer (path, function, kwargs) requests on stdin until it closes; stdout
    carries only the answers, so anything the code prints goes to stderr."""
    channel_in = sys.stdin.buffer
    channel_out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    # what a first request would import lazily (seconds), imported before it arrives: triton
    # (here under the interpreter), its interpreter's gluon types, and the sympy that torch's
    # first backward with an explicit gradient pulls in
    import torch.fx.experimental.symbolic_shapes  # noqa: F401
    import triton.experimental.gluon  # noqa: F401

    while True:
        try:
            path, function, kwargs = pickle.load(channel_in)
        except EOFError:
            return
        try:
            answer = pickle.dumps((True, _call(path, function, kwargs)))
        except BaseException:
            answer = pickle.dumps((False, traceback.format_exc()))
        channel_out.write(answer)
        channel_out.flush()


if __name__ == "__main__":
    _serve()
