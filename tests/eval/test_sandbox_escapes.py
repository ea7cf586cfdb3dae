"""Programs written to escape: each first undoes the guard (`KIT` re-imports the modules it
patched, restoring the originals, and brings back ctypes and resource), then tries to reach the
host: the network, a port and an abstract socket the test listens on, files outside its folder
(read, write, delete, the interpreter's own site-packages), the test's processes (signal,
ptrace, /proc/<pid>/environ), a fork bomb, the disk and memory. Behind bubblewrap every attempt
must fail at the OS and leave the host untouched; the guard alone, which the same kit is shown
to defeat, is not asked to contain them (it is not a boundary: test_execution.py tests what it
does do). All the programs run once, side by side through `run_programs`."""

import os
import socket
import subprocess
import sys
import sysconfig
import uuid
import warnings
from pathlib import Path

import pytest

from lmforge.errors import LmforgeError
from lmforge.eval import sandbox as sandbox_module
from lmforge.eval.execution import run_program, run_programs
from lmforge.eval.sandbox import SandboxWarning, bwrap_unavailable, resolve
from lmforge.eval.sandbox import shows as sandbox_shows

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="bubblewrap needs Linux")

# Undo the guard: the patched modules are dropped from sys.modules and imported again. A
# single-phase extension module (posix, _socket, _posixsubprocess) comes back with its original
# functions; ctypes and resource import again once their None entries are gone.
KIT = r"""
import sys
for _name in ("posix", "_socket", "_posixsubprocess", "resource", "ctypes", "_ctypes",
              "os", "socket", "subprocess", "shutil"):
    sys.modules.pop(_name, None)
import posix, _socket, _posixsubprocess, resource, ctypes
import os, socket, subprocess, shutil
libc = ctypes.CDLL(None, use_errno=True)

def attempt(name, action):
    try:
        value = action()
    except BaseException as e:
        print(name, "refused", type(e).__name__, getattr(e, "errno", None), flush=True)
    else:
        print(name, "done", repr(value)[:200], flush=True)
"""

GUARD_DEFEATED = (
    KIT
    + r"""
print("fork", type(posix.fork).__name__)
print("socket", _socket.socket.__name__)
print("fork_exec", type(subprocess._fork_exec).__name__)
print("ctypes", libc.getpid() == os.getpid())
print("rlimit", resource.getrlimit(resource.RLIMIT_NPROC))
"""
)


def outcomes(stdout: str) -> dict[str, tuple[str, ...]]:
    """The program's `attempt` lines: name -> ("refused", exception, errno) or ("done", value)."""
    seen = {}
    for line in stdout.splitlines():
        name, verdict, rest = [*line.split(" ", 2), "", ""][:3]
        if verdict in ("done", "refused"):
            seen[name] = (verdict, rest) if verdict == "done" else (verdict, *rest.split(" "))
    return seen


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """What the programs aim at, on the host: listeners, files, a victim process with a secret
    in its environment."""
    if reason := bwrap_unavailable():
        pytest.skip(reason)
    outside = tmp_path_factory.mktemp("outside")
    secret = f"secret-{uuid.uuid4().hex}"
    (outside / "secret.txt").write_text(secret)
    (outside / "keep.txt").write_text("still here")
    tcp = socket.create_server(("127.0.0.1", 0))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    unix_name = f"\0lmforge-test-{uuid.uuid4().hex}"
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(unix_name)
    unix.listen()
    victim = subprocess.Popen(
        ["sleep", "120"], env={"PATH": os.defpath, "LMFORGE_TEST_SECRET": secret}
    )
    os.environ["LMFORGE_TEST_SECRET"] = secret  # the harness's own environment holds it too
    home_files = sorted(p for p in Path.home().iterdir() if p.is_file())
    state = {
        "outside": outside,
        "secret": secret,
        "tcp": tcp,
        "udp": udp,
        "unix": unix,
        "unix_name": unix_name,
        "victim": victim,
        "home_file": str(home_files[0]) if home_files else None,
        "escape": f"escape-{uuid.uuid4().hex}",
    }
    yield state
    del os.environ["LMFORGE_TEST_SECRET"]
    victim.kill()
    victim.wait()
    for s in (tcp, udp, unix):
        s.close()


