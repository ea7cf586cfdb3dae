"""What model-written programs run behind: bubblewrap where the OS allows it, else the guard.

This module owns that choice and the bubblewrap command line; eval/execution.py runs programs
through it. Chosen once per process, on first use (`resolve`): `sandbox=` on `run_program(s)`,
else `LMFORGE_SANDBOX` (`auto`, `bwrap` or `guard`), else `auto`.

- `bwrap`: each program runs under bubblewrap (`bwrap`, Debian's `bubblewrap`) in namespaces of
  its own: no network (a network namespace holding only its own loopback), its own PID namespace
  (it sees itself and bwrap's init, nothing of the host), its own IPC and UTS namespaces, a root
  that holds only a read-only view of /usr and the interpreter's prefixes, a fresh /proc and a
  minimal /dev, and a private tmpfs of `DISK_MB` (its cwd, HOME and TMPDIR) with the program
  bound read-only into it. Nothing else of the host's files (home, /tmp, the repository, /etc)
  exists there, and its environment holds only what the harness sets. All capabilities are
  dropped and no-new-privileges is set. As root, bwrap needs no user namespace, and the program
  then runs as `nobody` (setpriv clears every capability, the bounding set included), so the
  process limit binds it (root is exempt) and it can signal or trace no host process. The
  resource limits and the guard of execution.py still apply inside, as a second layer.
- `guard`: execution.py's guard alone, a safety net against mistakes, not a security boundary.

`auto` probes once (bwrap present, Linux, a sandbox that starts and runs Python) and, where the
probe fails (macOS, a container that forbids namespaces, bwrap missing), warns once, naming why
and the fix, and uses the guard. `bwrap` makes that failure an LmforgeError.

Not covered: the program may still create user namespaces of its own inside (bwrap's
`--disable-userns` needs the sandbox to be one, which the root path does without), and bwrap's
init, once it exits, is left for the host's init to reap (bwrap's monitor does not wait for
it), so a container whose PID 1 never reaps collects one zombie per program.
"""

from __future__ import annotations

import functools
import os
import shutil
import site
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path

from lmforge.errors import LmforgeError

SANDBOXES = ("auto", "bwrap", "guard")
ENV = "LMFORGE_SANDBOX"
WORKDIR = "/sandbox"  # the program's cwd, HOME and TMPDIR inside bwrap
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"  # its PATH (the host's would name host folders)
DISK_MB = 64  # the size of that tmpfs: all the program's files together
NOBODY = 65534  # the uid and gid a program runs as when bwrap runs as root
FIX = "install bubblewrap (apt-get install bubblewrap) or set LMFORGE_SANDBOX=guard"


class SandboxWarning(UserWarning):
    """Generated code runs behind the guard only: no isolation boundary on this machine."""


def requested(sandbox: str | None = None) -> str:
    """The sandbox asked for: the argument, else LMFORGE_SANDBOX, else auto."""
    choice = sandbox or os.environ.get(ENV) or "auto"
    if choice not in SANDBOXES:
        raise LmforgeError(f"sandbox {choice!r} is unknown; use one of {SANDBOXES} ({ENV})")
    return choice


def resolve(sandbox: str | None = None) -> str:
    """ "bwrap" or "guard": what runs generated code here, given what was asked for."""
    choice = requested(sandbox)
    if choice == "guard":
        return "guard"
    reason = bwrap_unavailable()
    if reason is None:
        return "bwrap"
    if choice == "bwrap":
        raise LmforgeError(f"sandbox 'bwrap' was asked for, but {reason}")
    _warn_once(reason)
    return "guard"


@functools.cache
def _warn_once(reason: str) -> None:
    warnings.warn(
        f"generated code runs behind the guard only, not in a sandbox: {reason}",
        SandboxWarning,
        stacklevel=4,
    )


