"""Running model-written Python programs for code-generation evaluation, one subprocess each.

This module owns the execution harness behind HumanEval-style scoring: a program passes when it
exits 0 within its time. Each program runs as `python -I` (isolated: no user site, no PYTHON*
variables) with a fresh directory of its own as its cwd, HOME and TMPDIR, a PATH-only
environment, in a session of its own so that a wall-clock timeout kills it and everything it
started.

Where the OS allows it, that process runs under bubblewrap (eval/sandbox.py, which owns the
choice and the command line): the isolation boundary. It has no network, sees no host process
(its own PID namespace), sees only a read-only /usr and interpreter besides a private 64 MiB
tmpfs that is its directory, and runs as `nobody` when the harness is root. Elsewhere (macOS, a
container that forbids namespaces, bubblewrap missing) a warning says so once and the guard
below is all there is; LMFORGE_SANDBOX=bwrap|guard (or `sandbox=`) forces either.

Inside either, a bootstrap (`_BOOTSTRAP`, run by the child before the program) sets resource
limits (CPU seconds, address space, file size, process count, no core dumps) and disables the
obvious ways a mistaken program could do harm: it cannot create sockets, start or signal
processes, or write, delete or rename anything outside its directory. Limits are set in the
child, not in a `preexec_fn`, because `preexec_fn` is unsafe with threads and `run_programs`
runs many at once. That guard is a safety net against accidents, not a security boundary: a
program written to escape it can (re-importing the modules it patched restores the originals;
tests/eval/test_sandbox_escapes.py does so and shows bubblewrap containing what follows).
POSIX only: a Windows machine gets an LmforgeError.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from lmforge.errors import LmforgeError
from lmforge.eval.sandbox import SANDBOX_PATH, WORKDIR, command, resolve

OUTPUT_CHARS = 4096  # the tail of stdout and stderr a result keeps
FILE_SIZE_MB = 16  # RLIMIT_FSIZE: the largest file (stdout included) a program may write
PROGRAM_FILE = "program.py"


@dataclass
class ExecutionResult:
    """What became of one program.

    `status` is "passed" (exit 0), "failed" (a non-zero exit: an assertion, an exception, a
    guarded operation refused), "timeout" (killed at the wall-clock or CPU limit) or "error"
    (killed by another signal, e.g. the file-size limit). `detail` says why in one line.
    """

    passed: bool
    status: str
    detail: str
    stdout: str = ""
    stderr: str = ""
    wall_s: float = 0.0
    sandbox: str = "guard"  # what it ran behind: "bwrap" or "guard" (eval/sandbox.py)


# Run by the child as `python -I -c _BOOTSTRAP <timeout_s> <memory_mb> <file_size_mb>` in its
# temporary directory. Written against the stdlib only; everything it defines is underscored.
_BOOTSTRAP = r"""
import builtins, io, math, os, sys
_ROOT = os.path.realpath(os.getcwd())
with open("program.py", encoding="utf-8") as _f:
    _SOURCE = _f.read()

import resource as _resource
_timeout, _memory_mb, _fsize_mb = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def _limit(name, value):
    if hasattr(_resource, name):
        try:
            _resource.setrlimit(getattr(_resource, name), (value, value))
        except (ValueError, OSError):
            pass
_cpu = max(1, math.ceil(_timeout))
try:
    _resource.setrlimit(_resource.RLIMIT_CPU, (_cpu, _cpu + 1))  # SIGXCPU, then SIGKILL
except (ValueError, OSError):
    pass
if sys.platform != "darwin":  # macOS does not enforce RLIMIT_AS reliably (and may refuse it)
    _limit("RLIMIT_AS", _memory_mb * 2**20)
_limit("RLIMIT_FSIZE", _fsize_mb * 2**20)
_limit("RLIMIT_CORE", 0)
_limit("RLIMIT_NPROC", 0)  # no new processes or threads (root is exempt; the guard still holds)

def _refusing(name):
    def refuse(*args, **kwargs):
        raise PermissionError(f"{name} is disabled while evaluating generated code")
    return refuse

def _fd_dir(fd):
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        pass
    try:
        import fcntl
        return os.fsdecode(fcntl.fcntl(fd, fcntl.F_GETPATH, bytes(1024)).rstrip(b"\0"))
    except (ImportError, AttributeError, OSError):
        raise PermissionError("cannot tell where dir_fd points") from None