def programs(h: dict) -> dict[str, str]:
    outside, port = str(h["outside"]), h["tcp"].getsockname()[1]
    udp_port, victim, me = h["udp"].getsockname()[1], h["victim"].pid, os.getpid()
    escape = os.path.join(outside, h["escape"])
    in_venv = os.path.join(sysconfig.get_paths()["purelib"], h["escape"] + ".pth")
    in_repo = os.path.join(os.path.dirname(__file__), h["escape"])
    return {
        "network": KIT
        + f"""
def tcp():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(3)
    return s.connect(("127.0.0.1", {port}))
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"hello", ("127.0.0.1", {udp_port}))
    return s.sendto(b"hello", ("10.0.0.1", 53))
def unix():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    return s.connect({h["unix_name"]!r})
def far():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(3)
    return s.connect(("1.1.1.1", 80))
attempt("open_socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).fileno() > 0)
attempt("tcp", tcp)
attempt("udp", udp)
attempt("unix", unix)
attempt("far", far)
attempt("dns", lambda: socket.getaddrinfo("example.com", 80))
""",
        "read": KIT
        + f"""
attempt("secret", lambda: open({outside + "/secret.txt"!r}).read())
attempt("list_outside", lambda: os.listdir({outside!r}))
attempt("repo", lambda: open({__file__!r}).read(100))
attempt("home", lambda: open({h["home_file"] or outside + "/secret.txt"!r}).read(100))
attempt("passwd", lambda: open("/etc/passwd").read())
attempt("root", lambda: sorted(os.listdir("/")))
""",
        "write": KIT
        + f"""
attempt("posix_open", lambda: posix.open({escape!r}, posix.O_WRONLY | posix.O_CREAT))
attempt("fileio", lambda: __import__("io").FileIO.__mro__[1]({escape!r}, "w"))  # the unguarded
attempt("unlink", lambda: posix.unlink({outside + "/keep.txt"!r}))
attempt("rmtree", lambda: shutil.rmtree({outside!r}))
attempt("venv", lambda: posix.open({in_venv!r}, posix.O_WRONLY | posix.O_CREAT))
attempt("repo", lambda: posix.open({in_repo!r}, posix.O_WRONLY | posix.O_CREAT))
attempt("system", lambda: posix.system("echo x > {escape}"))
attempt("subprocess", lambda: subprocess.run(["sh", "-c", "echo x > {escape}"]))
attempt("ctypes_system", lambda: libc.system(b"echo x > {escape}"))
""",
        "processes": KIT
        + f"""
attempt("kill_victim", lambda: posix.kill({victim}, 9))
attempt("probe_test", lambda: posix.kill({me}, 0))
attempt("kill_parent", lambda: posix.kill(posix.getppid(), 9))
def ptrace():
    if libc.ptrace(16, {victim}, None, None) != 0:  # PTRACE_ATTACH
        raise OSError(ctypes.get_errno(), "ptrace")
attempt("ptrace", ptrace)
attempt("victim_environ", lambda: open("/proc/{victim}/environ", "rb").read())
attempt("test_environ", lambda: open("/proc/{me}/environ", "rb").read())
attempt("all_environ", lambda: [open(f"/proc/{{p}}/environ", "rb").read()
                                for p in os.listdir("/proc") if p.isdigit()])
attempt("pids", lambda: sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
attempt("environ", lambda: sorted(os.environ))
""",
        "fork_bomb": KIT
        + """
def bomb():
    started = 0
    for _ in range(64):  # bounded: a broken sandbox would start 64 children that exit at once
        if posix.fork() == 0:
            posix._exit(0)
        started += 1
    return started
def ctypes_fork():
    pid = libc.fork()
    if pid == 0:
        posix._exit(0)
    if pid < 0:
        raise OSError(ctypes.get_errno(), "fork")
    return pid
attempt("fork", bomb)
attempt("ctypes_fork", ctypes_fork)
attempt("thread", lambda: __import__("threading").Thread(target=print).start())
attempt("raise_nproc", lambda: resource.setrlimit(resource.RLIMIT_NPROC, (100, 100)))
""",
        "disk": KIT
        + """
attempt("big_file", lambda: open("big", "wb").write(bytes(32 * 2**20)))
def fill():
    written = 0
    for i in range(200):  # 200 MiB, more than the sandbox's tmpfs
        with open(f"fill{i}", "wb") as f:
            for _ in range(8):
                f.write(bytes(2**17))
        written += 1
    return written
attempt("fill", fill)
print("filled", sum(os.path.getsize(n) for n in os.listdir(".") if n.startswith("fill")))
attempt("dev_shm", lambda: open("/dev/shm/x", "wb").write(b"x"))
attempt("dev", lambda: open("/dev/x", "wb").write(b"x"))
""",
        "memory": KIT
        + """
attempt("raise_as", lambda: resource.setrlimit(resource.RLIMIT_AS, (-1, -1)))
attempt("allocate", lambda: len(bytearray(10 * 2**30)))
""",
    }