@functools.cache
def bwrap_unavailable() -> str | None:
    """Why bwrap cannot sandbox programs here, with the fix, or None when it can (probed once:
    a sandbox is started and runs this interpreter)."""
    if sys.platform != "linux":
        return f"bubblewrap needs Linux and this is {sys.platform}: run under Linux or a VM"
    if shutil.which("bwrap") is None:
        return f"bwrap is not installed: {FIX}"
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "setpriv is missing (it drops root inside the sandbox): install util-linux"
    probe = "import os; print('uid', os.getuid())"
    with tempfile.TemporaryDirectory(prefix="lmforge-probe-") as root:
        program = os.path.join(root, "program.py")
        open(program, "w").close()
        argv = command(program, [sys.executable, "-I", "-c", probe])
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=60, env={"PATH": os.defpath}
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"bwrap could not start ({e}); {FIX}"
    expected = f"uid {NOBODY if os.geteuid() == 0 else os.getuid()}"
    if done.returncode != 0 or done.stdout.strip() != expected:
        lines = done.stderr.strip().splitlines() or [f"exit code {done.returncode}"]
        return (
            f"bwrap cannot start a sandbox here ({lines[-1].strip()}): allow user namespaces "
            f"(sysctl kernel.unprivileged_userns_clone=1, or run the container with "
            f"--privileged) or set {ENV}=guard"
        )
    return None


def command(program: str, argv: Sequence[str], disk_mb: int = DISK_MB) -> list[str]:
    """The bwrap command line that runs `argv` sandboxed, in WORKDIR (a tmpfs of `disk_mb`) with
    the host file `program` bound read-only into it as program.py."""
    cmd = [
        "bwrap",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",  # the harness kills bwrap at the timeout: its namespace goes too
        "--new-session",
        "--cap-drop",
        "ALL",
    ]
    root = os.geteuid() == 0
    if root:  # no user namespace: setpriv turns the program into nobody, then holds no caps
        cmd += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
    else:
        cmd += ["--unshare-user"]
    made: set[str] = set()
    for path in _readable_paths():
        cmd += _parents(path, made)
        cmd += ["--ro-bind", path, path]
    for link in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(link):
            cmd += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            cmd += ["--ro-bind", link, link]
    if os.path.exists("/etc/ld.so.cache"):  # where the dynamic loader finds shared libraries
        cmd += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    cmd += ["--proc", "/proc", "--dev", "/dev"]
    cmd += ["--perms", "1777", "--size", str(disk_mb * 2**20), "--tmpfs", WORKDIR]
    cmd += ["--ro-bind", program, f"{WORKDIR}/program.py", "--chdir", WORKDIR]
    if root:
        cmd += [
            shutil.which("setpriv") or "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--",
        ]
    return cmd + list(argv)


@functools.cache
def _readable_paths() -> tuple[str, ...]:
    """The host folders the sandbox sees read-only: /usr and the interpreter's prefixes and
    site-packages (where outside /usr), each once, outermost first."""
    paths = ["/usr", sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix]
    paths += [os.path.dirname(os.path.realpath(sys.executable)), *site.getsitepackages()]
    setpriv = shutil.which("setpriv")
    if setpriv:
        paths.append(os.path.dirname(os.path.realpath(setpriv)))
    kept: list[str] = []
    for path in sorted({os.path.realpath(p) for p in paths if os.path.isdir(p)}, key=len):
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    for path in (sys.prefix, sys.base_prefix):  # a venv's or pyenv's symlinked spelling
        if os.path.realpath(path) != path and os.path.isdir(path):
            kept.append(path)
    return tuple(kept)


def shows(folder: str) -> bool:
    """Whether the sandbox shows the host folder `folder` at all: only as the way to a folder it
    binds (a venv or an interpreter under /tmp or /home, say), never with its contents."""
    return any(Path(path).is_relative_to(folder) for path in _readable_paths())


def _parents(path: str, made: set[str]) -> list[str]:
    """--dir arguments that create `path`'s ancestors world-readable (bwrap would copy the
    host's modes, and /root is 0700: the program, as nobody, could not pass it)."""
    out = []
    parts = path.strip("/").split("/")[:-1]
    for i in range(1, len(parts) + 1):
        parent = "/" + "/".join(parts[:i])
        if parent not in made and parent != "/usr" and not parent.startswith("/usr/"):
            made.add(parent)
            out += ["--perms", "0755", "--dir", parent]
    return out