def _inside(path, dir_fd=None):
    if isinstance(path, int):
        return True  # an already open descriptor: opening it was checked
    path = os.fsdecode(os.fspath(path))
    if dir_fd is not None and not os.path.isabs(path):
        path = os.path.join(_fd_dir(dir_fd), path)
    real = os.path.realpath(path)
    return real == os.devnull or os.path.commonpath([_ROOT, real]) == _ROOT

def _check(path, dir_fd=None):
    if not _inside(path, dir_fd):
        raise PermissionError(f"changing files outside the program's directory: {path!r}")

def _writes(mode):
    return any(c in str(mode) for c in "wax+")

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_open = builtins.open
def _guarded_open(file, mode="r", *args, **kwargs):
    if _writes(mode):
        _check(file)
    return _open(file, mode, *args, **kwargs)
import _io
builtins.open = io.open = _io.open = _guarded_open

_FileIO = io.FileIO
class _GuardedFileIO(_FileIO):
    def __init__(self, file, mode="r", *args, **kwargs):
        if _writes(mode):
            _check(file)
        super().__init__(file, mode, *args, **kwargs)
io.FileIO = _io.FileIO = _GuardedFileIO

import posix as _posix
def _patch(name, wrap):
    for module in (os, _posix):
        original = getattr(module, name, None)
        if original is not None:
            setattr(module, name, wrap(original))

def _os_open(original):
    def os_open(path, flags, mode=0o777, *, dir_fd=None):
        if flags & _WRITE_FLAGS:
            _check(path, dir_fd)
        return original(path, flags, mode, dir_fd=dir_fd)
    return os_open
_patch("open", _os_open)

def _paths(*specs):  # (position, keyword, dir_fd keyword) of each path that must lie inside
    def wrap(original):
        def guarded(*args, **kwargs):
            for position, keyword, fd_keyword in specs:
                path = args[position] if position < len(args) else kwargs.get(keyword)
                if path is not None:
                    _check(path, kwargs.get(fd_keyword))
            return original(*args, **kwargs)
        return guarded
    return wrap
for _name in ("remove", "unlink", "rmdir", "mkdir", "chmod", "chown", "lchown", "lchmod",
              "truncate", "utime", "mkfifo", "mknod", "chflags", "lchflags", "setxattr",
              "removexattr"):
    _patch(_name, _paths((0, "path", "dir_fd")))
for _name in ("rename", "replace", "link"):
    _patch(_name, _paths((0, "src", "src_dir_fd"), (1, "dst", "dst_dir_fd")))
_patch("symlink", _paths((1, "dst", "dir_fd")))

for _name in ("system", "popen", "kill", "killpg", "fork", "forkpty", "vfork", "execv", "execve",
              "execl", "execle", "execlp", "execlpe", "execvp", "execvpe", "spawnl", "spawnle",
              "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe", "posix_spawn",
              "posix_spawnp", "chroot", "setuid", "setgid", "seteuid", "setegid", "setreuid",
              "setregid", "setresuid", "setresgid", "pidfd_open"):
    _patch(_name, lambda original, name=f"os.{_name}": _refusing(name))

# Processes, sockets and name lookups are refused at their C entry points, patched before the
# stdlib modules over them are imported, so subprocess, socket, ssl and asyncio still import
# (and cost nothing here). socket.socket subclasses _socket.socket, so it refuses too.
import _posixsubprocess, _socket
_posixsubprocess.fork_exec = _refusing("starting a process")
class _NoSocket(_socket.socket):
    __slots__ = ()  # socket.socket adds its own __weakref__ slot
    def __init__(self, *args, **kwargs):
        _refusing("socket")()
_socket.socket = _socket.SocketType = _NoSocket
for _name in ("socketpair", "getaddrinfo", "getnameinfo", "gethostbyname", "gethostbyname_ex",
              "gethostbyaddr"):
    setattr(_socket, _name, _refusing(f"socket.{_name}"))
if "subprocess" in sys.modules:  # imported at startup (by a .pth file): patch it as well
    sys.modules["subprocess"]._fork_exec = _posixsubprocess.fork_exec
if "socket" in sys.modules:
    sys.modules["socket"].socket = sys.modules["socket"].SocketType = _NoSocket
if "shutil" in sys.modules:  # rmtree goes path by path through the guarded os calls
    sys.modules["shutil"]._use_fd_functions = False