@pytest.fixture(scope="module")
def escaped(host):
    """Each program's result, all run behind bubblewrap side by side."""
    named = programs(host)
    results = run_programs(list(named.values()), workers=2, timeout_s=10.0, sandbox="bwrap")
    for result in results:
        assert result.sandbox == "bwrap"
        assert result.status != "timeout", result
    return {name: (r, outcomes(r.stdout)) for name, r in zip(named, results, strict=True)}


def test_the_kit_defeats_the_guard_so_only_the_sandbox_contains_what_follows():
    kinds = ["guard"] if bwrap_unavailable() else ["guard", "bwrap"]
    for kind in kinds:
        result = run_program(GUARD_DEFEATED, sandbox=kind)
        assert result.passed, result
        lines = result.stdout.splitlines()
        assert lines[:4] == [
            "fork builtin_function_or_method",
            "socket socket",
            "fork_exec builtin_function_or_method",
            "ctypes True",
        ], result.stdout
        assert lines[4] == "rlimit (0, 0)"


def test_no_network(escaped, host):
    result, seen = escaped["network"]
    assert result.passed, result  # every attempt ran to its end
    assert seen["open_socket"] == ("done", "True")  # a socket opens: it reaches nothing
    assert seen["tcp"][:2] == ("refused", "ConnectionRefusedError"), seen
    assert seen["udp"][:2] == ("refused", "OSError"), seen  # 10.0.0.1: no route
    assert seen["unix"][:2] == ("refused", "ConnectionRefusedError"), seen
    assert seen["far"][0] == "refused" and seen["dns"][0] == "refused", seen
    for listener in (host["tcp"], host["udp"], host["unix"]):
        listener.setblocking(False)
    with pytest.raises(BlockingIOError):
        host["tcp"].accept()
    with pytest.raises(BlockingIOError):
        host["udp"].recv(16)
    with pytest.raises(BlockingIOError):
        host["unix"].accept()


def test_no_file_outside_can_be_read(escaped, host):
    result, seen = escaped["read"]
    assert host["secret"] not in result.stdout + result.stderr
    for name in ("secret", "list_outside", "repo", "home", "passwd"):
        assert seen[name][:2] in {
            ("refused", "FileNotFoundError"),
            ("refused", "PermissionError"),
        }, (name, seen[name])
    root = seen["root"]
    assert root[0] == "done", root
    for folder in ("tmp", "home"):  # there only on the way to the venv or the interpreter
        assert f"'{folder}'" not in root[1] or sandbox_shows(f"/{folder}"), root


def test_nothing_outside_is_written_or_deleted(escaped, host):
    result, seen = escaped["write"]
    assert result.passed, result
    for name in ("posix_open", "fileio", "unlink", "rmtree", "venv", "repo"):
        assert seen[name][0] == "refused", (name, seen[name])
    assert seen["subprocess"][:2] == ("refused", "BlockingIOError"), seen  # no process
    assert seen["system"] != ("done", "0") and seen["ctypes_system"] != ("done", "0"), seen
    outside = host["outside"]
    assert (outside / "keep.txt").read_text() == "still here"
    assert not (outside / host["escape"]).exists()
    assert not os.path.exists(
        os.path.join(sysconfig.get_paths()["purelib"], host["escape"] + ".pth")
    )
    assert not os.path.exists(os.path.join(os.path.dirname(__file__), host["escape"]))