for _name in ("ctypes", "_ctypes", "resource", "multiprocessing", "pty", "tkinter", "psutil"):
    sys.modules[_name] = None  # `import ctypes` now raises ImportError

del _f
sys.argv = ["program.py"]
exec(compile(_SOURCE, "program.py", "exec"), {"__name__": "__main__", "__file__": "program.py"})
"""


def run_program(
    source: str, timeout_s: float = 5.0, memory_mb: int = 1024, sandbox: str | None = None
) -> ExecutionResult:
    """Run the Python program `source` in a sandboxed subprocess; it passes if it exits 0
    within `timeout_s` wall-clock seconds, using at most `memory_mb` of address space.
    `sandbox` is "bwrap", "guard" or "auto" (eval/sandbox.py; default: LMFORGE_SANDBOX)."""
    if os.name != "posix":
        raise LmforgeError(
            "executing generated code needs a POSIX system (Linux or macOS): run it under WSL"
        )
    if timeout_s <= 0 or memory_mb <= 0:
        raise LmforgeError(
            f"execution limits must be positive (timeout_s={timeout_s}, memory_mb={memory_mb})"
        )
    kind = resolve(sandbox)
    with tempfile.TemporaryDirectory(prefix="lmforge-exec-", ignore_cleanup_errors=True) as root:
        program = os.path.join(root, PROGRAM_FILE)
        with open(program, "w", encoding="utf-8") as f:
            f.write(source)
        out_path, err_path = os.path.join(root, ".stdout"), os.path.join(root, ".stderr")
        home = WORKDIR if kind == "bwrap" else root  # the program's own directory
        env = {
            "PATH": SANDBOX_PATH if kind == "bwrap" else os.environ.get("PATH", os.defpath),
            "HOME": home,
            "TMPDIR": home,  # tempfile writes inside the program's own directory
            "OMP_NUM_THREADS": "1",  # no thread pools: the process limit forbids threads
            "OPENBLAS_NUM_THREADS": "1",
        }
        limits = [str(timeout_s), str(memory_mb), str(FILE_SIZE_MB)]
        argv = [sys.executable, "-I", "-c", _BOOTSTRAP, *limits]
        if kind == "bwrap":
            argv = command(program, argv)
        start = time.monotonic()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                argv,
                cwd=root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
            timed_out = False
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc.pid)  # the program, and anything it managed to leave behind
                proc.wait()
        wall_s = time.monotonic() - start
        stdout, stderr = _tail(out_path), _tail(err_path)
    returncode = proc.returncode
    if kind == "bwrap" and returncode > 128:  # bwrap reports a program's signal as 128 + it
        returncode = 128 - returncode
    status, detail = _outcome(returncode, timed_out, timeout_s, stderr)
    return ExecutionResult(status == "passed", status, detail, stdout, stderr, wall_s, kind)


def run_programs(
    sources: Sequence[str],
    workers: int = 2,
    timeout_s: float = 5.0,
    memory_mb: int = 1024,
    sandbox: str | None = None,
) -> list[ExecutionResult]:
    """Run each of `sources` with `run_program`, `workers` at a time; results in input order."""
    if not sources:
        return []
    kind = resolve(sandbox)  # probed (and any warning given) once, before the threads start
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(sources)))) as pool:
        return list(pool.map(lambda s: run_program(s, timeout_s, memory_mb, kind), sources))


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is already gone
        os.killpg(pgid, signal.SIGKILL)


def _tail(path: str, chars: int = OUTPUT_CHARS) -> str:
    """The last `chars` characters of a captured stream (the end holds the traceback)."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - 4 * chars))  # UTF-8 takes at most 4 bytes a character
        text = f.read().decode("utf-8", errors="replace")
    return "…" + text[-chars:] if size > 4 * chars or len(text) > chars else text


def _outcome(returncode: int, timed_out: bool, timeout_s: float, stderr: str) -> tuple[str, str]:
    if timed_out:
        return "timeout", f"killed at the {timeout_s:g} s wall-clock limit"
    if returncode == 0:
        return "passed", "exit code 0"
    if returncode == -signal.SIGXCPU:
        return "timeout", f"killed at the {math.ceil(timeout_s)} s CPU-time limit"
    if returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else ""
        why = " (file size limit)" if returncode == -signal.SIGXFSZ else ""
        return "error", f"killed by signal {name or -returncode}{why}"
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return "failed", f"exit code {returncode}" + (f": {lines[-1].strip()}" if lines else "")