def test_no_host_process_can_be_signalled_traced_or_read(escaped, host):
    result, seen = escaped["processes"]
    for name in ("kill_victim", "probe_test", "ptrace", "victim_environ", "test_environ"):
        assert seen[name][:2] in {
            ("refused", "ProcessLookupError"),
            ("refused", "FileNotFoundError"),
            ("refused", "OSError"),  # ptrace's errno: ESRCH
        }, (name, seen[name])
    assert seen["ptrace"][2] in ("3", "1"), seen  # ESRCH or EPERM
    assert host["victim"].poll() is None  # still running
    assert seen["pids"] == ("done", "[1, 2]"), seen  # bwrap's init and the program
    assert host["secret"] not in result.stdout
    env = seen["environ"][1]
    assert "LMFORGE_TEST_SECRET" not in env and "PYTEST" not in env, env
    assert result.status == "passed", result  # its parent, bwrap's init, ignored the SIGKILL


def test_a_fork_bomb_is_stopped_by_the_process_limit(escaped):
    result, seen = escaped["fork_bomb"]
    assert seen["fork"][:2] == ("refused", "BlockingIOError"), seen  # EAGAIN: no child at all
    assert seen["ctypes_fork"][:3] == ("refused", "BlockingIOError", "11"), seen
    assert seen["thread"][0] == "refused", seen
    assert seen["raise_nproc"][:2] == ("refused", "ValueError"), seen  # not allowed to raise
    assert result.status == "passed", result


def test_the_disk_fills_only_the_sandboxs_small_tmpfs(escaped):
    result, seen = escaped["disk"]
    assert seen["fill"][:3] == ("refused", "OSError", "28"), seen  # ENOSPC
    filled = int(next(x for x in result.stdout.splitlines() if x.startswith("filled")).split()[1])
    assert 0 < filled <= sandbox_module.DISK_MB * 2**20
    assert seen["big_file"][:3] == ("refused", "OSError", "27"), seen  # EFBIG: the file limit
    assert seen["dev_shm"][0] == "refused" and seen["dev"][0] == "refused", seen


def test_memory_stays_limited(escaped):
    result, seen = escaped["memory"]
    assert result.passed, result
    assert seen["raise_as"][:2] == ("refused", "ValueError"), seen
    assert seen["allocate"][:2] == ("refused", "MemoryError"), seen


def test_the_choice_is_made_once_and_can_be_forced(monkeypatch):
    monkeypatch.setenv("LMFORGE_SANDBOX", "guard")
    assert resolve() == "guard" and run_program("print(1)").sandbox == "guard"
    monkeypatch.setenv("LMFORGE_SANDBOX", "docker")
    with pytest.raises(LmforgeError, match="unknown"):
        resolve()
    assert resolve("guard") == "guard"  # the argument wins over the environment


@pytest.fixture
def fresh_probe():
    """A probe and warning of their own for this test; the real ones again after it."""
    sandbox_module.bwrap_unavailable.cache_clear()
    sandbox_module._warn_once.cache_clear()
    yield
    sandbox_module.bwrap_unavailable.cache_clear()
    sandbox_module._warn_once.cache_clear()


def test_without_bwrap_auto_warns_once_and_falls_back(monkeypatch, fresh_probe):
    monkeypatch.delenv("LMFORGE_SANDBOX", raising=False)
    monkeypatch.setattr(sandbox_module.shutil, "which", lambda name: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert resolve() == "guard" and resolve("auto") == "guard"
    assert len(caught) == 1 and caught[0].category is SandboxWarning
    message = str(caught[0].message)
    assert "\n" not in message and "install bubblewrap" in message, message
    with pytest.raises(LmforgeError, match="install bubblewrap"):
        resolve("bwrap")


def test_a_sandbox_that_cannot_start_is_named_with_its_fix(monkeypatch, fresh_probe):
    monkeypatch.setattr(sandbox_module.shutil, "which", lambda name: f"/usr/bin/{name}")
    failing = [sys.executable, "-c", "import sys; sys.exit('bwrap: No permissions to creat')"]
    monkeypatch.setattr(sandbox_module, "command", lambda program, argv: failing)
    reason = bwrap_unavailable()
    assert "No permissions to creat" in reason and "LMFORGE_SANDBOX=guard" in reason
    with pytest.raises(LmforgeError, match="No permissions to creat"):
        resolve("bwrap")
